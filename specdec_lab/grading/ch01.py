"""Chapter 01's graders (exercises/01_rejection_sampling.ipynb): rejection sampling, exact for any draft.

1. `check_four_token`: the hand-computed answers for a 4-token table (accept probabilities min(1, p/q), the
   residual, α = Σ min(p, q) and TV = 1 - α).
2. `check_residual`: residual(p, q) = normalize((p - q)_+) on hidden cases: zeros on both sides, a one-hot q,
   p == q (no positive mass: return p) and a batch of rows (normalized per row), inputs left unchanged.
3. `check_accept_or_replace`: the single-position rule, by its emitted tokens: p(x) >= q(x) always accepted,
   p(x) = 0 never, acceptance rate p/q otherwise, replacements distributed as the residual, and the emitted
   token distributed as p (chi-square tests on fixed seeds).
4. `check_verify_chain`: the chain rule: all drafts pass when p == q (then the bonus token ~ p[γ]), a certain
   rejection stops the chain with one replacement, the greedy special case, and position by position the
   emitted tokens distributed as p.

The reference residual is the library's (`sampling.residual`); exercise 1's min(1, p/q) and Σ min(p, q) are
one-liners the library has no function for. The hints name the usual mistakes (q/p for p/q, no cap at 1,
q - p for p - q, a missing normalization, a fixed accept rule, a missing bonus token).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specdec_lab.grading._common import (CLOSE, P_VALUE_MIN, call, check, chi_square, counts_of, fmt, grader,
                                         passed, seeded, token)
from specdec_lab.sampling import residual as _residual


# Exercise 1's table (exercises/01_rejection_sampling.ipynb shows the same numbers).
FOUR_TOKENS = "ABCD"
FOUR_P = [0.4, 0.4, 0.2, 0.0]
FOUR_Q = [0.5, 0.2, 0.1, 0.2]


@grader
def check_four_token(answers: Callable[[], dict]) -> None:
    """Exercise 01.1: accept probabilities, residual, α and TV for the 4-token table."""
    ans = call(answers)
    check(
        isinstance(ans, dict) and {"accept", "p_res", "alpha", "tv"} <= set(ans),
        f"four_token_answers() should return a dict with keys accept, p_res, alpha, tv; got {ans!r}",
    )
    p, q = torch.tensor(FOUR_P), torch.tensor(FOUR_Q)
    accept, p_res = [float(v) for v in ans["accept"]], [float(v) for v in ans["p_res"]]
    check(len(accept) == 4 and len(p_res) == 4, "accept and p_res should hold 4 numbers each, for A, B, C, D")
    for name, a, pi, qi in zip(FOUR_TOKENS, accept, FOUR_P, FOUR_Q):
        want = min(1.0, pi / qi)
        if abs(a - want) <= CLOSE:
            continue
        if pi > 0 and abs(a - qi / pi) <= CLOSE:
            check(False, f"accept[{name}] = {a:.3g} is q({name})/p({name}); the ratio is p over q")
        if a > 1:
            check(False, f"accept[{name}] = {a:.3g} is above 1: a probability caps at 1, so use min(1, p/q)")
        if pi == 0:
            check(False, f"accept[{name}] = {a:.3g}, but p({name}) = 0: the target never emits {name}")
        check(False, f"accept[{name}] = {a:.3g} for p({name}) = {pi}, q({name}) = {qi}: a drafted "
              "token is accepted with probability min(1, p/q)")
    want_res = _residual(p, q)
    if any(v < -CLOSE for v in p_res):
        check(False, f"p_res = {fmt(p_res)} has negative entries: keep only the positive part of p - q")
    total = sum(p_res)
    if abs(total - 1) > CLOSE:
        check(False, f"p_res = {fmt(p_res)} sums to {total:.3g}: did you normalize (p - q)_+ by its total?")
    if torch.allclose(torch.tensor(p_res), _residual(q, p), atol=CLOSE):
        check(False, f"p_res = {fmt(p_res)} is the positive part of q - p; the residual is built from p - q")
    check(torch.allclose(torch.tensor(p_res), want_res, atol=CLOSE),
          f"p_res = {fmt(p_res)} is not the residual: take (p - q)_+ token by token, then divide by its sum")
    alpha, tv = float(ans["alpha"]), float(ans["tv"])
    want_alpha = float(torch.minimum(p, q).sum())
    want_tv = 1 - want_alpha
    if abs(alpha - want_alpha) > CLOSE:
        check(abs(alpha - want_tv) > CLOSE, f"alpha = {alpha:.3g} is the total variation; α = Σ min(p, q)")
        check(False, f"alpha = {alpha:.3g}: α = Σ_x q(x) min(1, p(x)/q(x)), which simplifies to Σ_x min(p(x), q(x))")
    if abs(tv - want_tv) > CLOSE:
        check(abs(tv - 2 * want_tv) > CLOSE, f"tv = {tv:.3g} is Σ|p - q|; the total variation is half of it")
        check(False, f"tv = {tv:.3g}: TV(p, q) = ½ Σ_x |p(x) - q(x)|")
    passed(f"exercise 1: accept = {fmt(accept)}, residual = {fmt(p_res)}, "
           f"α = {alpha:.2f} = 1 - TV = 1 - {tv:.2f}")


@grader
def check_residual(residual: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Exercise 01.2: residual(p, q) = normalize((p - q)_+) over the last dim, p where that has no mass."""
    g = seeded(12)
    p = torch.tensor([0.3, 0.0, 0.25, 0.15, 0.2, 0.1])
    q = torch.tensor([0.1, 0.35, 0.0, 0.2, 0.05, 0.3])
    rows_p = torch.softmax(torch.randn(3, 5, generator=g), -1)
    rows_q = torch.softmax(torch.randn(3, 5, generator=g), -1)
    cases = [
        ("zeros on both sides", p, q),
        ("q one-hot (a greedy draft)", p, torch.eye(6)[2]),
        ("p == q", p, p.clone()),
        ("rows of a [3, 5] batch", rows_p, rows_q),
    ]
    for name, p, q in cases:
        p_in, q_in = p.clone(), q.clone()
        out = call(residual, p_in, q_in)
        shown = f"p={fmt(p)}, q={fmt(q)}" if p.dim() == 1 else f"a [3, 5] batch (p row 0 = {fmt(p[0])})"
        check(isinstance(out, Tensor) and out.shape == p.shape,
              f"residual({shown}) should return a tensor of shape {list(p.shape)}, got {out!r}")
        check(torch.equal(p_in, p) and torch.equal(q_in, q), f"residual({shown}) changed its inputs in place")
        out = out.float()
        check(not torch.isnan(out).any(), f"residual({shown}) returned NaN: when p - q has no positive mass "
              "(p == q) there is nothing to normalize; return p, since a rejection cannot happen then")
        check(out.min() >= -1e-6, f"residual({shown}) = {fmt(out)} has negative entries: clamp p - q at 0 first")
        sums = out.sum(-1)
        if p.dim() > 1 and abs(float(sums.sum()) - 1) < 1e-4:
            check(False, f"residual({shown}) is normalized over the whole batch (row sums {fmt(sums)}): "
                  "normalize each row over the last dim, sum(-1, keepdim=True)")
        check(torch.allclose(sums, torch.ones_like(sums), atol=1e-4),
              f"your residual sums to {fmt(sums)} for {shown}: did you normalize?")
        want = _residual(p, q)
        if not torch.allclose(out, want, atol=1e-5):
            check(not torch.allclose(out, _residual(q, p), atol=1e-5),
                  f"residual({shown}) = {fmt(out)} is built from q - p; the residual keeps where p exceeds q")
            check(False, f"residual({shown}) = {fmt(out)}, expected {fmt(want)}")
    passed("exercise 2: residual is right on 4 hidden cases (zeros, one-hot q, p == q, a batch of rows)")


@grader
def check_accept_or_replace(accept_or_replace: Callable) -> None:
    """Exercise 01.3: the single-position rule, accept_or_replace(p, q, x, generator) -> token."""
    fn = accept_or_replace
    p = torch.tensor([0.2, 0.3, 0.0, 0.15, 0.35, 0.0])
    q = torch.tensor([0.5, 0.1, 0.2, 0.15, 0.0, 0.05])
    shown = f"p={fmt(p)}, q={fmt(q)}"
    with torch.random.fork_rng():
        torch.manual_seed(0)  # in case the learner's code uses the global generator
        g = seeded(3)
        for x in (1, 3):  # p(x) > q(x), p(x) == q(x): always accepted
            outs = [token(fn, p, q, x, g) for _ in range(200)]
            check(all(o == x for o in outs), f"with {shown} and x={x}: p(x) >= q(x), so x must always be accepted, "
                  f"but {sum(o != x for o in outs)} of 200 calls returned something else")
        outs = [token(fn, p, q, 2, g) for _ in range(300)]
        check(2 not in outs, f"with {shown} and x=2: p(2) = 0, but x was accepted {outs.count(2)} times in 300 "
              "calls; the test u < p(x)/q(x) must be strict so that p(x) = 0 never passes")
        n, x, ratio = 4000, 0, 0.4  # p(0)/q(0)
        outs = torch.tensor([token(fn, p, q, x, g) for _ in range(n)])
        replaced = counts_of(outs[outs != x], len(p))  # p(0) < q(0): the residual never gives back x
        want = _residual(p, q)
        _, pv = chi_square(replaced, want)
        if pv < P_VALUE_MIN:
            p_without_x = p.clone()
            p_without_x[x] = 0
            check(chi_square(replaced, p_without_x)[1] < P_VALUE_MIN,
                  f"with {shown} and x=0, the replacements after a rejection follow p, not the residual "
                  f"{fmt(want)}: draw them from normalize(max(p - q, 0))")
            check(False, f"with {shown} and x=0, the replacement counts {fmt(replaced)} do not follow the "
                  f"residual {fmt(want)} (chi-square p-value {pv:.2g})")
        rate = float((outs == x).float().mean())
        if abs(rate - ratio) > 5 * (ratio * (1 - ratio) / n) ** 0.5:
            check(0.02 < rate < 0.98, f"with {shown} and x=0, x was accepted in {rate:.0%} of {n} calls: that "
                  "looks like a fixed rule (such as 'accept when p >= q'); accept with probability p(x)/q(x)")
            check(abs(rate - (1 - ratio)) > 0.05, f"with {shown} and x=0, x was accepted in {rate:.0%} of {n} "
                  f"calls, expected p/q = {ratio:.0%}: accept when u < p(x)/q(x), not when u > p(x)/q(x)")
            check(False, f"with {shown} and x=0, x was accepted in {rate:.0%} of {n} calls, expected "
                  f"min(1, p(x)/q(x)) = {ratio:.0%}")
        n = 6000
        drafts = torch.multinomial(q, n, replacement=True, generator=g)
        emitted = counts_of([token(fn, p, q, int(x), g) for x in drafts], len(p))
        _, pv = chi_square(emitted, p)
        check(pv >= P_VALUE_MIN, f"with {shown} and drafts x ~ q, the emitted counts over {n} draws are "
              f"{fmt(emitted)}, not distributed as p (chi-square p-value {pv:.2g})")
    passed(f"exercise 3: accept_or_replace emits tokens distributed as p (chi-square p-value {pv:.2f}, {n} draws)")


@grader
def check_verify_chain(verify_chain: Callable) -> None:
    """Exercise 01.4: verify_chain(p, q, draft, generator) -> accepted drafts + one corrected or bonus token."""
    fn = verify_chain
    with torch.random.fork_rng():
        torch.manual_seed(0)
        g = seeded(4)
        p = torch.softmax(torch.randn(4, 6, generator=g), -1)  # [γ+1, V], γ = 3
        q = p[:3].clone()
        draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(3)]

        def run(p, q, draft) -> list[int]:
            out = call(fn, p, q, list(draft), g)
            check(isinstance(out, (list, tuple)) and all(isinstance(t, int) for t in out),
                  f"verify_chain should return a list of ints, got {out!r}")
            out = list(out)
            kept = out[:-1]
            first_change = next((i for i, (a, b) in enumerate(zip(kept, draft)) if a != b), None)
            check(first_change is None, f"verify_chain(draft={draft}) returned {out}, which changes the draft at "
                  f"position {first_change} and then goes on: stop at the first rejection, after its replacement")
            check(1 <= len(out) <= len(draft) + 1, f"verify_chain(draft={draft}) returned {out}: expected the "
                  "accepted drafts followed by exactly one corrected or bonus token (1 to γ+1 tokens)")
            return out

        # 1. p == q at every draft position: every draft passes, then the bonus token from p[γ].
        outs = [run(p, q, draft) for _ in range(100)]
        short = next((o for o in outs if len(o) < 4), None)
        if short is not None:
            missing = ": the bonus token drawn from p[γ] is missing" if short == draft else ""
            check(False, f"with q equal to p at every position (p/q = 1) all 3 drafts {draft} pass, so 4 tokens "
                  f"come out, but one call returned {short}{missing}")
        bonus = counts_of([o[3] for o in outs] + [run(p, q, draft)[3] for _ in range(1900)], 6)
        _, pv = chi_square(bonus, p[3])
        check(pv >= P_VALUE_MIN, f"after all drafts pass, the bonus counts {fmt(bonus)} do not follow p[γ] = "
              f"{fmt(p[3])} (chi-square p-value {pv:.2g}): draw the bonus from the last row of p")
        # 2. A certain rejection at position 1: stop there, replace, drop the rest.
        p_rej = p.clone()
        p_rej[1] = 0.0
        p_rej[1, (draft[1] + 1) % 6] = 0.6
        p_rej[1, (draft[1] + 2) % 6] = 0.4
        for _ in range(50):
            out = run(p_rej, q, draft)
            check(len(out) == 2, f"p[1] gives the draft {draft[1]} probability 0, so position 1 is always "
                  f"rejected, yet verify_chain returned {out}: stop after the first rejection and emit one "
                  "replacement")
            check(out[1] != draft[1], f"the replacement at position 1 was the rejected draft {draft[1]}, which "
                  "the residual gives probability 0")
        # 3. Greedy: one-hot p and q; accept iff the draft equals the target's argmax.
        greedy_p = torch.eye(6)[[2, 5, 1, 0]]
        greedy_q = torch.eye(6)[[2, 4, 1]]
        out = run(greedy_p, greedy_q, [2, 4, 1])
        check(out == [2, 5], f"greedy case (one-hot p with argmaxes [2, 5, 1, 0], draft [2, 4, 1]): expected "
              f"[2, 5] (accept 2, reject 4, replace with the target's argmax 5), got {out}")
        # 4. Position by position, drafts drawn from q with zeros on both sides.
        p = torch.tensor([[0.3, 0.0, 0.25, 0.15, 0.2, 0.1], [0.1, 0.4, 0.1, 0.0, 0.2, 0.2],
                          [0.05, 0.05, 0.3, 0.3, 0.0, 0.3]])
        q = torch.tensor([[0.1, 0.35, 0.0, 0.2, 0.05, 0.3], [0.3, 0.2, 0.0, 0.2, 0.3, 0.0]])
        n = 5000
        drafts = torch.stack([torch.multinomial(row, n, replacement=True, generator=g) for row in q], 1)
        outs = [run(p, q, d.tolist()) for d in drafts]
        for pos in range(2):
            reached = counts_of([o[pos] for o in outs if len(o) > pos], 6)
            _, pv = chi_square(reached, p[pos])
            check(pv >= P_VALUE_MIN, f"with p={fmt(p)}, q={fmt(q)} and drafts ~ q, the tokens at position {pos} "
                  f"(over the {int(reached.sum())} calls that got there) are {fmt(reached)}, not distributed as "
                  f"p[{pos}] (chi-square p-value {pv:.2g})")
    passed(f"exercise 4: verify_chain is exact position by position (chi-square p-value {pv:.2f}) and greedy "
           "special case, bonus token and early stop are right")
