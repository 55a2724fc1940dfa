"""specdec_lab.sampling: exactness by chi-square, edge cases, and error messages.

Exactness: every sampler runs N = 50_000 times with a fixed seed, and a test fails when Pearson's
chi-square p-value of the emitted tokens against the target is below P_MIN = 1e-3. At that N the test rejects
each classic wrong rule with a p-value below 1e-10 (test_exact_test_has_teeth), so more draws buy no more power
against them, only time.
`pytest tests/test_sampling.py -k exact -s` prints the p-values.
"""

import pytest
import torch
from torch.testing import assert_close

from specdec_lab import checks, sampling
from specdec_lab.grading import chi_square, counts_of

N = 50_000
P_MIN = 1e-3

# Target rows [γ+1, V] and draft rows [γ, V] with zeros on both sides. Row 0 holds every case:
# p > 0 = q (token 2), p = 0 < q (token 1), p = q = 0 (token 6), p > q, p < q, p = q (token 3).
P = torch.tensor(
    [
        [0.30, 0.00, 0.25, 0.15, 0.20, 0.10, 0.00],
        [0.10, 0.40, 0.10, 0.00, 0.20, 0.20, 0.00],
        [0.05, 0.05, 0.30, 0.30, 0.00, 0.20, 0.10],
        [0.20, 0.20, 0.20, 0.10, 0.10, 0.10, 0.10],
    ]
)
Q = torch.tensor(
    [
        [0.10, 0.35, 0.00, 0.15, 0.05, 0.35, 0.00],
        [0.30, 0.20, 0.00, 0.20, 0.30, 0.00, 0.00],
        [0.00, 0.10, 0.40, 0.20, 0.10, 0.10, 0.10],
    ]
)
GAMMA, V = Q.shape


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_distributed_as(tokens, probs, what: str) -> float:
    _, pvalue = chi_square(counts_of(tokens, len(probs)), probs)
    print(f"{what}: chi-square p-value {pvalue:.3f} over {len(tokens)} draws")
    assert pvalue >= P_MIN, f"{what}: emitted tokens are not distributed as {probs.tolist()} (p-value {pvalue:.2g})"
    return pvalue


def assert_chain_exact(outs: list[list[int]], what: str) -> None:
    """Position i, over the calls that reach it, must follow P[i]."""
    for pos in range(GAMMA + 1):
        reached = [o[pos] for o in outs if len(o) > pos]
        assert_distributed_as(reached, P[pos], f"{what}, position {pos}")


# ---- exactness, N draws each ----------------------------------------------------------------


def test_exact_verify_chain_with_q():
    g = gen(1)
    drafts = torch.stack([torch.multinomial(row, N, replacement=True, generator=g) for row in Q], 1)  # [N, γ]
    outs = [sampling.verify_chain(P, Q, d, g) for d in drafts.tolist()]
    assert_chain_exact(outs, "verify_chain, q given")
    alphas = torch.minimum(P[:GAMMA], Q).sum(-1)  # [γ] acceptance rate per position
    expected = 1 + alphas.cumprod(0).sum()  # accepted drafts + 1
    lengths = torch.tensor([len(o) for o in outs], dtype=torch.float64)  # [N]
    tolerance = 4 * float(lengths.std()) / N ** 0.5  # four standard errors of the mean
    assert abs(float(lengths.mean()) - expected) < tolerance, (
        f"mean emitted tokens {float(lengths.mean()):.4f}, expected 1 + Σ Π α = {expected:.4f} (± {tolerance:.4f})")


def test_exact_verify_chain_deterministic_drafter():
    """q=None: any draft chosen without looking at the verifier's randomness (here: random tokens, some
    with p = 0) gives tokens distributed as p."""
    g = gen(2)
    drafts = torch.randint(0, V, (N, GAMMA), generator=g)  # [N, γ]
    outs = [sampling.verify_chain(P, None, d, g) for d in drafts.tolist()]
    assert_chain_exact(outs, "verify_chain, q=None")


def test_exact_verify_candidates_iid_from_q():
    g = gen(3)
    cands = torch.multinomial(Q[0], 3 * N, replacement=True, generator=g).view(N, 3)  # [N, k] i.i.d. from q
    results = [sampling.verify_candidates(P[0], c, Q[0], g) for c in cands.tolist()]
    assert_distributed_as([t for _, t in results], P[0], "verify_candidates, 3 candidates i.i.d. from q")
    single = float(torch.minimum(P[0], Q[0]).sum())
    accepted = sum(i is not None for i, _ in results) / N
    assert accepted > single + 0.05, f"3 candidates were accepted {accepted:.3f} of the time, one alone {single:.3f}"


def test_exact_verify_candidates_deterministic():
    g = gen(4)
    cands = torch.rand(N, V, generator=g).argsort(-1)[:, :3]  # [N, k] distinct tokens, p = 0 ones included
    results = [sampling.verify_candidates(P[0], c, None, g) for c in cands.tolist()]
    assert_distributed_as([t for _, t in results], P[0], "verify_candidates, 3 distinct candidates, q=None")


def test_exact_test_has_teeth():
    """The same chi-square test rejects the two classic wrong rules and independent sibling tests."""
    g = gen(5)
    p, q = P[0], Q[0]
    x = torch.multinomial(q, N, replacement=True, generator=g)  # [N]
    u = torch.rand(N, generator=g)  # [N]
    from_residual = torch.multinomial(sampling.residual(p, q), N, replacement=True, generator=g)  # [N]
    from_p = torch.multinomial(p, N, replacement=True, generator=g)  # [N]
    wrong = {
        "accept when p >= q": torch.where(p[x] >= q[x], x, from_residual),
        "replacement drawn from p": torch.where(u * q[x] < p[x], x, from_p),
    }
    xs = torch.multinomial(q, 3 * N, replacement=True, generator=g).view(N, 3)  # [N, 3] siblings
    passes = torch.rand(N, 3, generator=g) * q[xs] < p[xs]  # [N, 3] each tested against the same p
    first = passes.float().argmax(-1)  # [N] first sibling that passes
    sibling = xs.gather(1, first[:, None]).squeeze(1)  # [N]
    wrong["siblings tested independently"] = torch.where(passes.any(-1), sibling, from_residual)
    for name, tokens in wrong.items():
        _, pvalue = chi_square(counts_of(tokens, V), p)
        assert pvalue < 1e-10, f"{name} should be detected as biased, got p-value {pvalue:.2g}"


# ---- probs_from_logits ---------------------------------------------------------------------------


def test_temperature_zero_is_greedy_one_hot():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [0.0, -1.0, 5.0, 4.9]])
    out = sampling.probs_from_logits(logits, temperature=0, top_k=2, top_p=0.5)
    assert_close(out, torch.tensor([[0.0, 1, 0, 0], [0, 0, 1, 0]]))  # ties: the first argmax


def test_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert_close(sampling.probs_from_logits(logits), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    hot = sampling.probs_from_logits(logits, temperature=0.5)
    assert_close(hot, torch.softmax(logits / 0.5, -1))
    assert_close(sampling.probs_from_logits(logits, top_k=2), torch.tensor([0.625, 0.375, 0, 0]))
    # top_p keeps the smallest set of most likely tokens whose mass reaches top_p.
    assert_close(sampling.probs_from_logits(logits, top_p=0.75), torch.tensor([0.625, 0.375, 0, 0]))
    assert_close(sampling.probs_from_logits(logits, top_p=0.9), torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)
    assert_close(sampling.probs_from_logits(logits, top_p=0.1), torch.tensor([1.0, 0, 0, 0]))
    batch = sampling.probs_from_logits(torch.randn(2, 3, 50, generator=gen()), temperature=0.7, top_k=10, top_p=0.8)
    assert batch.shape == (2, 3, 50)
    assert_close(batch.sum(-1), torch.ones(2, 3))
    assert ((batch > 0).sum(-1) <= 10).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [({"temperature": -1.0}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p")],
)
def test_probs_from_logits_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sampling.probs_from_logits(torch.zeros(4), **kwargs)


# ---- residual ----------------------------------------------------------------------------------------


def test_residual_matches_definition():
    p, q = P[0], Q[0]
    positive = (p - q).clamp_min(0)
    assert_close(sampling.residual(p, q), positive / positive.sum())
    assert_close(sampling.residual(P[:GAMMA], Q), (P[:GAMMA] - Q).clamp_min(0) / (P[:GAMMA] - Q).clamp_min(0).sum(-1, keepdim=True))


def test_residual_of_one_hot_is_p_without_that_token():
    p = P[0]
    without = p.clone()
    without[4] = 0
    assert_close(sampling.residual(p, torch.eye(V)[4]), without / without.sum())


def test_residual_never_nan():
    p = P[0]
    assert_close(sampling.residual(p, p.clone()), p)  # p == q: no positive mass, p comes back
    tiny = torch.tensor([0.5, 0.5 - 2e-45, 2e-45])  # the positive part is one subnormal float
    out = sampling.residual(tiny, torch.tensor([0.5, 0.5, 0.0]))
    assert torch.isfinite(out).all()
    assert_close(out, torch.tensor([0.0, 0.0, 1.0]))
    rows = torch.softmax(torch.randn(1000, 64, generator=gen()), -1)  # [1000, 64]
    near = rows * (1 + 1e-7 * torch.randn(1000, 64, generator=gen(1)))  # p - q is rounding noise
    out = sampling.residual(rows, near / near.sum(-1, keepdim=True))
    assert not torch.isnan(out).any()
    assert_close(out.sum(-1), torch.ones(1000))


def test_residual_shape_mismatch():
    with pytest.raises(ValueError, match=r"q must have shape \[7\] \(the shape of p\), got \[3, 7\]"):
        sampling.residual(P[0], Q)


# ---- verify_chain and verify_candidates: deterministic behaviour ------------------------------------


def test_zero_target_probability_never_accepted_even_at_u_zero(monkeypatch):
    """The test is strict (u * q(x) < p(x)): u = 0 must still reject a token with p(x) = 0."""
    monkeypatch.setattr(torch, "rand", lambda *shape, generator=None, device=None: torch.zeros(*shape))
    out = sampling.verify_chain(P, Q, [1, 0, 2], gen())  # P[0, 1] = 0
    assert len(out) == 1 and out[0] != 1
    assert sampling.verify_chain(P, Q, [0, 0, 2], gen())[:3] == [0, 0, 2]  # u = 0 accepts any p(x) > 0
    index, token = sampling.verify_candidates(P[0], [1, 5], None, gen())
    assert (index, token) == (1, 5)


def test_p_at_least_q_always_accepted_even_at_largest_u(monkeypatch):
    largest = 1 - 2**-24  # the largest float32 below 1
    monkeypatch.setattr(torch, "rand", lambda *shape, generator=None, device=None: torch.full(shape, largest))
    p = torch.stack([Q[0], P[1], P[2]])  # position 0: p == q; position 1: token 1 has p = 0.4 > q = 0.2
    assert sampling.verify_chain(p, Q[:2], [3, 1], gen())[:2] == [3, 1]
    assert sampling.verify_candidates(Q[0], [4], Q[0], gen()) == (0, 4)


def test_greedy_is_longest_matching_prefix_plus_target_argmax():
    g = gen(6)
    for _ in range(200):
        target = torch.randn(5, 6, generator=g)  # [γ+1, V]
        draft_logits = target[:4] + 1.5 * torch.randn(4, 6, generator=g)  # [γ, V]
        draft = draft_logits.argmax(-1).tolist()
        best = target.argmax(-1).tolist()
        n = next((i for i in range(4) if draft[i] != best[i]), 4)
        expected = draft[:n] + [best[n]]
        p, q = sampling.probs_from_logits(target, 0), sampling.probs_from_logits(draft_logits, 0)
        assert sampling.verify_chain(p, q, draft, g) == expected
        assert sampling.verify_chain(p, None, draft, g) == expected


def test_deterministic_drafter_equals_one_hot_q():
    for seed in range(100):
        draft = torch.randint(0, V, (GAMMA,), generator=gen(seed)).tolist()
        one_hot = torch.eye(V)[draft]
        assert sampling.verify_chain(P, None, draft, gen(seed)) == sampling.verify_chain(P, one_hot, draft, gen(seed))


def test_same_seed_same_result_and_empty_draft():
    assert sampling.verify_chain(P, Q, [0, 0, 2], gen(7)) == sampling.verify_chain(P, Q, [0, 0, 2], gen(7))
    assert len(sampling.verify_chain(P[:1], Q[:0], [], gen())) == 1  # γ = 0: one token from p
    assert sampling.verify_candidates(P[0], [], None, gen())[0] is None


def test_all_candidates_rejected_returns_none():
    index, token = sampling.verify_candidates(P[0], [1, 6], None, gen())  # p = 0 for both
    assert index is None and token not in (1, 6)


# ---- error messages ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sampling.verify_chain(P[:3], Q, [0, 0, 2]), r"γ\+1 = 4 rows"),
        (lambda: sampling.verify_chain(P, Q[:2], [0, 0, 2]), r"q must have shape \[3, 7\] \(\[γ, V\]\), got \[2, 7\]"),
        (lambda: sampling.verify_chain(P, Q.T, [0, 0, 2]), r"q must have shape"),
        (lambda: sampling.verify_chain(P[0], Q, [0, 0, 2]), r"p must have shape \[γ\+1, V\]"),
        (lambda: sampling.verify_chain(P * 0.9, Q, [0, 0, 2]), r"p row \[0\] sums to 0.900000, not 1 \(tolerance 0.0001\)"),
        (lambda: sampling.verify_chain(torch.randn(4, 7), Q, [0, 0, 2]), r"p has a negative entry .* not probabilities"),
        (lambda: sampling.verify_chain(P.log(), Q, [0, 0, 2]), r"p has a negative entry -1.204 at index \[0, 0\]"),
        (lambda: sampling.verify_chain(P.clone().index_fill_(1, torch.tensor([0]), float("inf")), Q, [0, 0, 2]), r"p row \[0\] sums to inf"),
        (lambda: sampling.verify_chain(P + 0.1, Q, [0, 0, 2]), r"not logits or unnormalized weights"),
        (lambda: sampling.verify_chain(P, -Q, [0, 0, 2]), r"q has a negative entry"),
        (lambda: sampling.verify_chain(P.clone().fill_(float("nan")), Q, [0, 0, 2]), r"p has NaN entries"),
        (lambda: sampling.verify_chain(P, Q, [2, 0, 2]), r"q gives the draft token 2 \(position 0\) probability 0"),
        (lambda: sampling.verify_chain(P, Q, [0, 0, 9]), r"draft token 9 at position 2 is outside the vocabulary \[0, 7\)"),
        (lambda: sampling.verify_chain(P, Q, [0.0, 0.0, 2.0]), r"integer token ids"),
        (lambda: sampling.verify_chain(P, Q, torch.tensor([[0, 0, 2]])), r"integer token ids"),
        (lambda: sampling.verify_chain(P.long(), Q, [0, 0, 2]), r"floating-point"),
        (lambda: sampling.verify_candidates(P[0], [3, 3], None), r"distinct"),
        (lambda: sampling.verify_candidates(P[0], [3, 2], Q[0]), r"candidate token 2 \(position 1\) probability 0"),
        (lambda: sampling.verify_candidates(P[0], [3], Q[0, :5] / Q[0, :5].sum()), r"q must have shape \[7\]"),
        (lambda: sampling.verify_candidates(P, [3], Q[0]), r"p must have shape \[V\]"),
    ],
)
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_sum_tolerance_is_the_stated_one():
    p = P.clone()
    p[0, 0] += 0.5 * checks.SUM_TOL  # inside the tolerance: accepted
    sampling.verify_chain(p, Q, [0, 0, 2], gen())
    p[0, 0] += checks.SUM_TOL  # outside
    with pytest.raises(ValueError, match="tolerance"):
        sampling.verify_chain(p, Q, [0, 0, 2], gen())
