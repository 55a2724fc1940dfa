"""CHEATSHEET.md against the library: every Python block of the sheet is run, and each formula it defines is
compared with `specdec_lab` (sampling, economics, tree, the decoding loop's caches) on several inputs.

The sheet's readable formula and its Python line sit side by side, so a wrong formula on the sheet fails here; the
mutation tests at the end show that each check does fail when one term of its formula is wrong.
"""

import math
import re
from pathlib import Path

import pytest
import torch

from specdec_lab import economics, sampling, tree, widgets
from specdec_lab.economics import QWEN25_7B_ON_H100, Roofline

ROOT = Path(__file__).resolve().parents[1]
SHEET = (ROOT / "CHEATSHEET.md").read_text()
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def sheet(text: str = SHEET) -> dict:
    """The names the sheet's Python blocks define, run in order in one namespace."""
    ns = {"math": math, "torch": torch}
    for block in BLOCK.findall(text):
        exec(block, ns)
    return ns


def dist(g: torch.Generator, V: int = 6, peaked: float = 1.0) -> torch.Tensor:
    """[V] a random distribution with full support (peaked > 1: more mass on a few tokens)."""
    return torch.softmax(torch.randn(V, generator=g) * peaked, -1)


def replayed_u(seed: int, n: int) -> list[float]:
    """The n uniforms a verifier seeded with `seed` draws first (verify_chain and verify_candidates do)."""
    return torch.rand(n, generator=torch.Generator().manual_seed(seed)).tolist()


# ---- the checks, one per block of the sheet (each raises AssertionError when the sheet disagrees) -----------


def check_rule(s):
    g = torch.Generator().manual_seed(0)
    for seed in range(300):  # the sheet's test, fed the verifier's own uniform, makes the verifier's decision
        p, q = dist(g), dist(g)
        x = int(torch.multinomial(q, 1, generator=g))
        p2 = torch.stack([p, dist(g)])  # [γ+1, V], γ = 1
        out = sampling.verify_chain(p2, q[None], [x], torch.Generator().manual_seed(seed))
        u = replayed_u(seed, 1)[0]
        assert bool(s["accepted"](u, p[x], q[x])) == (len(out) == 2), "the accept test (accepted: draft + bonus)"
    us = (torch.arange(100_000) + 0.5) / 100_000  # P(test passes) over u ~ U(0, 1)
    for p_x, q_x in [(0.2, 0.5), (0.5, 0.2), (0.3, 0.3), (0.0, 0.4)]:
        share = float(s["accepted"](us, p_x, q_x).float().mean())
        assert s["accept_prob"](p_x, q_x) == pytest.approx(share, abs=1e-4), "the accept probability"
    for _ in range(20):
        p, q = dist(g), dist(g, peaked=3)
        assert torch.allclose(s["residual"](p, q), sampling.residual(p, q), atol=1e-6), "the residual"
        assert torch.allclose(s["emitted"](p, q), p, atol=1e-6), "rule + residual must emit exactly p"


def check_chain(s):
    g = torch.Generator().manual_seed(1)
    for seed in range(300):
        gamma = 1 + seed % 4
        p = torch.stack([dist(g, peaked=2) for _ in range(gamma + 1)])  # [γ+1, V]
        q = torch.stack([dist(g, peaked=2) for _ in range(gamma)])  # [γ, V]
        draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(gamma)]
        out = sampling.verify_chain(p, q, draft, torch.Generator().manual_seed(seed))
        n, last = s["chain"](p, q, draft, replayed_u(seed, gamma))
        assert len(out) == n + 1 and out[:n] == draft[:n], "the chain's accepted drafts"
        want = sampling.residual(p[n], q[n]) if n < gamma else p[gamma]  # the library's correction or bonus row
        assert torch.allclose(last, want, atol=1e-6), "the row the round's last token is drawn from"


def check_alpha(s):
    g = torch.Generator().manual_seed(2)
    for _ in range(4):  # α = the acceptance rate of the library's verifier, measured on drafts drawn from q
        p, q = dist(g, peaked=2), dist(g, peaked=2)
        runs, kept = 6000, 0
        for seed in range(runs):
            x = int(torch.multinomial(q, 1, generator=g))
            out = sampling.verify_chain(torch.stack([p, p]), q[None], [x], torch.Generator().manual_seed(seed))
            kept += len(out) == 2  # γ = 1: the draft and the bonus, or the correction alone
        a = float(s["alpha"](p, q))
        assert abs(kept / runs - a) < 4 * math.sqrt(a * (1 - a) / runs) + 1e-3, "α against the verifier's rate"
        assert a == pytest.approx(1 - float(s["tv"](p, q)), abs=1e-6), "α = 1 - TV"
        assert float(s["tv"](p, q)) == pytest.approx(0.5 * float((p - q).abs().sum()), abs=1e-6)


def check_tokens(s):
    for a in (0.0, 0.3, 0.6, 0.8, 0.95, 1.0):
        for gamma in (0, 1, 3, 4, 8):
            assert s["expected_tokens"](a, gamma) == pytest.approx(economics.expected_tokens(a, gamma), rel=1e-9)
    for alphas in ([0.9, 0.8, 0.6], [0.5], [1.0, 0.0, 1.0], [0.7] * 5):
        assert s["expected_tokens_by_depth"](alphas) == pytest.approx(economics.expected_tokens_by_depth(alphas))


def check_speedup(s):
    for a, gamma, c, v in [(0.8, 4, 0.05, 1.0), (0.6, 2, 0.3, 1.4), (0.9, 6, 0.1, 2.2), (0.2, 1, 0.5, 1.0)]:
        assert s["speedup"](a, gamma, c, v) == pytest.approx(economics.speedup(a, gamma, c, v), rel=1e-9)
    vs = {"free": lambda n: 1.0, "cpu": lambda n: 1 + 0.08 * (n - 1), "steep": lambda n: n ** 0.7}
    for a in (0.1, 0.5, 0.7, 0.8, 0.9, 0.97):
        for c in (0.0, 0.02, 0.05, 0.2, 0.6):
            for v in vs.values():
                want = economics.optimal_gamma(a, c, 16, verify_cost=lambda gamma: v(gamma + 1))
                assert s["best_gamma"](a, c, v, 16) == want, f"best γ at α = {a}, c = {c}"
            assert s["pays_at_one"](a, c) == (economics.speedup(a, 1, c) > 1)


def check_batch(s):
    models = [QWEN25_7B_ON_H100, Roofline(params=8e9, bandwidth=2e12, peak_flops=312e12, kv_bytes_per_token=131072,
                                          context=4096, efficiency=0.5, overhead=1e-4)]
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    for m in models:
        for B in (1, 16, 256):
            for n in (1, 5, 9):
                assert s["step_time"](m, B, n) == pytest.approx(m.step_time(B, n), rel=1e-12)
                assert s["v_at_batch"](m, n, B) == pytest.approx(m.verify_cost(n - 1, B), rel=1e-12)
        for t in (1, 3, 5, 8):
            assert s["crossover_batch"](m, t) == pytest.approx(m.crossover_batch(t), rel=1e-12)
        for a, gamma, c in [(0.8, 4, 0.05), (0.6, 3, 0.1), (0.95, 2, 0.02)]:
            want = next((B for B in batches if m.speedup(a, gamma, c, B) < 1), None)
            assert s["break_even_batch"](m, a, gamma, c, batches) == want, "the break-even batch"


def check_caches(s, pair):
    target, draft, tok = pair
    for temperature, seed in [(0.8, 0), (0.0, 0), (1.0, 7)]:
        stepper = widgets.RoundStepper(target, draft, "def add(a, b):\n    ", gamma=3, temperature=temperature,
                                       tokenizer=tok, seed=seed, max_new_tokens=40)
        rounds = []
        while not stepper.done:
            rounds.append(stepper.step())
        for r in rounds[:-1]:  # the library's own caches after each round (the last may be cut by the budget)
            assert r.target_cache[0] == (s["before_pass"](r.committed) if r.index else 0)
            assert r.target_cache[2] == s["target_keeps"](r.committed, r.accepted), "the target's rollback"
            assert r.draft_cache[2] == s["draft_keeps"](r.committed, r.accepted, len(r.drafts)), "the draft's rollback"
        assert {r.kind for r in rounds} >= {"bonus", "correction"}


def check_tree(s):
    g = torch.Generator().manual_seed(3)
    shapes = [[2, 2, 1, 1], [3, 2, 1], [1, 1, 1], [4], [2, 3, 2]]
    trees = [tree.branching_parents(b) for b in shapes]
    trees += [[-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, 12)] for _ in range(8)]
    for parents in trees:
        n = len(parents)
        mask = torch.tensor([[bool(s["sees"](parents, i, j)) for j in range(n)] for i in range(n)])
        assert torch.equal(mask, tree.tree_mask(parents)), f"the tree mask of {parents}"
        for T in (1, 17):
            got = torch.tensor([s["position"](parents, i, T) for i in range(n)])
            assert torch.equal(got, tree.tree_positions(parents, T)), f"positions of {parents} after {T} tokens"
    for b in shapes:
        assert s["tree_nodes"](b) == economics.tree_nodes(b) == tree.count_nodes(b)
        for a, c, sl in [(0.7, 0.05, 0.0), (0.6, 0.3, 0.02), (0.9, 0.1, 0.1)]:
            assert s["level_hits"](b, a) == pytest.approx(economics.level_hit_rates(b, a))
            assert s["tree_speedup"](b, a, c, sl) == pytest.approx(economics.tree_speedup(b, a, c, sl), rel=1e-9)


def check_multi_round(s):
    g = torch.Generator().manual_seed(4)
    for seed in range(400):
        p, q = dist(g, V=8, peaked=2), dist(g, V=8, peaked=2)
        k = 1 + seed % 3
        if seed % 2:  # i.i.d. draws from q
            cands, qq = [int(t) for t in torch.multinomial(q, k, replacement=True, generator=g)], q
        else:  # distinct top-k picks of the drafter
            cands, qq = q.topk(k).indices.tolist(), None
        index, token = sampling.verify_candidates(p, cands, qq, torch.Generator().manual_seed(seed))
        got, left = s["multi_round"](p, qq, cands, replayed_u(seed, k))
        assert got == index, f"round {index} accepted by the library, {got} by the sheet"
        if index is None:  # the library's draw from what is left has mass under the sheet's last target
            assert float(left[token]) > 0 and float(left.sum()) == pytest.approx(1, abs=1e-5)
        else:
            assert token == cands[index]


def check_typical(s):
    g = torch.Generator().manual_seed(5)
    for i in range(60):
        p = dist(g, V=10, peaked=0.5 + i / 10)  # flat to peaked targets
        bar = float(tree.typical_threshold(p))
        assert s["typical_bar"](p) == pytest.approx(bar, rel=1e-5), "the typical-acceptance threshold"
        x = int(torch.randint(0, 10, (1,), generator=g))
        path, _ = tree.verify_tree_typical(tree.DraftTree([x], [-1]), torch.stack([p, p]), generator=torch.Generator())
        shown = torch.nn.functional.one_hot(torch.tensor(x), 10).float() if path else p  # emitted here
        assert float(s["typical_loss"](p, x)) == pytest.approx(0.5 * float((shown - p).abs().sum()), abs=1e-6)


CHECKS = {"rule": check_rule, "chain": check_chain, "alpha": check_alpha, "tokens": check_tokens,
          "speedup": check_speedup, "batch": check_batch, "tree": check_tree, "multi_round": check_multi_round,
          "typical": check_typical}


def test_every_block_runs_and_defines_the_sheets_names():
    names = {k for k in sheet() if not k.startswith("__")} - {"math", "torch"}
    want = {"accepted", "accept_prob", "residual", "emitted", "chain", "tv", "alpha", "expected_tokens",
            "expected_tokens_by_depth", "speedup", "best_gamma", "pays_at_one", "step_time", "v_at_batch",
            "crossover_batch", "break_even_batch", "before_pass", "target_keeps", "draft_keeps", "depth", "sees",
            "position", "tree_nodes", "level_hits", "tree_speedup", "multi_round", "entropy", "typical_bar",
            "typical_loss"}
    assert names == want, f"the sheet's names changed: missing {want - names}, new {names - want}"


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_sheets_formula_agrees_with_the_library(name):
    CHECKS[name](sheet())


def test_the_sheets_cache_invariants_are_the_loops(pair):
    check_caches(sheet(), pair)


# ---- the checks can fail: one wrong term in a formula on the sheet, and its check says so ----------------------

MUTATIONS = [  # (what the sheet says, a plausible mistake, the check that must catch it)
    ("u * q_x < p_x", "u * p_x < q_x", "rule"),
    ("min(1.0, p_x / q_x)", "min(1.0, q_x / p_x)", "rule"),
    ("residual = lambda p, q: (p - q).clamp(min=0) / (p - q).clamp(min=0).sum()",
     "residual = lambda p, q: (q - p).clamp(min=0) / (q - p).clamp(min=0).sum()", "rule"),
    ("if n < len(draft) else p[len(draft)]", "if n < len(draft) else p[len(draft) - 1]", "chain"),
    ("alpha = lambda p, q: torch.minimum(p, q).sum()", "alpha = lambda p, q: torch.maximum(p, q).sum() - 1", "alpha"),
    ("(1 - a ** (g + 1)) / (1 - a)", "(1 - a ** g) / (1 - a)", "tokens"),
    ("(v + g * c)", "(v + c)", "speedup"),
    ("if g else 1.0, -g))", "if g else 0.0, -g))", "speedup"),
    ("2 * m.params * t / (m.efficiency", "m.params * t / (m.efficiency", "batch"),
    ("depth = lambda parents, i: 0 if", "depth = lambda parents, i: 1 if", "tree"),
    ("j == i or (parents[i] >= 0", "j <= i or (parents[i] >= 0", "tree"),
    ("p = residual(p, q_i)", "p = p", "multi_round"),
    ("math.exp(-entropy(p))", "math.exp(entropy(p))", "typical"),
    ("1 - p[x] if", "p[x] if", "typical"),
]


@pytest.mark.parametrize("right, wrong, name", MUTATIONS, ids=[m[1][:40] for m in MUTATIONS])
def test_a_wrong_formula_fails_its_check(right, wrong, name):
    assert SHEET.count(right) == 1, f"the sheet no longer says {right!r}: update this mutation"
    with pytest.raises(AssertionError):
        CHECKS[name](sheet(SHEET.replace(right, wrong)))


@pytest.mark.parametrize("right, wrong", [("T + n - (n == g)", "T + n"), ("lambda T, n: T + n\n", "lambda T, n: T + n + 1\n")])
def test_a_wrong_cache_invariant_fails(pair, right, wrong):
    assert SHEET.count(right) == 1
    with pytest.raises(AssertionError):
        check_caches(sheet(SHEET.replace(right, wrong)), pair)
