"""The tuner (chapter 08, section 3): what it measures, what it picks, and the drafters' "auto" settings."""
import pytest
import torch

from specdec_lab import DraftModelDrafter, EagleDrafter, economics, generate, tune, zoo
from specdec_lab.checks import ArgumentError
from specdec_lab.eagle import EagleNet


@pytest.fixture(scope="module")
def pair():
    return zoo.load_pair("tiny", device="cpu")


@pytest.fixture(scope="module")
def net(pair):
    return EagleNet.from_zoo(pair[0], 1)


def flat(v_slope: float = 0.0, c: float = 0.0, e: float = 0.0) -> tune.Costs:
    """Synthetic costs: v(n) = 1 + v_slope (n - 1), a draft forward c and an EAGLE level e, whatever the width."""
    return tune.Costs({n: 1 + v_slope * (n - 1) for n in tune.NS}, {m: c for m in tune.WIDTHS},
                      {m: e for m in tune.WIDTHS})


def test_costs_are_in_one_token_passes_and_interpolate():
    costs = tune.Costs({1: 2.0, 4: 5.0, 8: 9.0}, {1: 1.0, 4: 2.0}, {1: 0.5})
    assert costs.v(1) == 1 and costs.v(4) == 2.5 and costs.v(2) == pytest.approx(1.5)
    assert costs.v(16) == pytest.approx(8.5)  # the last segment, extended
    assert costs.c(1) == 0.5 and costs.c(2) == pytest.approx(2 / 3) and costs.e(7) == 0.25


def test_costs_from_the_roofline_are_its_verify_costs():
    roof = economics.QWEN25_7B_ON_H100
    costs = tune.Costs.from_roofline(roof, c=0.1, e=0.05)
    for n in (1, 5, 25, 64):
        assert costs.v(n) == pytest.approx(roof.verify_cost(n - 1))
    assert costs.c(16) == pytest.approx(0.1) and costs.e(1) == pytest.approx(0.05)


def test_branchings_are_the_non_increasing_trees_within_the_limits():
    trees = tune._branchings(max_depth=4, max_branch=3, max_nodes=20)
    assert len(trees) == len({tuple(b) for b in trees})
    for b in trees:
        assert 1 <= len(b) <= 4 and b == sorted(b, reverse=True) and economics.tree_nodes(b) <= 20
    assert [1, 1, 1, 1] in trees and [3, 2, 1] in trees and [3, 3] in trees  # 3 + 9 = 12 nodes
    assert [3, 3, 1] in trees and [3, 3, 2] not in trees  # 21 and 39 nodes
    assert tune._branchings(3, 1, 64) == [[1], [1, 1], [1, 1, 1]]


@pytest.mark.parametrize("alpha, c, slope", [(0.8, 0.1, 0.0), (0.8, 0.37, 0.08), (0.6, 0.2, 0.02), (0.9, 0.05, 0.2)])
def test_the_best_chain_is_chapter_02s_optimal_gamma(alpha, c, slope):
    costs = flat(slope, c)
    pick = tune.best_tree(costs, [alpha] * 4, chain=True)
    gamma = economics.optimal_gamma(alpha, c, max_gamma=8, verify_cost=lambda g: costs.v(g + 1))
    assert pick.settings["branching"] == [1] * gamma
    assert pick.speedup == pytest.approx(economics.speedup(alpha, gamma, c, costs.v(gamma + 1)))


def test_trees_win_where_nodes_are_free_and_lose_where_they_cost():
    hit = [0.6, 0.8, 0.9, 0.95]  # top-k hit rates: a second guess is often right
    free = tune.best_tree(flat(0.0, 0.0), hit)
    assert sum(free.settings["branching"]) > len(free.settings["branching"])  # a real tree
    assert free.tau == max(economics.tree_expected_tokens(b, hit) for b in tune._branchings(8, 4, 64))
    costly = tune.best_tree(flat(0.3, 0.1), hit)
    assert set(costly.settings["branching"]) == {1}  # every extra node costs 0.3 of a step: a chain


def test_eagle_pick_weighs_tau_against_the_pass():
    # acc[d][b] = min(d, b) * 0.8 for k = 4; a chain accepts less
    acc4 = [[0.8 * min(d, b) for b in range(9)] for d in range(5)]
    acc1 = [[0.5 * min(d, b) for b in range(9)] for d in range(5)]
    free = tune.best_eagle(flat(0.0, 0.0, 0.0), {1: acc1, 4: acc4})
    assert free.settings["topk"] == 4 and free.settings["depth"] == 4 and free.tau == pytest.approx(1 + 3.2)
    assert free.settings["budget"] == 4  # more nodes add nothing here, and ties go to the smaller tree
    dear = tune.best_eagle(flat(0.0, 0.0, 2.0), {1: acc1, 4: acc4})  # a level costs two passes: one level
    assert dear.settings["depth"] == 1


def test_measure_times_every_size_and_restores_the_threads(pair, net):
    target, draft, _ = pair
    before = torch.get_num_threads()
    costs = tune.measure(target, draft=draft, eagle=net, rounds=1, threads=2)
    assert torch.get_num_threads() == before and costs.threads == 2 and costs.device == "cpu"
    assert set(costs.verify) == set(tune.NS) and set(costs.draft) == set(costs.eagle) == set(tune.WIDTHS)
    assert all(ms > 0 for table in (costs.verify, costs.draft, costs.eagle) for ms in table.values())
    assert tune.measure(target, rounds=1).draft == {}


def test_hit_rates_are_cumulative_and_agree_with_measure(pair):
    from specdec_lab import measure

    target, draft, tok = pair
    texts = tune.calibration_texts(target, tok, new_tokens=12, texts=tune.CALIBRATION[:2])
    hit = tune.hit_rates(draft, texts, k=3)
    assert hit == sorted(hit) and 0 < hit[0] <= hit[-1] <= 1
    one = [tune.hit_rates(draft, [t], k=3) for t in texts]
    direct = [measure.topk_hit_rates(target, draft, t[0][:, :t[1]], 12, 3) for t in texts]
    assert one == pytest.approx(direct, abs=1e-6)
    assert hit == pytest.approx([(a + b) / 2 for a, b in zip(*one)])  # 12 tokens each: the plain mean


@pytest.mark.parametrize("topk, depth, budget", [(4, 3, 7), (2, 4, 6), (1, 4, 4), (4, 6, 24)])
def test_eagle_acceptance_matches_a_real_pass(pair, net, topk, depth, budget):
    """Teacher-forced at the position where decoding drafts first, the estimate is that pass's accepted length."""
    target, _, tok = pair
    for text in tune.CALIBRATION[:3]:
        ids = tok(text, return_tensors="pt").input_ids
        gen = generate(target, ids, EagleDrafter(net, dynamic=True, topk=topk, depth=depth, budget=budget),
                       max_new_tokens=12)
        want = generate(target, ids, None, max_new_tokens=depth + 1).tokens  # the target's greedy text
        full, T = torch.cat([ids, torch.tensor([want])], 1), ids.shape[1] + 1  # one position: after the first token
        acc = tune.eagle_acceptance(target, net, [(full, T)], max_depth=depth, topks=[topk], max_budget=budget)
        assert acc[topk][depth][budget] == gen.accept_lengths[1], text


def test_auto_drafters_tune_once_and_stay_exact(pair, net):
    target, draft, tok = pair
    ids = tok(tune.CALIBRATION[0], return_tensors="pt").input_ids
    plain = generate(target, ids, None, max_new_tokens=24).tokens
    chain, tree, eagle2 = DraftModelDrafter(draft, "auto"), DraftModelDrafter(draft, branching="auto"), \
        EagleDrafter(net, dynamic="auto")
    for drafter in (chain, tree, eagle2):
        assert drafter.tuned is None
        assert generate(target, ids, drafter, max_new_tokens=24).tokens == plain
        assert drafter.tuned is not None and drafter.tuned.speedup > 0
    assert set(chain.tuned.settings["branching"]) == {1} and chain.gamma == len(chain.branching)
    assert (eagle2.depth, eagle2.budget, eagle2.topk) == tuple(eagle2.tuned.settings[k] for k in ("depth", "budget", "topk"))
    again = DraftModelDrafter(draft, "auto")
    again.start(target, ids)
    assert again.tuned is chain.tuned  # remembered per (models, device, threads): measured once


def test_auto_settings_are_checked():
    _, draft, _ = zoo.load_pair("tiny")
    with pytest.raises(ArgumentError, match="gamma='auto'"):
        DraftModelDrafter(draft, "fast")
    with pytest.raises(ArgumentError, match="not both"):
        DraftModelDrafter(draft, "auto", branching="auto")
    net = EagleNet.from_zoo(zoo.load_pair("tiny")[0], 1)
    with pytest.raises(ArgumentError, match="'auto'"):
        EagleDrafter(net, dynamic="yes")
