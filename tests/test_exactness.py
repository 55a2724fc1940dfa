"""Every method of the course under one contract: each row of `lineup.METHODS`, and the capstone's drafter.

(a) greedy: token for token plain decoding's output, with an EOS hit mid-text (inside accepted drafts, for
    several rows) and a length budget, and drafts accepted somewhere (else the identity would hold trivially);
(b) sampling: the first 3 tokens follow the target's exact distribution (`helpers.follows_target`, chi-square);
    the test has power: a verifier that accepts every draft, or replaces a rejected draft from p, fails it;
(c) seeded: the same generator seed repeats the tokens, other seeds change them;
(d) batched (rows with `batch`): `serving.generate_batch` gives every prompt the tokens of (a).

On the zoo pair (the `pair` fixture: CPU, fp32) with its trained Medusa heads and EAGLE drafts. A new drafter is
its module plus one row of `lineup.METHODS`; these tests pick it up (`test_a_new_drafter_is_one_row`).
"""
import functools

import pytest
import torch
from helpers import exact_first_tokens, exercise_functions, follows_target

from specdec_lab import decoding, lineup, measure, sampling
from specdec_lab.decoding import generate
from specdec_lab.drafters import Drafter
from specdec_lab.prompts import load_prompts
from specdec_lab.sampling import Warp
from specdec_lab.serving import generate_batch
from specdec_lab.tree import DraftTree

NEW = 16  # the length budget of (a) and (d)
PROMPTS = [load_prompts(c)[i] for c, i in (("code", 0), ("edit", 0), ("edit", 1), ("doc", 0))]
SAMPLING = dict(temperature=1.0, top_k=3)  # 27 continuations of 3 tokens: enumerated, and few chi-square cells
RUNS = 200  # sampling runs per row
TEXT = "x = x + 1\nx = x + 1\nx ="  # the sampling prompt: repetitive, so every drafter gets drafts accepted


@functools.cache
def suffix_drafter():
    """The capstone's drafter as the solution notebook writes it (option A), the one its grader passes."""
    return exercise_functions("10_capstone.ipynb")["SuffixDrafter"]


CAPSTONE = lineup.Row("capstone: the suffix drafter", lambda k: suffix_drafter()())
ROWS = lineup.METHODS + [CAPSTONE]
NAMES = [row.name.format(**lineup.Kit(None, None, {}).names()) for row in ROWS]
ROW = dict(zip(NAMES, ROWS))


@pytest.fixture(scope="module")
def kit(pair):
    return lineup.kit(*pair[:2])


@pytest.fixture(scope="module")
def plain(pair):
    """(prompts [1, T] each, eos, plain decoding's tokens per prompt). eos: a token that ends one text after its 5th
    new token and not another, which runs to the budget. Plain decoding is checked against Hugging Face's."""
    target, _, tok = pair
    prompts = [tok(p["prompt"], return_tensors="pt").input_ids for p in PROMPTS]
    full = [generate(target, ids, None, NEW).tokens for ids in prompts]
    eos = next(t for t in full[0][4:] if full[0].index(t) >= 4 and any(t not in f for f in full[1:]))
    want = [f[:f.index(eos) + 1] if eos in f else f for f in full]
    assert any(len(w) < NEW for w in want) and any(len(w) == NEW for w in want)
    for ids, w in zip(prompts, want):
        assert measure.hf_generate(target, ids, NEW, eos_token_id=eos).tolist() == w, "plain decoding is not HF's"
        assert generate(target, ids, None, NEW, eos_token_id=eos).tokens == w
    return prompts, eos, want


@pytest.fixture(scope="module")
def exact(pair):
    """(the sampling prompt [1, T], the target's exact distribution of its first 3 tokens at SAMPLING)."""
    target, _, tok = pair
    ids = tok(TEXT, return_tensors="pt").input_ids
    return ids, exact_first_tokens(target, ids, Warp(**SAMPLING))


# ---- the contract, one function per check (test_a_new_drafter_is_one_row runs them on a row of its own) --------


def runs_here(row, k, sampled=False):
    """Skip a row that cannot run: no trained module for it, or greedy only when the check samples."""
    if row.needs and row.needs not in k.nets:
        pytest.skip(f"no {row.needs} module for the zoo target")
    if sampled and row.greedy_only:
        pytest.skip(row.greedy_only)


def accepted(gens) -> int:
    return sum(sum(g.accept_lengths) for g in gens)


def check_greedy(row, k, plain, exact):
    """(a) Plain decoding's tokens on every prompt, EOS and budget included; some drafts accepted."""
    runs_here(row, k)
    prompts, eos, want = plain
    if row.loop is not None:
        gens = [row.loop(k.target, ids, NEW, eos) for ids in prompts]
    else:
        gens = [generate(k.target, ids, row.make(k), NEW, eos_token_id=eos) for ids in prompts]
    for i, (gen, w) in enumerate(zip(gens, want)):
        first = next((j for j, (a, b) in enumerate(zip(gen.tokens, w)) if a != b), min(len(gen.tokens), len(w)))
        assert gen.tokens == w, f"{row.name}, prompt {i}: differs from plain decoding at new token {first}"
    if row.loop is not None or row.make(k) is not None:
        assert accepted(gens) > 0, f"{row.name} never had a draft accepted: the identity holds trivially"


def check_sampling(row, k, plain, exact, seed=0):
    """(b) The first 3 sampled tokens follow the target's exact distribution; some drafts accepted."""
    runs_here(row, k, sampled=True)
    ids, want = exact
    drafter, g = row.make(k), torch.Generator().manual_seed(seed)
    gens = [generate(k.target, ids, drafter, 3, generator=g, **SAMPLING) for _ in range(RUNS)]
    follows_target([gen.tokens for gen in gens], want, row.name)
    if drafter is not None:
        assert accepted(gens) > 0, f"{row.name} never had a draft accepted: the test cannot see the verifier"


def check_seeded(row, k, plain, exact):
    """(c) A seed repeats the tokens (and the accepted drafts); other seeds change them."""
    runs_here(row, k, sampled=True)
    ids, _ = exact
    a, b, *others = [generate(k.target, ids, row.make(k), 8, generator=torch.Generator().manual_seed(s), **SAMPLING)
                     for s in (0, 0, 1, 2)]
    assert a.tokens == b.tokens and a.accept_lengths == b.accept_lengths, f"{row.name}: seed 0 twice differs"
    assert any(o.tokens != a.tokens for o in others), f"{row.name}: seeds 0, 1 and 2 gave the same tokens"


def check_batch(row, k, plain, exact):
    """(d) `serving.generate_batch` over all the prompts: each row the tokens of (a)."""
    runs_here(row, k)
    if not row.batch:
        pytest.skip("not batched (serving.generate_batch drafts chains only)")
    prompts, eos, want = plain
    out = generate_batch(k.target, [ids[0].tolist() for ids in prompts], row.make(k), NEW, eos_token_id=eos)
    assert out.tokens == want, f"{row.name}: batched rows differ from plain decoding"


CHECKS = {"greedy is plain decoding": check_greedy, "sampling follows the target": check_sampling,
          "seeded runs repeat": check_seeded, "batched rows are plain decoding": check_batch}


@pytest.mark.parametrize("row", ROWS, ids=NAMES)
@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS)
def test_every_row_keeps_the_contract(check, row, kit, plain, exact):
    check(row, kit, plain, exact)


# ---- the sampling test has power ------------------------------------------------------------------------------


def accept_every_draft(logits, tree, warp, typical=None, draws=None):
    """A biased `tree.verify_tree`: follows the first child down to a leaf, then draws the bonus token from p."""
    path = []
    while kids := [i for i, parent in enumerate(tree.parents) if parent == (path[-1] if path else -1)]:
        path.append(kids[0])
    p = warp.probs(logits[path[-1] + 1 if path else 0])  # [V] the target after the leaf
    return path, [tree.tokens[j] for j in path] + [int(warp.sample(p[None]))]


BIASES = {  # bias: (the row it spoils, how)
    "accept every draft": ("draft model, chain γ=3", lambda mp: mp.setattr(decoding, "verify_tree", accept_every_draft)),
    "replace a rejected draft from p": ("draft model, tree [2, 2, 1, 1]",
                                        lambda mp: mp.setattr(sampling, "_residual", lambda p, q: p)),
}


@pytest.mark.parametrize("bias", BIASES)
def test_the_sampling_test_catches_a_biased_verifier(bias, kit, exact, monkeypatch):
    name, spoil = BIASES[bias]
    spoil(monkeypatch)
    with pytest.raises(AssertionError, match="do not follow the target|probability 0"):
        check_sampling(ROW[name], kit, None, exact)


# ---- a new drafter: its class and one row ---------------------------------------------------------------------


class Toy(Drafter):
    """A drafter in six lines: the γ tokens that followed the last token where it occurred before (q=None: a
    deterministic proposal; no state, so `Drafter`'s defaults batch it)."""

    gamma = 3

    def propose(self, ids, warp, limit):
        text = ids[0].tolist()  # [T]
        seen = [i for i in range(len(text) - 1) if text[i] == text[-1]]
        return DraftTree.chain(text[seen[-1] + 1:][:min(self.gamma, limit)] if seen else [])


def test_a_new_drafter_is_one_row(pair, kit, plain, exact, monkeypatch):
    toy = lineup.Row("toy", lambda k: Toy(), kind=Toy, batch=True)
    monkeypatch.setattr(lineup, "METHODS", lineup.METHODS + [toy])
    target, draft, _ = pair
    prompts, eos, want = plain
    showdown = lineup.showdown_methods(target, draft, max_new_tokens=NEW, eos_token_id=eos)
    assert [showdown["toy"](ids)[0] for ids in prompts] == want, "the showdown runs the new row"
    batched = lineup.batch_methods(target, draft, max_new_tokens=NEW, eos_token_id=eos)
    assert batched["toy"](prompts)[0] == want, "the batched showdown runs it"
    assert all(v.startswith("no equivalent") for v in lineup.engine_settings(Toy()).values())
    for check in CHECKS.values():
        check(toy, kit, plain, exact)


def test_the_registry_is_consistent(kit):
    """Names unique; each trained module a row needs is a recipe `train-heads` trains and the zoo ships; every class
    `engine_settings` looks rows up by is a drafter some row makes."""
    assert len(set(NAMES)) == len(NAMES), NAMES
    needs = {row.needs for row in lineup.METHODS if row.needs}
    assert needs <= set(lineup.trained.RECIPES) and needs <= set(kit.nets), (needs, set(kit.nets))
    for row in lineup.METHODS:
        if row.make is not None and row.kind is not None:
            assert isinstance(row.make(kit), row.kind), row.name
