"""Chapter 04's model of tree drafting (economics.tree_*) and its explorer (widgets.tree_*)."""
import ast
import math
import random
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import noisy_copy, prompt_ids, tiny_llama  # noqa: E402

from specdec_lab import DraftModelDrafter, economics, grading, measure, tree, widgets  # noqa: E402
from specdec_lab.checks import ArgumentError  # noqa: E402
from specdec_lab.economics import level_hit_rates, tree_expected_tokens, tree_nodes, tree_speedup  # noqa: E402
from specdec_lab.sampling import Warp, residual  # noqa: E402

SHAPES = [[1], [1, 1, 1, 1], [2, 2, 1, 1], [3, 3, 2], [3, 2, 1], [4, 2], [1, 3, 1, 2]]


def test_tree_nodes_is_the_size_of_the_tree_the_builder_grows():
    """The formula Σ_l Π_{j≤l} b_j against tree.branching_parents, which grows the tree level by level, on every
    shape of at most 40 nodes (up to 8 levels, up to 4 children per node)."""
    shapes = tree.branchings(40)
    assert len(shapes) > 100
    for branching in shapes:
        assert tree_nodes(branching) == len(tree.branching_parents(branching)), branching


@pytest.mark.parametrize("branching", SHAPES, ids=str)
def test_tree_nodes_counts_what_a_drafter_proposes(pair, branching):
    """A draft model given this branching proposes a tree of tree_nodes(branching) nodes, Π_{j≤l} b_j on level l,
    greedy (top-b picks) and sampled (b draws per node) alike."""
    target, draft = pair
    widths = [math.prod(branching[: level + 1]) for level in range(len(branching))]
    for warp in (Warp(), Warp(temperature=1.0, generator=torch.Generator().manual_seed(0))):
        drafter = DraftModelDrafter(draft, branching=branching)
        ids = prompt_ids(3)
        drafter.start(target, ids)
        with torch.no_grad():
            proposed = drafter.propose(ids, warp, limit=len(branching))
        assert len(proposed) == tree_nodes(branching), (branching, warp.temperature)
        depths = tree.tree_depths(proposed.parents)
        assert [depths.count(level) for level in range(len(branching))] == widths, (branching, warp.temperature)


def test_seed_004_node_counts():
    assert tree_nodes([2, 2, 1, 1]) == 14 and tree_nodes([3, 3, 2]) == 30


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.95, 1.0])
def test_chain_is_chapter_02s_formula(alpha):
    for gamma in (1, 3, 5):
        assert tree_expected_tokens([1] * gamma, alpha) == pytest.approx(economics.expected_tokens(alpha, gamma))
        assert tree_speedup([1] * gamma, alpha, 0.1, 0.02) == pytest.approx(
            economics.speedup(alpha, gamma, 0.1, verify_cost=1 + 0.02 * gamma))


def test_tree_expected_tokens_by_hand():
    # α = 0.8: two children hit with 1 - 0.2² = 0.96; levels [0.96, 0.96, 0.8, 0.8]
    want = 1 + 0.96 + 0.96**2 + 0.96**2 * 0.8 + 0.96**2 * 0.8**2
    assert tree_expected_tokens([2, 2, 1, 1], 0.8) == pytest.approx(want)
    assert level_hit_rates([2, 2, 1, 1], 0.8) == pytest.approx([0.96, 0.96, 0.8, 0.8])
    hits = [0.69, 0.8, 0.86, 0.88]  # measured top-k rates are used as they are
    assert level_hit_rates([3, 1, 2], hits) == [0.86, 0.69, 0.8]
    assert tree_expected_tokens([3, 1, 2], hits) == pytest.approx(1 + 0.86 + 0.86 * 0.69 + 0.86 * 0.69 * 0.8)


def test_tree_expected_tokens_matches_a_simulation():
    """The model by Monte Carlo: each level is a coin with the level's hit rate; stop at the first miss."""
    g = torch.Generator().manual_seed(0)
    branching, alpha = [3, 2, 1], 0.6
    h = torch.tensor(level_hit_rates(branching, alpha))
    coins = torch.rand(200_000, len(branching), generator=g) < h  # [draws, levels]
    accepted = coins.int().cumprod(-1).sum(-1)  # leading hits
    assert (1 + accepted.float().mean()).item() == pytest.approx(tree_expected_tokens(branching, alpha), abs=0.01)


def test_wider_trees_win_when_verification_is_free_and_lose_when_it_is_not():
    for alpha in (0.5, 0.7, 0.9):
        assert tree_speedup([2, 2, 1, 1], alpha, 0.05, 0.0) > tree_speedup([1, 1, 1, 1], alpha, 0.05, 0.0)
        assert tree_speedup([3, 3, 2], alpha, 0.05, 0.2) < tree_speedup([1, 1, 1, 1], alpha, 0.05, 0.2)
    assert tree_speedup([2, 2], 0.5, 0.0, 0.0) == tree_expected_tokens([2, 2], 0.5)


@pytest.mark.parametrize("bad", [[], [2, 0], [1.5], (True,), "22"])
def test_bad_branching_is_refused(bad):
    with pytest.raises(ArgumentError, match="branching"):
        tree_nodes(bad)


def test_hit_rates_must_cover_the_widest_level():
    with pytest.raises(ArgumentError, match="top-k hit rates up to k = 3, got 2: pass 3 rates"):
        tree_expected_tokens([3, 1], [0.7, 0.8])
    with pytest.raises(ArgumentError, match="alpha"):
        tree_expected_tokens([2], 1.5)


# ---- widgets ------------------------------------------------------------------------------------------


def test_tree_shape_and_summary():
    assert widgets.tree_shape(3, 4, 2) == [3, 3, 1, 1]
    assert widgets.tree_shape(2, 2, 5) == [2, 2] and widgets.tree_shape(4, 3, 0) == [1, 1, 1]
    s = widgets.tree_summary([2, 2, 1, 1], 0.8, 0.05, 0.01)
    assert s["nodes"] == 14
    assert s["tokens_per_pass"] == tree_expected_tokens([2, 2, 1, 1], 0.8)
    assert s["speedup"] == pytest.approx(s["tokens_per_pass"] / (1 + 0.14 + 0.2))
    assert s["chain_tokens_per_pass"] == pytest.approx(economics.expected_tokens(0.8, 4))


def test_tree_explorer_updates_its_numbers():
    box = widgets.tree_explorer(hit=0.8, width=2, depth=4, wide_levels=2, c=0.05, s=0.0)
    (width, depth, wide), (hit, c, v) = box.children[0].children, box.children[1].children
    text = box.children[2]
    assert "<b>14</b> nodes" in text.value and f"<b>{tree_expected_tokens([2, 2, 1, 1], 0.8):.2f}</b>" in text.value
    width.value = 3
    assert "<b>[3, 3, 1, 1]</b>" in text.value and f"<b>{tree_nodes([3, 3, 1, 1])}</b> nodes" in text.value
    hit.value = 0.0
    assert "<b>1.00</b> tokens per pass" in text.value
    plt.close("all")


def test_tree_grid_draws_the_model():
    fig = widgets.tree_grid(hits=(0.7, 0.9), cs=(0.05,), shapes=([1, 1, 1, 1], [2, 2, 1, 1]), s_max=0.1)
    assert len(fig.axes) == 2
    line = fig.axes[1].lines[1]  # α = 0.9, the tree [2, 2, 1, 1]
    xs, ys = line.get_xdata(), line.get_ydata()
    assert ys[0] == pytest.approx(tree_speedup([2, 2, 1, 1], 0.9, 0.05, 0.0))
    assert ys[-1] == pytest.approx(tree_speedup([2, 2, 1, 1], 0.9, 0.05, xs[-1]))
    plt.close(fig)


# ---- the second mode: the real pair -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    target = tiny_llama(layers=2, seed=0)
    return target, noisy_copy(target, 0.3, seed=1)


def test_topk_hit_rates_grow_with_k_and_are_one_for_the_target_itself(pair):
    target, noisy = pair
    ids = prompt_ids(4, n=10)
    hits = measure.topk_hit_rates(target, noisy, ids, max_new_tokens=24, k=4)
    assert len(hits) == 4 and all(a <= b for a, b in zip(hits, hits[1:])) and 0 <= hits[0] < 1
    assert measure.topk_hit_rates(target, target, ids, max_new_tokens=24, k=2) == [1.0, 1.0]


def test_measure_tree_reports_tau_beside_the_prediction(pair):
    target, noisy = pair
    ids = prompt_ids(5, n=10)
    m = measure.measure_tree(target, noisy, ids, [2, 2, 1], max_new_tokens=24)
    assert m["same_as_greedy"] and 1 <= m["measured_tau"] <= 4
    assert m["predicted_tau"] == pytest.approx(tree_expected_tokens([2, 2, 1], m["hit"]))
    assert m["nodes_per_pass"] <= tree_nodes([2, 2, 1]) == 10
    perfect = measure.measure_tree(target, target, ids, [2, 1], max_new_tokens=24)
    assert perfect["predicted_tau"] == 3 and perfect["measured_tau"] == pytest.approx(24 / math.ceil(24 / 3))


# ---- notebook 04 derives the same functions as the library ----------------------------------------------


def _notebook_functions(names):
    """The functions `names` as notebooks/04 defines them (only their `def` blocks are run)."""
    nb = nbformat.read(Path(__file__).resolve().parents[1] / "notebooks" / "04_tree_attention.ipynb", as_version=4)
    ns = {"torch": torch, "random": random, "residual": residual, "tree": tree}
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.source.startswith("# Setup"):
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                exec(compile(ast.Module([node], []), "notebooks/04", "exec"), ns)
    missing = set(names) - set(ns)
    assert not missing, f"notebooks/04 no longer defines {missing}"
    return ns


def test_notebook_derivations_agree_with_the_library():
    ns = _notebook_functions({"mask_from_parents", "positions_from_parents", "greedy_walk", "two_candidates"})
    g = torch.Generator().manual_seed(3)
    for n in range(1, 30):
        parents = grading._random_tree(n, g)
        assert torch.equal(ns["mask_from_parents"](parents), tree.tree_mask(parents))
        assert torch.equal(ns["positions_from_parents"](parents, 9), tree.tree_positions(parents, 9))
        rooted = [-1] + [p + 1 for p in parents]
        tokens, logits = grading._greedy_tree_case(rooted, g)
        assert ns["greedy_walk"](rooted, tokens, logits) == grading.rooted_walk(rooted, tokens, logits)
    p, q = torch.tensor(grading.MULTI_P), torch.tensor(grading.MULTI_Q)
    exact = torch.bincount(ns["two_candidates"](p, q, 50_000, True, g), minlength=5)
    naive = torch.bincount(ns["two_candidates"](p, q, 50_000, False, g), minlength=5)
    assert grading.chi_square(exact, p)[1] > 1e-3, "the notebook's multi-round rule should follow p"
    assert grading.chi_square(naive, p)[1] < 1e-6, "the notebook's naive rule should be visibly biased"
    assert grading.chi_square(naive, grading._two_round_outcomes(p, q)["naive"])[1] > 1e-3, (
        "the naive rule's frequencies should match its exact distribution")


def test_tree_explorer_runs_the_real_pair_on_a_prompt(pair):
    class Ids:  # what a tokenizer call returns, for prompts made of numbers
        def __init__(self, text):
            self.input_ids = torch.tensor([[int(t) for t in text.split()]])

    class Tokenizer:
        eos_token_id = None

        def __call__(self, text, return_tensors=None):
            return Ids(text)

    target, noisy = pair
    prompts = [{"id": "a", "prompt": "3 14 15 92 65 35"}, {"id": "b", "prompt": "27 18 28 18 28 45 90"}]
    box = widgets.tree_explorer(pair=(target, noisy, Tokenizer()), prompts=prompts, max_new_tokens=12)
    (choice, button), result = box.children[4].children, box.children[5]
    choice.value = 1
    button.click()
    m = measure.measure_tree(target, noisy, Ids(prompts[1]["prompt"]).input_ids, [2, 2, 1, 1], 12)
    assert f"measured τ <b>{m['measured_tau']:.2f}</b>, predicted <b>{m['predicted_tau']:.2f}</b>" in result.value
    assert "identical to greedy: True" in result.value
    plt.close("all")
