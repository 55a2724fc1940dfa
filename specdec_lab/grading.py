"""Graders for the exercise notebooks.

Each `check_*` takes the learner's function, runs it on cases the notebook does not show, and either
prints one line that starts with "PASS" or raises `AssertionError` with a hint that names the input
and what went wrong. Sampling checks use fixed seeds and Pearson's chi-square test (`chi_square`),
failing below `P_VALUE_MIN`. The small helpers at the top are meant for the graders of every chapter.

In Jupyter a failing grader shows its hint first and hides its own frames (see `_grader` at the end): a hint
shows as two lines, and an error raised inside the learner's code keeps only the learner's frames.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable

import torch
from torch import Tensor

from specdec_lab.sampling import residual as _residual

P_VALUE_MIN = 1e-4  # a chi-square test fails below this p-value
CLOSE = 5e-3  # hand-computed answers may be rounded to this absolute tolerance


# ---- helpers for every chapter ----------------------------------------------------------------


def chi_square(counts, probs) -> tuple[float, float]:
    """Pearson's chi-square of observed counts against probabilities: (statistic, p-value).

    Tokens with probability 0 must never be observed (a single one gives p-value 0) and are left out
    of the statistic; the degrees of freedom are the number of tokens with probability > 0, minus 1.
    """
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    support = probs > 0
    if counts[~support].sum() > 0:
        return float("inf"), 0.0
    observed, expected = counts[support], counts.sum() * probs[support] / probs[support].sum()
    stat = ((observed - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    if dof == 0:
        return 0.0, 1.0
    return float(stat), float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def counts_of(tokens, vocab: int) -> Tensor:
    """How often each of the `vocab` token ids occurs in `tokens`: [V] int64."""
    return torch.bincount(torch.as_tensor(tokens, dtype=torch.long).flatten(), minlength=vocab)


def fmt(x, digits: int = 3) -> str:
    """A short printable form of a number, list or tensor, for hints: [0.4, 0.2, 0]."""
    if isinstance(x, Tensor):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v, digits) for v in x) + "]"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def call(fn: Callable, *args):
    """fn(*args), with a hint instead of a bare NotImplementedError when a stub is still in place."""
    try:
        return fn(*args)
    except NotImplementedError as e:
        name = getattr(fn, "__name__", "your function")
        stub = str(e).split(":")[0]  # nbtool's stubs say "<function>: your code here"
        if stub and stub != name and " " not in stub and not isinstance(fn, type):  # a class: its own methods
            hint = f"{name} calls {stub}, which is still a stub: finish that exercise first"
        else:
            hint = (f"{name} is not implemented yet: replace the `raise NotImplementedError` line in its cell "
                    "with your code, run that cell, then this one")
        raise AssertionError(hint) from None


def passed(message: str) -> None:
    print(f"PASS  {message}")


def check(condition: bool, hint: str) -> None:
    if not condition:
        raise AssertionError(hint)


def _token(fn: Callable, *args) -> int:
    """Call a learner's sampler and insist on one token id."""
    out = call(fn, *args)
    try:
        return int(out)
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"{fn.__name__} should return one token id (an int), got {out!r}") from None


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- chapter 01: rejection sampling ----------------------------------------------------------

# Exercise 1's table (exercises/01_rejection_sampling.ipynb shows the same numbers).
FOUR_TOKENS = "ABCD"
FOUR_P = [0.4, 0.4, 0.2, 0.0]
FOUR_Q = [0.5, 0.2, 0.1, 0.2]


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


def check_residual(residual: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Exercise 01.2: residual(p, q) = normalize((p - q)_+) over the last dim, p where that has no mass."""
    g = _generator(12)
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


def check_accept_or_replace(accept_or_replace: Callable) -> None:
    """Exercise 01.3: the single-position rule, accept_or_replace(p, q, x, generator) -> token."""
    fn = accept_or_replace
    p = torch.tensor([0.2, 0.3, 0.0, 0.15, 0.35, 0.0])
    q = torch.tensor([0.5, 0.1, 0.2, 0.15, 0.0, 0.05])
    shown = f"p={fmt(p)}, q={fmt(q)}"
    with torch.random.fork_rng():
        torch.manual_seed(0)  # in case the learner's code uses the global generator
        g = _generator(3)
        for x in (1, 3):  # p(x) > q(x), p(x) == q(x): always accepted
            outs = [_token(fn, p, q, x, g) for _ in range(200)]
            check(all(o == x for o in outs), f"with {shown} and x={x}: p(x) >= q(x), so x must always be accepted, "
                  f"but {sum(o != x for o in outs)} of 200 calls returned something else")
        outs = [_token(fn, p, q, 2, g) for _ in range(300)]
        check(2 not in outs, f"with {shown} and x=2: p(2) = 0, but x was accepted {outs.count(2)} times in 300 "
              "calls; the test u < p(x)/q(x) must be strict so that p(x) = 0 never passes")
        n, x, ratio = 4000, 0, 0.4  # p(0)/q(0)
        outs = torch.tensor([_token(fn, p, q, x, g) for _ in range(n)])
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
        emitted = counts_of([_token(fn, p, q, int(x), g) for x in drafts], len(p))
        _, pv = chi_square(emitted, p)
        check(pv >= P_VALUE_MIN, f"with {shown} and drafts x ~ q, the emitted counts over {n} draws are "
              f"{fmt(emitted)}, not distributed as p (chi-square p-value {pv:.2g})")
    passed(f"exercise 3: accept_or_replace emits tokens distributed as p (chi-square p-value {pv:.2f}, {n} draws)")


def check_verify_chain(verify_chain: Callable) -> None:
    """Exercise 01.4: verify_chain(p, q, draft, generator) -> accepted drafts + one corrected or bonus token."""
    fn = verify_chain
    with torch.random.fork_rng():
        torch.manual_seed(0)
        g = _generator(4)
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


# ---- chapter 00: decoding is memory-bound ------------------------------------------------------


def _ratio_hint(got: float, want: float, what: str) -> str:
    """Name the usual unit slip when `got` is off from `want` by a telltale factor."""
    r = got / want if want else float("inf")
    for factor, slip in [(1e3, "seconds vs milliseconds, or TB/s vs GB/s"), (1e-3, "milliseconds vs seconds, or GB/s vs TB/s"),
                         (1e9, "GB/s is 1e9 bytes per second"), (1e-9, "GB/s is 1e9 bytes per second"),
                         (2.0, "bytes per parameter"), (0.5, "bytes per parameter"),
                         (1e12, "TFLOP/s is 1e12 FLOP per second"), (1e-12, "TFLOP/s is 1e12 FLOP per second")]:
        if abs(r / factor - 1) < 0.02:
            return f"{what}: you returned {fmt(got)}, {fmt(factor)} times the right value. Check your units: {slip}?"
    return f"{what}: you returned {fmt(got)}, expected {fmt(want)}."


def check_weight_bytes(weight_bytes: Callable[[float, float], float]) -> None:
    for n, b in [(8.03e9, 2), (1.5e9, 4), (405e9, 1), (7e9, 0.5)]:
        got = float(call(weight_bytes, n, b))
        check(abs(got - n * b) <= 1e-6 * n * b, _ratio_hint(got, n * b, f"weight_bytes({fmt(n)}, {b})"))
    passed("exercise 1: weight_bytes is right for 4 models (fp32, bf16, fp8, int4)")


def check_memory_bound_ms(memory_bound_ms: Callable[[float, float, float], float]) -> None:
    cases = [(8.03e9, 2, 1008), (1.5e9, 4, 100), (405e9, 1, 8000), (7e9, 0.5, 120)]  # params, bytes, GB/s
    for n, b, gbs in cases:
        want = 1e3 * n * b / (gbs * 1e9)
        got = float(call(memory_bound_ms, n, b, gbs))
        check(abs(got - want) <= 1e-6 * want,
              _ratio_hint(got, want, f"memory_bound_ms({fmt(n)} params, {b} bytes each, {gbs} GB/s)")
              + " The floor is (bytes read per step) / (bytes per second), in milliseconds.")
    passed("exercise 2: memory_bound_ms gives the bandwidth floor of a decode step for 4 model/hardware pairs")


def check_free_tokens(free_tokens: Callable[[float, float, float], float]) -> None:
    cases = [(989, 3350, 2), (312, 2039, 2), (165, 1008, 2), (1979, 3350, 1)]  # TFLOP/s, GB/s, bytes/param
    for tflops, gbs, b in cases:
        want = tflops * 1e12 * b / (2 * gbs * 1e9)
        got = float(call(free_tokens, tflops, gbs, b))
        hint = _ratio_hint(got, want, f"free_tokens({tflops} TFLOP/s, {gbs} GB/s, {b} bytes/param)")
        if abs(got * 2 / want - 1) < 0.02 or abs(got / 2 / want - 1) < 0.02:
            hint += " Each token costs 2 FLOPs per parameter (a multiply and an add)."
        check(abs(got - want) <= 1e-6 * want, hint)
    passed("exercise 3: free_tokens finds where the arithmetic of K tokens catches up with the weight reads")


def check_gpu_answer(h200_floor_ms: Callable[[], float]) -> None:
    want = 1e3 * 70.6e9 * 2 / 4.8e12  # a 70.6B model in bf16 on an H200 (4.8 TB/s)
    answer_ms = call(h200_floor_ms)
    check(isinstance(answer_ms, (int, float)), f"return a number of milliseconds, not {answer_ms!r}")
    check(abs(answer_ms - want) <= 0.05 * want, _ratio_hint(float(answer_ms), want, "h200_floor_ms()"))
    passed(f"exercise 4: {answer_ms:.1f} ms per step, so at most {1e3 / answer_ms:.0f} tokens/s per sequence")


# ---- chapter 03: draft model and target ---------------------------------------------------------


def check_cache_lengths(cache_lengths_after: Callable[[int, int, int], tuple]) -> None:
    """Exercise 03.1: positions each cache keeps after `accepted` of `gamma` drafts pass.

    Before the step the text has `committed` tokens; the target's cache holds committed - 1 of them.
    """
    fn = cache_lengths_after
    for committed, gamma, accepted in [(10, 4, 0), (10, 4, 2), (10, 4, 3), (10, 4, 4), (7, 1, 0), (7, 1, 1),
                                       (25, 6, 6), (25, 6, 5), (3, 8, 1)]:
        got = call(fn, committed, gamma, accepted)
        case = f"cache_lengths_after(committed={committed}, gamma={gamma}, accepted={accepted})"
        check(isinstance(got, (tuple, list)) and len(got) == 2,
              f"{case} should return two ints (target_keeps, draft_keeps), got {got!r}")
        target_keeps, draft_keeps = (int(v) for v in got)
        new_len = committed + accepted + 1  # accepted drafts + one token of the target's own
        want_target, want_draft = new_len - 1, min(new_len - 1, committed + gamma - 1)
        if target_keeps != want_target:
            check(target_keeps != new_len, f"{case}: target_keeps = {target_keeps} counts the new last token; it "
                  "stays pending (fed first in the next step), so the cache holds the committed length minus 1")
            check(target_keeps != committed + gamma, f"{case}: target_keeps = {target_keeps} is everything the "
                  "verify pass wrote: the KV of rejected drafts must be dropped")
            check(False, f"{case}: target_keeps = {target_keeps}; the text now has {new_len} tokens "
                  f"({committed} + {accepted} accepted + 1 from the target)")
        if draft_keeps != want_draft:
            if accepted == gamma:
                check(False, f"{case}: draft_keeps = {draft_keeps}, but with every draft accepted the draft model "
                      f"has only computed KV for {committed + gamma - 1} positions: it never fed its own last "
                      "draft, so its cache lags one token behind the target's")
            check(draft_keeps != committed + gamma - 1, f"{case}: draft_keeps = {draft_keeps} keeps the KV of "
                  "drafts that were rejected; crop it to the committed length minus 1")
            check(False, f"{case}: draft_keeps = {draft_keeps}, expected {want_draft}")
    passed("exercise 1: the target keeps committed - 1 positions; the draft the same, or one fewer when "
           "every draft was accepted")


class _one_thread:
    """Tiny models run fastest on one thread (and two threads crawl on a busy machine): used by 03's graders."""

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


def _tiny_pair(seed: int = 0):
    """A tiny random Llama target, a noisy copy of it (agrees partly) and an unrelated draft, in fp32."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    def llama(hidden, layers, s):
        torch.manual_seed(s)
        config = LlamaConfig(vocab_size=211, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=256, initializer_range=0.2, eos_token_id=None,
                             bos_token_id=None, pad_token_id=None)
        return LlamaForCausalLM(config).eval()

    with torch.random.fork_rng():
        target = llama(48, 2, seed)
        noisy = copy.deepcopy(target)
        g = _generator(seed + 1)
        with torch.no_grad():
            for p in noisy.parameters():
                p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.05)
        return target, noisy, llama(32, 1, seed + 2)


def _greedy_accepted(draft, ids: Tensor, want: list[int], gamma: int) -> int:
    """How many of the draft's greedy proposals after ids [1, T] equal the target's greedy tokens `want`."""
    from specdec_lab import lm

    seq = ids
    with torch.no_grad():
        for i in range(min(gamma, len(want))):
            x = lm.forward(draft, seq)[:, -1:].argmax(-1)  # [1, 1]
            if int(x) != want[i]:
                return i
            seq = torch.cat([seq, x], 1)
    return min(gamma, len(want))


def check_speculative_step(speculative_step: Callable) -> None:
    """Exercise 03.2: speculative_step(target, draft, ids, target_cache, draft_cache, gamma) -> emitted tokens."""
    with _one_thread():
        _check_speculative_step(speculative_step)


def _check_speculative_step(speculative_step: Callable) -> None:
    from specdec_lab import lm

    target, noisy, unrelated = _tiny_pair()
    prompts = [torch.randint(0, 211, (1, n), generator=_generator(50 + n)) for n in (1, 6, 13)]
    summary = []
    for name, draft in [("a noisy copy of the target", noisy), ("the target itself", target),
                        ("an unrelated model", unrelated)]:
        for gamma in (1, 3, 5):
            for ids0 in prompts:
                want = lm.hf_generate(target, ids0, 24 + gamma + 1).tolist()  # a last step may run past 24
                ids, tc, dc = ids0.clone(), lm.new_cache(target), lm.new_cache(draft)
                steps = 0
                case = f"draft = {name}, gamma = {gamma}, a {ids0.shape[1]}-token prompt"
                while ids.shape[1] - ids0.shape[1] < 24:
                    T = ids.shape[1]
                    with torch.no_grad():
                        out = call(speculative_step, target, draft, ids, tc, dc, gamma)
                    check(isinstance(out, (list, tuple)) and all(isinstance(t, int) for t in out),
                          f"{case}: speculative_step should return a list of ints, got {out!r}")
                    check(1 <= len(out) <= gamma + 1, f"{case}, step {steps}: {len(out)} tokens returned; a step "
                          f"emits the accepted drafts plus exactly one token of the target's own (1 to γ+1)")
                    check(ids.shape[1] == T, f"{case}: speculative_step changed `ids` in place; return the new "
                          "tokens and leave ids alone")
                    got = ids[0, ids0.shape[1]:].tolist() + list(out)
                    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                    if first is not None:
                        check(steps > 0 or first > 0, f"{case}: the very first token differs from greedy decoding: "
                              "on the first step the target cache is empty, so feed the whole prompt plus the "
                              "drafts and read the LAST γ+1 rows of the logits")
                        check(False, f"{case}: step {steps} emitted {list(out)}; token {first} differs from greedy "
                              f"decoding ({got[first]} instead of {want[first]}). Accept drafts while they equal the "
                              "target's argmax, then append the target's argmax at the first mismatch (or the bonus)")
                    ids = torch.cat([ids, torch.tensor([list(out)])], 1)
                    T, accepted = ids.shape[1], len(out) - 1
                    want_len = _greedy_accepted(draft, ids[:, :T - len(out)], want[T - len(out) - ids0.shape[1]:],
                                                gamma) + 1
                    if len(out) != want_len:
                        check(not (len(out) == gamma == want_len - 1), f"{case}, step {steps}: all {gamma} drafts "
                              f"equal the target's argmax, but the step returned only {gamma} tokens: the target's "
                              "last row of logits gives a free bonus token; append it (a step emits 1 to γ+1 tokens)")
                        check(False, f"{case}, step {steps}: {want_len - 1} drafts equal the target's argmax, so the "
                              f"step should emit {want_len} tokens, not {len(out)}: accept drafts while they equal "
                              "the target's argmax, then add the target's own token")
                    check(lm.cache_len(tc) == T - 1, f"{case}, step {steps}: the target cache holds "
                          f"{lm.cache_len(tc)} positions for a {T}-token text; crop it to {T - 1} (every committed "
                          "token but the last, which is fed first in the next step)")
                    want_draft = T - 2 if accepted == gamma else T - 1
                    check(lm.cache_len(dc) == want_draft, f"{case}, step {steps}: {accepted} of {gamma} drafts "
                          f"accepted, the draft cache holds {lm.cache_len(dc)} positions, expected {want_draft}"
                          + (" (it never fed its own last draft)" if accepted == gamma else
                             ": crop it back to the committed length minus 1"))
                    steps += 1
                summary.append(steps)
    passed(f"exercise 2: 27 runs equal greedy decoding, caches right after every one of {sum(summary)} steps")


def check_greedy_mismatches(greedy_mismatches: Callable) -> None:
    """Exercise 03.3: greedy_mismatches(target, decode, prompts, max_new_tokens) -> {prompt index: position}."""
    with _one_thread():
        _check_greedy_mismatches(greedy_mismatches)


def _check_greedy_mismatches(greedy_mismatches: Callable) -> None:
    from specdec_lab import lm
    from specdec_lab.decoding import generate
    from specdec_lab.drafters import DraftModelDrafter

    target, noisy, _ = _tiny_pair(seed=3)
    prompts = [torch.randint(0, 211, (1, n), generator=_generator(70 + n)) for n in (3, 8, 5, 11)]
    n = 16

    def correct(ids, max_new_tokens):
        return generate(target, ids, DraftModelDrafter(noisy, 3), max_new_tokens=max_new_tokens).tokens

    def buggy(ids, max_new_tokens):
        tokens = correct(ids, max_new_tokens)
        which = next(i for i, p in enumerate(prompts) if p is ids or torch.equal(p, ids))
        if which == 1:
            tokens[5] = (tokens[5] + 1) % 211  # a wrong token in the middle
        if which == 2:
            tokens = tokens[:-1]  # one token short
        if which == 3:
            tokens = tokens + [0]  # one token too many (ran past the budget)
        return tokens

    got = call(greedy_mismatches, target, correct, prompts, n)
    check(isinstance(got, dict), f"greedy_mismatches should return a dict {{prompt index: position}}, got {got!r}")
    check(got == {}, f"a correct decoder got {got}: compare with the target's own greedy decoding, "
          "lm.hf_generate(target, ids, max_new_tokens), and report only prompts that differ")
    got = call(greedy_mismatches, target, buggy, prompts, n)
    want = {1: 5, 2: n - 1, 3: n}
    if got != want:
        check(1 in got, f"got {got}: prompt 1's output has a wrong token at position 5 that you did not report")
        check(got.get(1) == 5, f"got {got}: prompt 1's first wrong token is at position 5 (0-based, counted "
              f"in the new tokens), you reported {got.get(1)}")
        check(got.get(2) == n - 1, f"got {got}: prompt 2's output is one token short; report the length of the "
              f"shorter list ({n - 1}) when one is a prefix of the other")
        check(got.get(3) == n, f"got {got}: prompt 3's output has an extra token; report position {n}, where "
              "the reference ends")
        check(0 not in got, f"got {got}: prompt 0 matches, leave it out")
    passed(f"exercise 3: greedy_mismatches finds a wrong token, a short and a long output ({want})")


# ---- chapter 02: speedup economics --------------------------------------------------------------


def _number(fn: Callable, *args) -> float:
    """Call a learner's formula and insist on one finite-or-infinite real number (NaN is a hint of 0/0)."""
    try:
        out = call(fn, *args)
    except ZeroDivisionError:
        raise AssertionError(f"{fn.__name__}{args} divided by zero") from None
    try:
        return float(out)
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"{fn.__name__}{args} should return one number, got {out!r}") from None


def _geometric(alpha: float, terms: int) -> float:
    """Σ_{i<terms} α^i."""
    return sum(alpha**i for i in range(terms))


def check_expected_tokens(expected_tokens: Callable[[float, int], float]) -> None:
    """Exercise 02.1: E[tokens per target pass] = Σ_{i=0}^{γ} α^i."""
    fn = expected_tokens
    tol = 1e-4  # relative: float32 closed forms near α = 1 are off by about 1e-5
    for alpha, gamma in [(0.6, 1), (0.75, 5), (0.95, 12), (0.3, 0), (0.0, 6), (0.999, 7), (1.0, 4), (1.0, 0)]:
        case = f"expected_tokens({alpha}, {gamma})"
        want = _geometric(alpha, gamma + 1)
        try:
            got = _number(fn, alpha, gamma)
        except AssertionError as e:
            if alpha == 1 and "divided by zero" in str(e):
                check(False, f"{case} divided by zero: the closed form is 0/0 at α = 1. There every draft is "
                      "accepted, so a pass yields all γ drafts plus the bonus token: return γ + 1")
            raise
        if abs(got - want) <= tol * want:
            continue
        check(got == got, f"{case} returned NaN: the closed form is 0/0 at α = 1, where every draft is accepted; "
              "return γ + 1 there")
        if abs(got - (want - 1)) <= tol * want:
            check(False, f"{case} = {got:.4g} counts only the accepted drafts: add the one token the target "
                  "emits itself in every pass (the correction, or the bonus when all drafts pass)")
        if gamma > 0 and abs(got - _geometric(alpha, gamma)) <= tol * want:
            check(False, f"{case} = {got:.4g} stops one term early: the sum runs over i = 0..γ, "
                  "(1 - α^(γ+1)) / (1 - α)")
        if abs(got - _geometric(alpha, gamma + 2)) <= tol * want:
            check(False, f"{case} = {got:.4g} has one term too many: the sum runs over i = 0..γ")
        if alpha < 1 and abs(got - 1 / (1 - alpha)) <= tol * want:
            check(False, f"{case} = {got:.4g} is the infinite geometric sum 1 / (1 - α): only γ tokens are "
                  "drafted, so truncate it, (1 - α^(γ+1)) / (1 - α)")
        check(False, f"{case} = {got:.4g}, expected {want:.4g}: draft i (1-based) is reached and accepted with "
              "probability α^i, so E = 1 + α + ... + α^γ")
    passed("exercise 1: expected_tokens is right on 8 hidden cases, α = 0 and α = 1 included")


SWEEP_ALPHA, SWEEP_C, SWEEP_GAMMAS = 0.7, 0.05, (4, 6, 8)  # exercise 02.2's question: α = 0.7, c = 0.05, γ = 4, 6, 8


def check_speedup(speedup: Callable[[float, int, float], float], what_the_numbers_show: Callable[[], str]) -> None:
    """Exercise 02.2: S = E[tokens] / (1 + γ·c) (Leviathan et al. 2023), then the question about γ = 4, 6, 8."""
    for alpha, gamma, c in [(0.8, 3, 0.1), (0.9, 7, 0.02), (0.5, 2, 0.3), (0.0, 4, 0.05), (1.0, 5, 0.0),
                            (0.6, 1, 0.0)]:
        case = f"speedup({alpha}, {gamma}, {c})"
        tokens = _geometric(alpha, gamma + 1)
        want = tokens / (1 + gamma * c)
        got = _number(speedup, alpha, gamma, c)
        if abs(got - want) <= 1e-4 * want:
            continue
        if abs(got - tokens) <= 1e-4 * want:
            check(False, f"{case} = {got:.4g} is the tokens per pass alone: divide by the cost of a round")
        for wrong, what in [(1 + c, "1 + c"), (gamma * c, "γ·c"), (1 + (gamma + 1) * c, "1 + (γ+1)·c")]:
            if wrong and abs(got - tokens / wrong) <= 1e-4 * want:
                check(False, f"{case} = {got:.4g} divides by {what}: a round costs one target pass plus γ draft "
                      "tokens at c each, 1 + γ·c target steps")
        check(False, f"{case} = {got:.4g}, expected {want:.4g} = E[tokens per pass] / (1 + γ·c)")
    rows = {g: (_number(speedup, SWEEP_ALPHA, g, SWEEP_C), _geometric(SWEEP_ALPHA, g + 1)) for g in SWEEP_GAMMAS}
    print(f"α = {SWEEP_ALPHA}, c = {SWEEP_C}: " + "; ".join(f"γ = {g}: {t:.2f} tokens per pass, speedup {s:.3f}"
                                                           for g, (s, t) in rows.items()))
    answer = str(call(what_the_numbers_show)).strip().lower().strip("()")
    check(answer in ("a", "b", "c", "d"), f"what_the_numbers_show() should return one letter, a to d; got {answer!r}")
    hints = {"a": "does γ = 8 beat γ = 6 in the line above?",
             "c": "the three speedups differ; and at γ = 0 (no drafting) it would be 1",
             "d": "γ = 8 drafts the most tokens, but is it the fastest in the line above?"}
    check(answer == "b", f"what_the_numbers_show() = {answer!r}: {hints.get(answer, '')} Each extra draft token "
          "costs c = 0.05 of a target step but adds only α^(γ+1) expected tokens, which keeps shrinking")
    passed("exercise 2: speedup is right on 6 hidden cases; the speedup rises from γ = 4 to 6, then falls at 8: "
           "past the best γ a draft token costs more than it brings")


def check_optimal_gamma(optimal_gamma: Callable[..., int]) -> None:
    """Exercise 02.3: the γ in 1..max_gamma with the largest speedup, or 0 when none beats plain decoding."""
    from specdec_lab.economics import optimal_gamma as reference
    from specdec_lab.economics import speedup as s

    cases = [(0.85, 0.07, 10), (0.75, 0.12, 32), (0.95, 0.01, 32), (0.5, 0.3, 32), (0.2, 0.3, 32), (0.9, 0.0, 20),
             (1.0, 0.0, 12), (0.0, 0.05, 8), (0.7, 0.02, 5)]
    for alpha, c, max_gamma in cases:
        case = f"optimal_gamma({alpha}, {c}, max_gamma={max_gamma})"
        got = call(optimal_gamma, alpha, c, max_gamma)
        want = reference(alpha, c, max_gamma)
        if isinstance(got, float) and not got.is_integer():
            check(False, f"{case} returned {got:.4g}: return the draft length γ (an int), not its speedup")
        check(isinstance(got, int) or (isinstance(got, float) and got.is_integer()),
              f"{case} should return an int, got {got!r}")
        got = int(got)
        if got == want:
            continue
        check(0 <= got <= max_gamma, f"{case} = {got} is outside 0..max_gamma")
        if want == 0:
            check(False, f"{case} = {got}, but with α = {alpha} and c = {c} every γ is slower than plain decoding "
                  f"(γ = 1 gives {s(alpha, 1, c):.3f}x): return 0, meaning do not speculate")
        if got == 0:
            check(False, f"{case} = 0, but γ = {want} gives {s(alpha, want, c):.3f}x, faster than plain decoding")
        check(not (want == max_gamma and got == max_gamma - 1), f"{case} = {got}: γ = max_gamma = {max_gamma} "
              "is faster still; include it in the search (range(1, max_gamma + 1))")
        check(not (got == max_gamma and c > 0), f"{case} = {got}: the longest draft has the most tokens per "
              "pass, but maximize the speedup, which pays γ·c per round")
        check(False, f"{case} = {got} (speedup {s(alpha, got, c):.4f}), but γ = {want} gives "
              f"{s(alpha, want, c):.4f}")
    passed("exercise 3: optimal_gamma agrees with a brute-force search on 9 hidden cases, 'do not speculate' "
           "(γ = 0) included")


def check_crossover_batch(crossover_batch: Callable) -> None:
    """Exercise 02.4: the batch B* where a step over B·t tokens turns compute-bound."""
    import dataclasses
    import math

    from specdec_lab.economics import QWEN25_7B_ON_H100, Roofline

    llama8b_a100 = Roofline(params=8.03e9, bandwidth=2.039e12, peak_flops=312e12, kv_bytes_per_token=131072)
    cases = [
        ("Qwen2.5-7B on an H100", QWEN25_7B_ON_H100, 5),
        ("Llama-3.1-8B on an A100", llama8b_a100, 5),
        ("Llama-3.1-8B on an A100", llama8b_a100, 1),
        ("a 1B model in fp8 with no KV cache", Roofline(1e9, 1e12, 500e12, bytes_per_param=1, efficiency=0.5), 3),
        ("Llama-3.1-8B on an A100 at 4k context", dataclasses.replace(llama8b_a100, context=4096), 5),
        ("a 1B model at 128k context", Roofline(1e9, 3e12, 900e12, kv_bytes_per_token=2**18, context=131072), 1),
    ]
    for name, m, t in cases:
        case = f"crossover_batch({name}, tokens_per_request={t})"
        got = _number(crossover_batch, m, t)
        want = m.crossover_batch(t)
        if want == math.inf:
            check(got == math.inf, f"{case} = {got:.4g}: here the KV reads one request adds outgrow the arithmetic "
                  "it adds, so no batch makes the step compute-bound; return math.inf")
            continue
        if abs(got - want) <= 1e-4 * want:
            continue
        check(got > 0, f"{case} = {got:.4g}: a batch size is positive")
        if abs(got - round(want)) < 1e-9 or got in (math.floor(want), math.ceil(want)):
            check(False, f"{case} = {got}: return the exact crossover {want:.4g} as a float, not rounded")
        variants = [
            ("efficiency", {"efficiency": 1.0}, "the arithmetic runs at efficiency × peak_flops, not at the peak"),
            ("kv", {"kv_bytes_per_token": 0.0}, "each request also reads its KV cache, kv_bytes_per_token × "
             "context bytes, so the memory time grows with the batch too"),
            ("bytes", {"bytes_per_param": 1.0}, "the weights take params × bytes_per_param bytes"),
        ]
        for _, change, hint in variants:
            other = dataclasses.replace(m, **change)
            if other != m and abs(got - other.crossover_batch(t)) <= 1e-4 * want:
                check(False, f"{case} = {got:.4g}, expected {want:.4g}: {hint}")
        if t > 1 and abs(got - m.crossover_batch(1)) <= 1e-4 * want:
            check(False, f"{case} = {got:.4g}: each request brings tokens_per_request = {t} tokens to the step, "
                  "so its arithmetic is 2 · params · t FLOPs")
        for factor in (2, 0.5):  # 1 or 4 FLOPs per parameter per token
            if abs(got - dataclasses.replace(m, peak_flops=m.peak_flops * factor).crossover_batch(t)) <= 1e-4 * want:
                check(False, f"{case} = {got:.4g}, expected {want:.4g}: one token costs 2 FLOPs per parameter "
                      "(a multiply and an add)")
        check(False, f"{case} = {got:.4g}, expected {want:.4g}: solve 2·N·B·t / (η·F) = (N·b + kv·ctx·B) / BW "
              "for B")
    qwen, llama = QWEN25_7B_ON_H100.crossover_batch(5), llama8b_a100.crossover_batch(5)
    passed(f"exercise 4: verifying 5 tokens per request is free up to batch {qwen:.0f} for Qwen2.5-7B on an H100, "
           f"{llama:.0f} for Llama-3.1-8B on an A100")


# ---- chapter 07: drafting without a drafter ----------------------------------------------------------


def _ngram_draft_reference(seq: list[int], gamma: int) -> list[int]:
    """Exercise 07.1's rule (a one-token prompt lookup, after Saxena 2023): copy what followed the most recent
    EARLIER occurrence of the last token; where there is no match, or the copy runs past the end of the text,
    propose the last token."""
    key = seq[-1]
    match = next((j for j in range(len(seq) - 2, -1, -1) if seq[j] == key), None)
    return [seq[match + k] if match is not None and match + k < len(seq) else key for k in range(1, gamma + 1)]


def check_ngram_draft(ngram_draft: Callable) -> None:
    """Exercise 07.1: ngram_draft(prefix_ids [1, T], gamma, vocab_size) -> (gamma token ids, gamma [1, V] one-hots)."""
    V = 23
    cases = [([3, 7, 1, 5, 7, 2, 9, 7], 3), ([4, 5, 6, 4, 8, 1, 4], 2), ([1, 2, 3, 1, 2, 3, 4, 2, 6, 2], 4),
             ([9, 8, 7], 2), ([5], 3), ([6, 1, 6], 4), ([2, 2, 2, 2], 1), ([0, 11, 22, 0, 5, 22], 5)]
    for seq, gamma in cases:
        case = f"ngram_draft(torch.tensor([{seq}]), gamma={gamma}, vocab_size={V})"
        out = call(ngram_draft, torch.tensor([seq]), gamma, V)
        check(isinstance(out, (tuple, list)) and len(out) == 2,
              f"{case} should return two lists (draft_tokens, draft_probs), got {out!r}")
        tokens, probs = out
        try:
            tokens = [int(t) for t in tokens]
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"{case}: draft_tokens should be a list of token ids (ints), got {tokens!r}") from None
        want = _ngram_draft_reference(seq, gamma)
        if tokens != want:
            check(len(tokens) == gamma, f"{case} returned {len(tokens)} tokens {tokens}: return exactly gamma = "
                  f"{gamma}, filling with the last token ({seq[-1]}) where there is nothing to copy")
            key, T = seq[-1], len(seq)
            earlier = [j for j in range(T - 1) if seq[j] == key]
            after_first = [seq[j] if j < T else key for j in range(earlier[0] + 1, earlier[0] + 1 + gamma)] if earlier else None
            if len(earlier) > 1 and tokens == after_first:
                check(False, f"{case} = {tokens} copies after the FIRST occurrence of {key}; use the most recent "
                      "earlier one (scan from the right)")
            if tokens == [key] * gamma and earlier:
                check(False, f"{case} = {tokens} found no match, but {key} occurs earlier at position {earlier[-1]}: "
                      "the last token always matches itself, so search positions T-2 down to 0 only")
            if earlier and tokens == [seq[j] if j < T else key for j in range(earlier[-1], earlier[-1] + gamma)]:
                check(False, f"{case} = {tokens} starts with the matched token itself; copy the tokens AFTER the "
                      f"match (positions {earlier[-1] + 1}, {earlier[-1] + 2}, ...)")
            check(False, f"{case} = {tokens}, expected {want}: find the most recent earlier position of the last "
                  "token, copy the gamma tokens after it, and propose the last token where the text runs out")
        check(isinstance(probs, (list, tuple)) and len(probs) == gamma,
              f"{case}: draft_probs should be a list of gamma = {gamma} distributions, got {type(probs).__name__}")
        for i, (t, q) in enumerate(zip(tokens, probs)):
            q = torch.as_tensor(q)
            check(tuple(q.shape) == (1, V), f"{case}: draft_probs[{i}] has shape {list(q.shape)}; each q is [1, "
                  f"vocab_size] = [1, {V}], like one row of a model's probabilities")
            check(q.is_floating_point(), f"{case}: draft_probs[{i}] is {q.dtype}; probabilities are floats")
            check(float(q[0, t]) == 1.0 and float(q.sum()) == 1.0, f"{case}: draft_probs[{i}] should be one-hot "
                  f"on the proposed token {t} (1 there, 0 elsewhere): a deterministic drafter proposes it with "
                  "probability 1")
    passed("exercise 1: ngram_draft copies after the most recent earlier match, falls back to the last token, "
           "and gives one-hot q's for the chain verifier")


def _jacobi_reference(target, ids: Tensor, guess: Tensor) -> list[int]:
    T = ids.shape[1]
    return target(torch.cat([ids, guess[None]], 1)).logits[0, T - 1:T - 1 + len(guess)].argmax(-1).tolist()


def check_jacobi_iteration(jacobi_iteration: Callable) -> None:
    """Exercise 07.2: jacobi_iteration(target, ids [1, T], guess [N]) -> the updated guess [N]."""
    with _one_thread(), torch.no_grad():
        target = _tiny_pair(seed=5)[0]
        for T, N, seed in [(5, 4, 0), (1, 3, 1), (12, 6, 2), (7, 1, 3)]:
            g = _generator(90 + seed)
            ids, guess = torch.randint(0, 211, (1, T), generator=g), torch.randint(0, 211, (N,), generator=g)
            case = f"a {T}-token prompt and a guess of N = {N} tokens"
            out = call(jacobi_iteration, target, ids, guess.clone())
            out = torch.as_tensor(out)
            check(out.dim() >= 1 and out.shape[-1] == N and out.numel() == N and not out.is_floating_point(),
                  f"{case}: return N = {N} token ids (the argmax at each slot), got {out.dtype} {list(out.shape)}")
            got, want = out.reshape(-1).tolist(), _jacobi_reference(target, ids, guess)
            if got == want:
                continue
            logits = target(torch.cat([ids, guess[None]], 1)).logits[0]  # [T+N, V]
            check(got != logits[T:T + N].argmax(-1).tolist(), f"{case}: you read rows T..T+N-1 of the logits; row "
                  "T-1 (the last prompt token) predicts slot 0, so slot i comes from row T-1+i")
            greedy, x = [], ids
            for _ in range(N):
                greedy.append(int(target(x).logits[0, -1].argmax()))
                x = torch.cat([x, torch.tensor([[greedy[-1]]])], 1)
            check(got != greedy, f"{case}: you decoded N tokens one after another (greedy decoding); a Jacobi "
                  "iteration updates all N slots at once, each from the OLD guess before it, in one forward pass")
            check(got != target(guess[None]).logits[0].argmax(-1).tolist(), f"{case}: the model must read the "
                  "prompt too: feed torch.cat([ids, guess]), not the guess alone")
            check(False, f"{case}: got {got}, expected {want}: slot i is the argmax after ids and guess[:i]")
    passed("exercise 2: one Jacobi iteration updates every slot in parallel from the previous guess")


def _pool_reference(pool: dict, ngram: tuple, guesses: int) -> None:
    kept = pool.setdefault(ngram[0], [])
    if tuple(ngram[1:]) in kept:
        kept.remove(tuple(ngram[1:]))
    kept.append(tuple(ngram[1:]))
    del kept[:-guesses]


def check_pool_update(pool_update: Callable) -> None:
    """Exercise 07.3: pool_update(pool, ngram, guesses) updates {first token: [continuations, oldest first]}."""
    stream = [(1, 2, 3), (4, 5, 6), (1, 7, 8), (1, 2, 3), (1, 9, 9), (4, 5, 6), (1, 7, 8), (1, 6, 6), (2, 1, 1)]
    for guesses in (2, 3, 1):
        pool, want = {}, {}
        for step, ngram in enumerate(stream):
            before = {k: list(v) for k, v in pool.items()}
            out = call(pool_update, pool, ngram, guesses)
            pool = out if isinstance(out, dict) else pool
            _pool_reference(want, ngram, guesses)
            got = {k: [tuple(c) for c in v] for k, v in pool.items()}
            if got == want:
                continue
            case = f"guesses = {guesses}: pool {before}, then pool_update(pool, {ngram})"
            key, rest = ngram[0], tuple(ngram[1:])
            kept = got.get(key, [])
            check(key in got, f"{case}: nothing stored under the first token {key}")
            check(tuple(ngram) not in kept, f"{case} stored {tuple(ngram)} under {key}; store the continuation "
                  f"ngram[1:] = {rest}, the key is already its first token")
            check(kept.count(rest) <= 1, f"{case} gives {kept}: {rest} was already stored; move it to the most recent "
                  "end instead of storing it twice")
            check(len(kept) <= guesses, f"{case} gives {kept}: keep at most guesses = {guesses} continuations per "
                  "first token; drop the least recently seen")
            check(not kept or kept[-1] == rest, f"{case} gives {kept}: {rest} was just seen, so it is the most "
                  "recent and goes last (also when it was already stored: move it)")
            check(False, f"{case} gives {kept}, expected {want[key]}: when a key holds more than guesses = "
                  f"{guesses}, drop the LEAST recently seen one (the first in the list), not the newest")
    passed("exercise 3: the pool keeps the G most recently seen continuations per first token")


# ---- chapter 05: Medusa ---------------------------------------------------------------------------


def check_medusa_head(Head: Callable[[int], torch.nn.Module]) -> None:
    """Exercise 05.1: Head(hidden) maps h [.., H] to h + SiLU(W h + b), with W and b zero at initialisation."""
    import torch.nn.functional as F

    head = call(Head, 16)
    check(isinstance(head, torch.nn.Module), f"Head(16) should return an nn.Module, got {type(head).__name__}")
    h = torch.randn(3, 5, 16, generator=_generator(0))  # [B, T, H]
    out = call(head, h)
    check(isinstance(out, Tensor) and out.shape == h.shape,
          f"the head must keep the shape [B, T, H] = {list(h.shape)}, got {getattr(out, 'shape', out)}")
    check(not torch.allclose(out, torch.zeros_like(h), atol=1e-6), "a fresh head returns zeros: the output lacks "
          "the residual; return h + SiLU(W h + b)")
    check(torch.allclose(out, h, atol=1e-6), "a fresh head must return h unchanged (zero-initialise the Linear's "
          "weight AND bias): it then starts from the target's own prediction instead of noise")
    linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    check(len(linears) == 1 and linears[0].in_features == linears[0].out_features == 16,
          "the residual block has one Linear(hidden, hidden); the LM head is applied after it, not inside")
    with torch.no_grad():
        linears[0].weight.copy_(torch.randn(16, 16, generator=_generator(1)) * 0.3)
        linears[0].bias.copy_(torch.randn(16, generator=_generator(2)) * 0.3)
    want = h + F.silu(linears[0](h))
    out = call(head, h)
    if not torch.allclose(out, want, atol=1e-5):
        check(not torch.allclose(out, F.silu(linears[0](h)), atol=1e-5),
              "the output lacks the residual: return h + SiLU(W h + b), not SiLU(W h + b)")
        check(not torch.allclose(out, h + linears[0](h), atol=1e-5), "apply SiLU to W h + b before adding h")
        check(False, "with trained weights the head should return h + SiLU(W h + b)")
    a, b = call(Head, 16), call(Head, 16)
    check(a.state_dict().keys() == b.state_dict().keys() and all(
        x.data_ptr() != y.data_ptr() for x, y in zip(a.parameters(), b.parameters())),
        "two heads must not share parameters (build a new Linear in each Head)")
    passed("exercise 1: a Medusa head is h + SiLU(W h + b), the identity at initialisation")


def check_medusa_loss(medusa_loss: Callable[[Tensor, Tensor], list]) -> None:
    """Exercise 05.2: per-head cross-entropy, head k at position t against labels[:, t + k + 2]."""
    from specdec_lab.medusa import head_loss

    g = _generator(3)
    logits = torch.randn(3, 2, 11, 13, generator=g)  # [K, B, T, V]
    labels = torch.randint(0, 13, (2, 11), generator=g)  # [B, T]
    got = call(medusa_loss, logits, labels)
    check(isinstance(got, (list, tuple)) and len(got) == 3,
          f"medusa_loss should return one loss per head (a list of 3 here), got {got!r}")
    got = [float(x) for x in got]
    _, want = head_loss(logits, labels)
    for k in range(3):
        if abs(got[k] - want[k]) > 1e-4:
            for shift in (0, 1, k + 1, k + 3):
                pred = logits[k, :, : 11 - shift] if shift else logits[k]
                wrong = torch.nn.functional.cross_entropy(pred.reshape(-1, 13), labels[:, shift:].reshape(-1)).item()
                check(abs(got[k] - wrong) > 1e-4, f"head {k}: your loss matches a label shift of {shift}; head k "
                      f"predicts the token k + 2 places ahead (the target's own head predicts 1 ahead), so "
                      f"position t is scored against labels[:, t + {k + 2}]")
            check(False, f"head {k}: loss {got[k]:.4f}, expected {want[k]:.4f} (mean cross-entropy over the positions "
                  f"that have a label, t < T - {k + 2})")
    passed("exercise 2: head k is trained on the token k + 2 positions ahead")


def check_candidate_tree(candidate_tree: Callable) -> None:
    """Exercise 05.3: candidate_tree(top, choices) -> (tokens, parents) from each head's top-k list."""
    from specdec_lab.tree import choices_parents

    top = [[11, 12, 13], [21, 22, 23], [31, 32, 33]]  # head k's ranked guesses
    cases = [[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)],
             [(0,), (1,), (2,), (0, 0), (2, 1), (2, 1, 2)],
             [(0,), (0, 0), (0, 0, 0)]]
    for choices in cases:
        got = call(candidate_tree, top, choices)
        check(isinstance(got, (tuple, list)) and len(got) == 2, f"return (tokens, parents), got {got!r}")
        tokens, parents = [list(map(int, x)) for x in got]
        want_tokens = [top[len(c) - 1][c[-1]] for c in choices]
        want_parents = choices_parents(choices)
        if tokens != want_tokens:
            check(tokens != [top[c[-1]][len(c) - 1] for c in choices], f"choices {choices}: the tokens look "
                  "transposed: a path of length d + 1 ends at head d, so its token is top[d][rank]")
            check(False, f"choices {choices}: tokens {tokens}, expected {want_tokens} (node (i0, .., id) takes head "
                  "d's id-th best token)")
        check(parents == want_parents, f"choices {choices}: parents {parents}, expected {want_parents} (the parent "
              "of path c is the index of path c[:-1] in choices, -1 for a one-element path)")
    passed("exercise 3: each node takes its head's ranked token; its parent is the path one shorter")


# ---- chapter 04: tree drafts and tree attention ------------------------------------------------------


def _depths(parents: list[int]) -> list[int]:
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def _ancestor_mask(parents: list[int]) -> Tensor:
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def _random_tree(n: int, g: torch.Generator) -> list[int]:
    return [int(torch.randint(-1, i, (1,), generator=g)) if i else -1 for i in range(n)]


def check_mask_positions(mask_and_positions: Callable) -> None:
    """Exercise 04.1: mask_and_positions(parents, offset) -> (mask [n, n] bool, positions [n])."""
    g = _generator(40)
    cases = [([-1, 0, 1], 0), ([-1, 0, 0, 1, 1, 2], 10), ([-1, -1, -1], 4), ([-1, -1, 0, 0, 1, 1, 2, 3], 25),
             ([-1, 0, 1, 1, 0, 4], 3)] + [(_random_tree(n, g), 7) for n in (9, 14, 20)]
    for parents, offset in cases:
        case = f"parents = {parents}, offset = {offset}"
        out = call(mask_and_positions, list(parents), offset)
        check(isinstance(out, (tuple, list)) and len(out) == 2,
              f"mask_and_positions should return two tensors (mask, positions), got {out!r}")
        mask, positions = (torch.as_tensor(x) for x in out)
        n = len(parents)
        want = _ancestor_mask(parents)
        depth = torch.tensor(_depths(parents))
        check(tuple(mask.shape) == (n, n), f"{case}: the mask should be [n, n] = [{n}, {n}], got {list(mask.shape)}")
        mask = mask.bool()
        if not torch.equal(mask, want):
            eye = torch.eye(n, dtype=torch.bool)
            check(not torch.equal(mask, want.T), f"{case}: your mask is transposed: row i must be what node i "
                  "attends to (its ancestors and itself), not the nodes that attend to it")
            check(not torch.equal(mask, want & ~eye), f"{case}: the diagonal is missing: a node attends to itself")
            check(not torch.equal(mask, torch.ones(n, n, dtype=torch.bool).tril()),
                  f"{case}: that is a causal mask: node i would see every node before it, siblings and cousins "
                  "included; it may see only its ancestors and itself")
            parent_only = eye.clone()
            for i, p in enumerate(parents):
                if p >= 0:
                    parent_only[i, p] = True
            check(not torch.equal(mask, parent_only), f"{case}: node i sees only itself and its parent; it must "
                  "see ALL its ancestors (the parent's parent too, up to the first level)")
            i, j = ((mask != want).nonzero()[0]).tolist()
            check(False, f"{case}: mask[{i}, {j}] is {bool(mask[i, j])}, expected {bool(want[i, j])} (node {j} "
                  f"{'is' if want[i, j] else 'is not'} node {i} or an ancestor of it)")
        check(positions.dim() == 1 and len(positions) == n, f"{case}: positions should be [n] = [{n}], got shape "
              f"{list(positions.shape)}")
        positions = positions.long()
        if not torch.equal(positions, offset + depth):
            check(not torch.equal(positions, offset + torch.arange(n)), f"{case}: positions {positions.tolist()} "
                  "are the flattened indices; a node's position is offset + its depth (siblings share a position)")
            check(not torch.equal(positions, depth) or offset == 0, f"{case}: positions {positions.tolist()} are "
                  "the depths; add the prefix length `offset`")
            check(not torch.equal(positions, offset + depth + 1), f"{case}: positions {positions.tolist()} are one "
                  "too high: a child of the committed text (parent -1) has depth 0 and sits at position `offset`")
            check(False, f"{case}: positions {positions.tolist()}, expected {(offset + depth).tolist()} (offset + depth)")
    passed(f"exercise 1: tree mask (ancestors and self) and positions (offset + depth) right on {len(cases)} trees")


def _greedy_tree_case(parents: list[int], g: torch.Generator, vocab: int = 12, follow: float = 0.8):
    """Distinct sibling tokens and logits whose argmax often (`follow`) matches one of a node's children."""
    n = len(parents)
    children = [[c for c in range(n) if parents[c] == i] for i in range(n)]
    tokens = [int(torch.randint(0, vocab, (1,), generator=g))] + [0] * (n - 1)
    for i in range(n):
        picks = torch.randperm(vocab, generator=g)[: len(children[i])].tolist()
        for c, t in zip(children[i], picks):
            tokens[c] = t
    logits = torch.randn(n, vocab, generator=g)
    for i in range(n):
        if children[i] and float(torch.rand(1, generator=g)) < follow:
            c = children[i][int(torch.randint(0, len(children[i]), (1,), generator=g))]
            logits[i, tokens[c]] = 5.0  # the target agrees with child c
    return tokens, logits


def _walk_tree(parents: list[int], tokens: list[int], best: list[int], after: list[int] | None):
    """The greedy walk; after=None compares each child with the argmax of its own row (a typical mistake)."""
    path = [0]
    while True:
        node = path[-1]
        match = [c for c in range(len(parents)) if parents[c] == node
                 and tokens[c] == (after[node] if after is not None else best[c])]
        if not match:
            return path, best[node]
        path.append(match[0])


def check_verify_tree_greedy(verify_tree_greedy: Callable) -> None:
    """Exercise 04.2: verify_tree_greedy(parents, tokens, target_logits) -> (path, bonus)."""
    g = _generator(41)
    shapes = [[-1, 0, 0, 1, 1, 2, 2], [-1, 0, 1, 2, 3], [-1, 0, 0, 0, 1, 2, 3, 4, 5, 6]]
    shapes += [[-1] + [p + 1 for p in _random_tree(n, g)] for n in (8, 12, 16, 20, 25)]
    cases = [(parents, *_greedy_tree_case(parents, g)) for parents in shapes for _ in range(4)]
    # exercise 04.2's worked example by hand: the target predicts 8 after the root, 3 after node 2, 4 after node 4
    hand_logits = torch.full((6, 10), -1.0)
    for node, best in [(0, 8), (1, 2), (2, 3), (3, 0), (4, 4), (5, 5)]:
        hand_logits[node, best] = 1.0
    cases.insert(0, ([-1, 0, 0, 1, 2, 2], [0, 7, 8, 1, 3, 9], hand_logits))
    deepest = 0
    for parents, tokens, logits in cases:
        case = f"parents = {parents}, tokens = {tokens}"
        out = call(verify_tree_greedy, list(parents), list(tokens), logits.clone())
        check(isinstance(out, (tuple, list)) and len(out) == 2,
              f"{case}: verify_tree_greedy should return (path, bonus), got {out!r}")
        path, bonus = out
        path = [int(i) for i in path]
        best = logits.argmax(-1).tolist()
        right, own_row = _walk_tree(parents, tokens, best, best), _walk_tree(parents, tokens, best, None)
        check((path, int(bonus)) == right or (path, int(bonus)) != own_row, f"{case}: you compare each child's "
              "token with the argmax of ITS OWN row; row i predicts the token AFTER node i, so compare a child's "
              "token with the argmax of its parent's row")
        check(len(path) > 0 and path[0] == 0, f"{case}: the path {path} should start at the root, node 0 (the "
              "committed token)")
        for a, b in zip(path, path[1:]):
            check(parents[b] == a, f"{case}: path {path} goes from node {a} to node {b}, which is not its child: "
                  "only a child of the last accepted node can be accepted")
            if tokens[b] != best[a]:
                check(tokens[b] != best[b], f"{case}: you accepted node {b} because its token equals the argmax of "
                      f"ITS OWN row; row i predicts the token AFTER node i, so compare a child's token with the "
                      f"argmax of its parent's row ({a})")
                check(False, f"{case}: node {b} (token {tokens[b]}) was accepted, but the target's argmax after "
                      f"node {a} is {best[a]}: accept a child only if its token equals that argmax")
        last = path[-1]
        match = [c for c in range(len(parents)) if parents[c] == last and tokens[c] == best[last]]
        check(not match, f"{case}: your path {path} stops at node {last}, but its child {match[0] if match else ''} "
              f"carries the target's argmax {best[last]} after node {last}: keep walking down while a child matches "
              "(row i of target_logits predicts the token after node i)")
        check(int(bonus) == best[last], f"{case}: bonus {int(bonus)}; it should be the target's argmax after the "
              f"deepest accepted node {last}, which is {best[last]}"
              + (" (you took it at the root)" if int(bonus) == best[0] else ""))
        deepest = max(deepest, len(path) - 1)
    passed(f"exercise 2: greedy tree verification right on {len(cases)} trees (up to {deepest} drafts accepted)")


def check_tree_size(count_nodes: Callable[[list[int]], int], verify_cost: Callable[[list[int], int], float]) -> None:
    """Exercise 04.3: node count of a branching; a verify pass's cost at a batch size."""
    import math

    from specdec_lab.economics import QWEN25_7B_ON_H100 as gpu

    for branching in ([2, 2, 1, 1], [3, 3, 2], [1, 1, 1, 1], [4], [2, 3, 1, 2], [1, 5, 1]):
        got = call(count_nodes, list(branching))
        widths = [math.prod(branching[: l + 1]) for l in range(len(branching))]
        want = sum(widths)
        if got != want:
            check(got != want + 1, f"count_nodes({branching}) = {got} counts the root; count draft nodes only")
            check(got != widths[-1], f"count_nodes({branching}) = {got} counts only the last level; add every level")
            check(got != sum(branching), f"count_nodes({branching}) = {got} is the sum of the branching factors; "
                  "level l has b0·b1·…·bl nodes (every node of the level above has bl children)")
            check(False, f"count_nodes({branching}) = {got}, expected {want} (levels of {widths} nodes)")
    for branching, batch in [([2, 2, 1, 1], 1), ([2, 2, 1, 1], 64), ([3, 3, 2], 64), ([1, 1, 1, 1], 128),
                             ([3, 3, 2], 256), ([4, 2], 16)]:
        n = sum(math.prod(branching[: l + 1]) for l in range(len(branching)))
        got = float(call(verify_cost, list(branching), batch))
        want = gpu.step_time(batch, 1 + n) / gpu.step_time(batch, 1)
        if abs(got - want) > 1e-3 * want:
            case = f"verify_cost({branching}, batch={batch}) = {got:.4g}"
            check(abs(got - gpu.step_time(batch, n) / gpu.step_time(batch, 1)) > 1e-6, f"{case}: the pass also "
                  "reads the pending token (node 0): 1 + nodes tokens per request")
            check(abs(got - gpu.step_time(batch, 1) / gpu.step_time(batch, 1 + n)) > 1e-6, f"{case} is upside "
                  "down: divide the pass's time by the decode step's")
            check(abs(got - gpu.step_time(batch, batch * (1 + n)) / gpu.step_time(batch, 1)) > 1e-6, f"{case}: "
                  "step_time(batch, tokens_per_request) already multiplies by the batch; pass 1 + nodes per request")
            check(False, f"{case}, expected {want:.4g} = step_time(batch, 1 + nodes) / step_time(batch, 1)")
    passed("exercise 3: [2, 2, 1, 1] has 14 nodes, [3, 3, 2] has 30; at batch 64 verifying them costs "
           f"{gpu.step_time(64, 15) / gpu.step_time(64, 1):.1f} and {gpu.step_time(64, 31) / gpu.step_time(64, 1):.1f} "
           "decode steps")


# Exercise 4's distributions (notebook 04's Monte Carlo uses the same pair; the exercise notebook shows neither).
MULTI_P = [0.35, 0.25, 0.2, 0.12, 0.08]
MULTI_Q = [0.05, 0.45, 0.3, 0.05, 0.15]


def _two_round_outcomes(p: Tensor, q: Tensor) -> dict[str, Tensor]:
    """Exact output distributions of the right rule and of typical wrong ones, two candidates drawn from q."""
    r1 = _residual(p, q)
    first = torch.minimum(p, q)  # P(round 1 emits x) = q(x) min(1, p(x)/q(x))
    miss1 = 1 - first.sum()
    second = torch.minimum(r1, q)
    miss2 = 1 - second.sum()
    return {
        "naive": first + miss1 * first + miss1 ** 2 * r1,  # both against p, then residual(p, q)
        "fallback p": first + miss1 * (second + miss2 * p),
        "fallback first residual": first + miss1 * (second + miss2 * r1),
    }


def check_multi_round(multi_round: Callable) -> None:
    """Exercise 04.4: multi_round(p, q, x1, x2, generator) -> token; x1, x2 drawn i.i.d. from q; exact for p."""
    g = _generator(42)
    flat = torch.full((4,), 0.25)
    for _ in range(50):
        x1, x2 = torch.multinomial(flat, 2, replacement=True, generator=g).tolist()
        got = _token(multi_round, flat, flat, x1, x2, g)
        check(got == x1, f"p == q == {fmt(flat)}, candidates ({x1}, {x2}): returned {got}. When p == q the first "
              "candidate always passes u·q(x) < p(x), so return x1")
    p, q = torch.tensor(MULTI_P), torch.tensor(MULTI_Q)
    for _ in range(50):  # token 0: p(0) = 0.35 > q(0) = 0.05, always accepted in round 1
        got = _token(multi_round, p, q, 0, 1, g)
        check(got == 0, f"p = {MULTI_P}, q = {MULTI_Q}, candidates (0, 1): returned {got}, but p(0) > q(0), so "
              "the first candidate is always accepted")
    draws = 20_000
    xs = torch.multinomial(q, 2 * draws, replacement=True, generator=g).view(draws, 2).tolist()
    out = [_token(multi_round, p, q, x1, x2, g) for x1, x2 in xs]
    counts = counts_of(out, len(p))
    _, pvalue = chi_square(counts, p)
    if pvalue < P_VALUE_MIN:
        freq = fmt((counts / draws).tolist())
        for name, dist in _two_round_outcomes(p, q).items():
            if chi_square(counts, dist)[1] > 1e-3:
                hint = {
                    "naive": "you tested the second candidate against the ORIGINAL p: after x1 is rejected, the "
                             "target becomes r = residual(p, q), and x2 must pass u·q(x2) < r(x2)",
                    "fallback p": "when both candidates are rejected, draw from the residual of the residual, "
                                  "residual(residual(p, q), q), not from p",
                    "fallback first residual": "when both candidates are rejected, draw from what round 2 leaves, "
                                               "residual(r, q) with r = residual(p, q), not from r itself",
                }[name]
                check(False, f"over {draws} draws your tokens have frequencies {freq}, p is {MULTI_P} "
                      f"(chi-square p-value {pvalue:.2g}): {hint}")
        check(False, f"over {draws} draws your tokens have frequencies {freq}, not distributed as p = {MULTI_P} "
              f"(chi-square p-value {pvalue:.2g}). Round 1: accept x1 if u·q(x1) < p(x1); else p <- "
              "residual(p, q); round 2 the same with the new p; both rejected: draw from the last residual")
    passed(f"exercise 4: over {draws} draws the emitted token follows p (chi-square p-value {pvalue:.2f})")


# ---- chapter 06: EAGLE -------------------------------------------------------------------------------


def _eagle_case(version: int = 1, seed: int = 0):
    """A random 2-layer Llama target (vocab 50, hidden 32) and an EagleNet with random weights for it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_lab.eagle import EagleNet

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    target = LlamaForCausalLM(config).eval()
    net = EagleNet(target, version, heads=4, mlp=48)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=_generator(seed + 1)) * 0.2)
    return target, net.eval()


def check_eagle_forward(eagle_forward: Callable) -> None:
    """Exercise 06.1: eagle_forward(net, feature [B, T, H], tokens [B, T]) -> (out [B, T, H], logits [B, T, V])."""
    target, net = _eagle_case()
    g = _generator(5)
    feature = torch.randn(2, 6, 32, generator=g)  # [B, T, H]
    tokens = torch.randint(0, 50, (2, 6), generator=g)  # [B, T] the token after each position
    with torch.no_grad():
        got = call(eagle_forward, net, feature, tokens)
        want_out = net(feature, tokens, torch.arange(6))
        want_logits = net.logits(want_out)
    check(isinstance(got, (tuple, list)) and len(got) == 2, f"return (out, logits), got {type(got).__name__}")
    out, logits = got
    check(isinstance(out, Tensor) and out.shape == (2, 6, 32),
          f"out should be [B, T, H] = [2, 6, 32], got {getattr(out, 'shape', out)}")
    check(isinstance(logits, Tensor) and logits.shape == (2, 6, 50),
          f"logits should be [B, T, V] = [2, 6, 50] (the target's LM head over out), got {getattr(logits, 'shape', logits)}")
    if not torch.allclose(out, want_out, atol=1e-4):
        with torch.no_grad():
            swapped = net.layer(net.fc(torch.cat([feature, net._embed(tokens)], -1)), torch.arange(6))
            no_layer = net.fc(torch.cat([net._embed(tokens), feature], -1))
        check(not torch.allclose(out, swapped, atol=1e-4), "you concatenated [feature, embedding]: the fc was "
              "trained on [embed(tokens), feature], in that order (torch.cat([..], dim=-1))")
        check(not torch.allclose(out, no_layer, atol=1e-4), "out is fc's output: run it through net.layer(x, "
              "positions) too, with positions = torch.arange(T)")
        check(False, "out differs from net.layer(net.fc(cat([embed(tokens), feature], -1)), arange(T)); "
              "check the concatenation dim (-1) and the positions")
    check(torch.allclose(logits, want_logits, atol=1e-4), "logits must be the target's LM head over out "
          "(net.logits(out)), not over the feature or fc's output")
    passed("exercise 1: fc([embed(next token), feature]) -> one decoder layer -> the target's LM head")


def check_expand(expand: Callable) -> None:
    """Exercise 06.2: expand(scores [m], logp [m, V], k) -> the k best children (rows, tokens, scores), best first."""
    from specdec_lab.eagle import expand_step

    g = _generator(6)
    for m, V, k in [(1, 10, 3), (3, 12, 3), (4, 9, 2)]:
        scores = -torch.rand(m, generator=g) * 3  # [m] cumulative log-probs of the frontier
        logp = torch.log_softmax(torch.randn(m, V, generator=g) * 2, -1)  # [m, V]
        got = call(expand, scores, logp, k)
        check(isinstance(got, (tuple, list)) and len(got) == 3, f"return (rows, tokens, scores), got {got!r}")
        rows, tokens, sc = (torch.as_tensor(x).reshape(-1) for x in got)
        w_rows, w_tokens, w_sc = (x[:k] for x in expand_step(scores, logp, k))
        check(len(rows) == len(tokens) == len(sc) == k, f"m={m}, k={k}: keep exactly k = {k} children in all "
              f"(the best of the m * k candidates), got {len(rows)}, {len(tokens)}, {len(sc)}")
        if not torch.allclose(sc.double(), w_sc.double(), atol=1e-5):
            own = logp.reshape(-1).topk(k).values
            check(not torch.allclose(sc.double(), own.double(), atol=1e-5), f"m={m}: the scores are the children's own "
                  "log-probs: add each parent's score (the cumulative log-prob of the whole path)")
            check(False, f"m={m}, k={k}: scores {sc.tolist()}, expected {w_sc.tolist()} (parent score + child "
                  "log-prob, best first)")
        check(rows.tolist() == w_rows.tolist() and tokens.tolist() == w_tokens.tolist(),
              f"m={m}, k={k}: (rows, tokens) {list(zip(rows.tolist(), tokens.tolist()))}, expected "
              f"{list(zip(w_rows.tolist(), w_tokens.tolist()))}: rows index the frontier, tokens the vocabulary")
    passed("exercise 2: children scored by cumulative log-prob; the k best of m * k kept")


def check_ttt_unroll(ttt_unroll: Callable) -> None:
    """Exercise 06.3: ttt_unroll(net, feature [B, T, H], tokens [B, T], steps) -> outputs of every unrolled step."""
    from specdec_lab.eagle import KVCache, ttt_mask, unroll

    _, net = _eagle_case(version=3, seed=2)
    g = _generator(7)
    feature = torch.randn(1, 7, 32, generator=g)
    tokens = torch.randint(0, 50, (1, 7), generator=g)
    with torch.no_grad():
        got = call(ttt_unroll, net, feature, tokens, 3)
        want = unroll(net, feature, tokens, 3)
    check(isinstance(got, (list, tuple)) and len(got) == 3, f"return a list with one [B, T, H] output per step "
          f"(3 here), got {type(got).__name__} of length {len(got) if hasattr(got, '__len__') else '?'}")
    check(all(isinstance(o, Tensor) and o.shape == (1, 7, 32) for o in got), "each step's output is [B, T, H]")
    check(torch.allclose(got[0], want[0], atol=1e-4), "step 0 is the ordinary causal pass over the TRUE features "
          "(positions arange(T), mask ttt_mask(T, 0))")
    if not torch.allclose(got[1], want[1], atol=1e-4):
        with torch.no_grad():
            cache = KVCache()
            net(feature, tokens, torch.arange(7), ttt_mask(7, 0), cache)
            no_shift = net(want[0], tokens, torch.arange(7), ttt_mask(7, 1), cache)
            fresh = net(torch.cat([torch.zeros_like(want[0][:, :1]), want[0][:, :-1]], 1), tokens, torch.arange(7))
            cache = KVCache()
            net(feature, tokens, torch.arange(7), ttt_mask(7, 0), cache)
            shifted_true = net(torch.cat([torch.zeros_like(feature[:, :1]), feature[:, :-1]], 1), tokens,
                               torch.arange(7), ttt_mask(7, 1), cache)
        check(not torch.allclose(got[1], shifted_true, atol=1e-4), "step 1 reads the TRUE features shifted: feed the "
              "draft's own outputs of the previous step instead, as drafting must (that is the training-time test)")
        check(not torch.allclose(got[1], no_shift, atol=1e-4), "step 1 feeds position p the output at p - 1 (the "
              "feature the draft predicted for p): shift the previous outputs right by one, zeros at position 0")
        check(not torch.allclose(got[1], fresh, atol=1e-4), "step 1 ran without the cache of step 0: keep ONE KVCache "
              "for all steps and pass ttt_mask(T, i), so a drafted position sees the true features before it")
        check(False, "step 1 differs: input = previous step's outputs shifted right by one (zeros first), same "
              "tokens and positions, mask ttt_mask(T, 1), the same cache")
    check(torch.allclose(got[2], want[2], atol=1e-4), "step 2 differs: each step reads the step before it, not the "
          "true features or step 0")
    passed("exercise 3: each unrolled step reads the draft's own previous outputs, as drafting does")


# ---- chapter 08: the showdown ---------------------------------------------------------------------------


def _showdown_records(seed: int, baseline: str) -> list[dict]:
    """A benchmark's per-prompt records: every method on every prompt, prompts of uneven length, categories
    whose prompts differ in speed (long edit contexts make every step slower), in a shuffled order."""
    import math
    import random

    rng = random.Random(seed)
    step = {"code": 0.011, "edit": 0.019, "doc": 0.014}  # seconds per plain decoding step, per category
    methods = {baseline: 1.0, "draft model γ=4": 2.6, "prompt lookup": 2.1, "EAGLE-2": 3.3}  # typical τ
    overhead = {baseline: 0.0, "draft model γ=4": 0.45, "prompt lookup": 0.02, "EAGLE-2": 0.2}  # draft cost
    records = []
    for category, t in step.items():
        for _ in range(rng.randint(2, 4)):
            length = rng.choice([12, 40, 96, 160, 256])  # new tokens of this prompt
            for method, tau in methods.items():
                tau_here = 1.0 if tau == 1.0 else max(1.05, tau * rng.uniform(0.5, 1.5))
                if category == "edit" and method == "prompt lookup":
                    tau_here *= 1.6  # edits copy from the prompt
                calls = length if tau == 1.0 else math.ceil(length / tau_here)
                seconds = calls * t * (1 + overhead[method]) * rng.uniform(0.85, 1.2)
                records.append({"method": method, "category": category, "tokens": length,
                                "target_calls": calls, "seconds": round(seconds, 5)})
    rng.shuffle(records)
    return records


def _summary_reference(records: list[dict], baseline: str, mean_of_ratios: bool = False) -> dict:
    """{(method, category or "all"): {"tau", "tokens_per_s", "speedup"}}; speedup over the baseline's
    tokens/s in the same category. mean_of_ratios: the mistake, per-prompt ratios averaged."""
    groups: dict = {}
    for r in records:
        for cat in (r["category"], "all"):
            groups.setdefault((r["method"], cat), []).append(r)
    out = {}
    for key, rs in groups.items():
        if mean_of_ratios:
            tau = sum(r["tokens"] / r["target_calls"] for r in rs) / len(rs)
            tps = sum(r["tokens"] / r["seconds"] for r in rs) / len(rs)
        else:
            tau = sum(r["tokens"] for r in rs) / sum(r["target_calls"] for r in rs)
            tps = sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
        out[key] = {"tau": tau, "tokens_per_s": tps}
    for (method, cat), row in out.items():
        row["speedup"] = row["tokens_per_s"] / out[(baseline, cat)]["tokens_per_s"]
    return out


def _near(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def check_summarize(summarize: Callable) -> None:
    """Exercise 08.1: summarize(records, baseline) -> {(method, category): {"tau", "tokens_per_s", "speedup"}},
    ratios of sums, "all" included, speedup = tokens/s over the baseline's tokens/s in the same category."""
    for seed, baseline in [(0, "target only"), (1, "plain decoding")]:
        records = _showdown_records(seed, baseline)
        shown = [dict(r) for r in records]  # the learner's function may not change the grader's copy
        how = "summarize(records)" if baseline == "target only" else f"summarize(records, baseline={baseline!r})"
        try:
            got = call(summarize, *((shown,) if baseline == "target only" else (shown, baseline)))
        except KeyError as e:
            if baseline != "target only":
                raise AssertionError(f"{how} raised KeyError({e}): use the `baseline` argument to find the "
                                     "baseline's rows, not the name 'target only'") from None
            raise
        want = _summary_reference(records, baseline)
        mean = _summary_reference(records, baseline, mean_of_ratios=True)
        check(isinstance(got, dict), f"{how} should return a dict keyed by (method, category), got "
              f"{type(got).__name__}")
        keys = set(got)
        methods = sorted({m for m, _ in want})
        if keys == {k for k in want if k[1] != "all"}:
            check(False, f"{how} has no category \"all\": add a (method, \"all\") entry for every method, from "
                  "all of its records together")
        check(keys == set(want), f"{how}: the keys should be (method, category) for the methods {methods} and "
              f"the categories {sorted({c for _, c in want})} (\"all\" included); got {sorted(keys, key=str)}")
        for key in sorted(want):
            row = got[key]
            check(isinstance(row, dict) and {"tau", "tokens_per_s", "speedup"} <= set(row),
                  f"{how}[{key}] should be a dict with \"tau\", \"tokens_per_s\" and \"speedup\", got {row!r}")
        for field, what, total in [("tau", "τ", "sum(tokens) / sum(target_calls)"),
                                   ("tokens_per_s", "tokens/s", "sum(tokens) / sum(seconds)")]:
            for key in sorted(want):
                g, w = float(got[key][field]), want[key][field]
                if _near(g, w):
                    continue
                check(not _near(g, mean[key][field]), f"{how}[{key}][{field!r}] = {g:.4g} is the mean of per-prompt "
                      f"ratios; a benchmark's {what} is the ratio of sums, {total} = {w:.4g}, so a 256-token "
                      "prompt weighs more than a 12-token one")
                check(False, f"{how}[{key}][{field!r}] = {g:.4g}, expected {total} = {w:.4g} over that method's "
                      "records in that category (all of its records for \"all\")")
        for key in sorted(want):
            method, cat = key
            g, w = float(got[key]["speedup"]), want[key]["speedup"]
            if _near(g, w):
                continue
            base_tau = want[(baseline, cat)]["tau"]
            check(not _near(g, want[key]["tau"] / base_tau), f"{how}[{key}]['speedup'] = {g:.4g} compares τ, not "
                  f"time: τ ignores what drafting costs; divide tokens/s by the baseline's tokens/s = {w:.4g}")
            check(not _near(g, 1 / w), f"{how}[{key}]['speedup'] = {g:.4g} is upside down: speedup = this "
                  f"method's tokens/s / the baseline's tokens/s = {w:.4g} (above 1 when the method is faster)")
            check(not _near(g, want[key]["tokens_per_s"] / want[(baseline, "all")]["tokens_per_s"]),
                  f"{how}[{key}]['speedup'] = {g:.4g} divides by the baseline's overall (\"all\") tokens/s; "
                  f"compare within the category: {cat} prompts run at their own pace, so use the baseline's "
                  f"({baseline!r}, {cat!r}) tokens/s, giving {w:.4g}")
            check(False, f"{how}[{key}]['speedup'] = {g:.4g}, expected {w:.4g} = tokens/s of {method!r} / "
                  f"tokens/s of {baseline!r}, both in {cat!r}")
    passed("exercise 1: summarize gives τ and tokens/s as ratios of sums and each speedup against the baseline "
           "in the same category, \"all\" included")


# (alpha, gamma, batches, v = verify cost per batch, c = draft cost per batch): v from the roofline of
# Qwen2.5-7B on an H100 (economics.QWEN25_7B_ON_H100, chapter 02), c rising a little with the batch (the draft's
# own steps stop being free too).
def _switch_off_cases() -> list[tuple]:
    from specdec_lab.economics import QWEN25_7B_ON_H100 as m

    wide = [1, 4, 16, 32, 48, 64, 96, 128, 256, 512]
    small = [1, 2, 4, 8, 16]

    def v(gamma, batches):
        return [round(m.verify_cost(gamma, b), 4) for b in batches]

    return [
        (0.8, 4, wide, v(4, wide), [0.05] * len(wide)),
        (0.8, 4, small, v(4, small), [0.05] * len(small)),  # pays at every batch: None
        (0.7, 3, wide, v(3, wide), [round(0.04 + 0.0004 * b, 4) for b in wide]),
        (1.0, 5, wide, v(5, wide), [0.03] * len(wide)),  # α = 1: γ + 1 tokens per pass
        (0.25, 2, wide, v(2, wide), [0.3] * len(wide)),  # off from the first batch
        (0.6, 6, [2, 8, 24, 40, 56, 80, 100, 160], v(6, [2, 8, 24, 40, 56, 80, 100, 160]), [0.12] * 8),
        (0.9, 2, [1, 2, 3, 5, 7, 9], [1.0, 1.1, 1.3, 1.6, 2.0, 2.5], [0.2, 0.2, 0.3, 0.4, 0.5, 0.6]),
    ]


def _switch_reference(batches, vs, cs, alpha, gamma, tokens=None, draft=True, last_paying=False, index=False):
    """The first batch with S < 1 (None if none); the keyword arguments make the wrong answers the hints name."""
    from specdec_lab.economics import expected_tokens

    e = expected_tokens(alpha, gamma) if tokens is None else tokens
    pays = [e / (v + (gamma * c if draft else 0)) >= 1 for v, c in zip(vs, cs)]
    first = next((i for i, p in enumerate(pays) if not p), None)
    if last_paying:
        last = [i for i, p in enumerate(pays) if p]
        return batches[last[-1]] if last else None
    if index:
        return first
    return None if first is None else batches[first]


def check_switch_off(switch_off_batch: Callable) -> None:
    """Exercise 08.2: the smallest batch where S = E[tokens] / (v + γ·c) < 1, or None when speculation pays
    at every batch."""
    from specdec_lab.economics import expected_tokens, speedup

    cases = _switch_off_cases()
    got, want = [], []
    for alpha, gamma, batches, vs, cs in cases:
        case = f"switch_off_batch({batches}, verify_cost={vs}, draft_cost={cs}, alpha={alpha}, gamma={gamma})"
        try:
            out = call(switch_off_batch, list(batches), list(vs), list(cs), alpha, gamma)
        except ZeroDivisionError:
            raise AssertionError(f"{case} divided by zero: at α = 1 every draft is accepted, so a pass yields "
                                 "γ + 1 tokens; the closed form (1 - α^(γ+1)) / (1 - α) is 0/0 there") from None
        check(out is None or (isinstance(out, int) and not isinstance(out, bool))
              or (hasattr(out, "__index__") and not isinstance(out, bool)),
              f"{case} should return a batch size (an int) or None, got {out!r}")
        got.append(None if out is None else int(out))
        want.append(_switch_reference(batches, vs, cs, alpha, gamma))
        assert all(abs(speedup(alpha, gamma, c, v) - 1) > 1e-6 for v, c in zip(vs, cs)), "a grader case has a tie"
    if got == want:
        passed(f"exercise 2: switch_off_batch finds where speculation stops paying on {len(cases)} hidden cases; "
               f"for Qwen2.5-7B on an H100 with α = 0.8, γ = 4, c = 0.05 that is batch {want[0]}")
        return
    wrong = [i for i in range(len(cases)) if got[i] != want[i]]
    variants = [
        ({"index": True}, "returned the index into batches; return the batch size itself, batches[i]"),
        ({"last_paying": True}, "is the LAST batch where speculation still pays; return the FIRST batch where "
         "S < 1, from which on it should be switched off"),
        ({"draft": False}, "forgets the draft's cost: a round costs v + γ·c target steps, not v"),
        ("bonus", "forgets the bonus token: a pass yields 1 + α + ... + α^γ tokens, (1 - α^(γ+1)) / (1 - α), "
         "the 1 being the token the target emits itself"),
    ]

    def answers(change):
        out = []
        for alpha, gamma, batches, vs, cs in cases:
            if change == "bonus":
                out.append(_switch_reference(batches, vs, cs, alpha, gamma, tokens=expected_tokens(alpha, gamma) - 1))
            else:
                out.append(_switch_reference(batches, vs, cs, alpha, gamma, **change))
        return out

    i = wrong[0]
    alpha, gamma, batches, vs, cs = cases[i]
    case = f"switch_off_batch({batches}, verify_cost={vs}, draft_cost={cs}, alpha={alpha}, gamma={gamma})"
    for change, hint in variants:  # first: the mistake that explains every answer, then this case alone
        if answers(change) == got:
            check(False, f"{case} = {got[i]}, expected {want[i]}: it {hint}")
    for change, hint in variants:
        if answers(change)[i] == got[i]:
            check(False, f"{case} = {got[i]}, expected {want[i]}: it {hint}")
    s = [round(speedup(alpha, gamma, c, v), 3) for v, c in zip(vs, cs)]
    check(False, f"{case} = {got[i]}, expected {want[i]}: the predicted speedups are {s}, S = E[tokens] / "
          "(v + γ·c); return the first batch with S < 1, or None")


def _max_eagle_nodes(topk: int, depth: int) -> int:
    """Nodes an EAGLE-2 pool can offer: topk at the first level, topk·topk at each later one."""
    return topk + (depth - 1) * topk * topk


def check_sglang_flags(sglang_flags: Callable) -> None:
    """Exercise 08.3: the course's EagleDrafter(dynamic=True, topk, depth, budget) as SGLang's three flags."""
    keys = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    valid = [(1, 3, 3), (4, 8, 24), (8, 5, 31), (2, 3, 10), (3, 1, 3), (1, 1, 1), (4, 6, 3), (2, 7, 13)]
    for topk, depth, budget in valid:
        case = f"sglang_flags(topk={topk}, depth={depth}, budget={budget})"
        try:
            got = call(sglang_flags, topk, depth, budget)
        except ValueError as e:
            raise AssertionError(f"{case} raised ValueError({e}), but that setting is possible: the pool holds "
                                 f"up to {topk} + ({depth} - 1)·{topk}·{topk} = {_max_eagle_nodes(topk, depth)} "
                                 "nodes" + (", and a chain of depth d has exactly d" if topk == 1 else "")) from None
        want = {keys[0]: depth, keys[1]: topk, keys[2]: budget + 1}
        check(isinstance(got, dict) and set(got) == set(keys), f"{case} should return a dict with exactly the "
              f"keys {list(keys)}, got {got!r}")
        check(all(isinstance(v, int) and not isinstance(v, bool) for v in got.values()),
              f"{case}: the flag values are ints, got {got!r}")
        if got == want:
            continue
        if got[keys[0]] == topk and got[keys[1]] == depth and topk != depth:
            check(False, f"{case} = {got}: steps and topk are swapped; --speculative-num-steps is the depth "
                  "(draft forwards, one per level), --speculative-eagle-topk the children kept per node")
        check(got[keys[0]] == depth and got[keys[1]] == topk, f"{case} = {got}, expected {want}: "
              "--speculative-num-steps = depth, --speculative-eagle-topk = topk")
        check(got[keys[2]] != budget, f"{case} = {got}: SGLang's --speculative-num-draft-tokens counts the root "
              f"(the pending token the target verifies too), so it is budget + 1 = {budget + 1}")
        check(False, f"{case} = {got}, expected {want}: --speculative-num-draft-tokens = budget + 1")
    impossible = [
        ((0, 3, 3), "topk = 0 drafts nothing; every value must be >= 1"),
        ((2, 0, 1), "depth = 0 drafts nothing; every value must be >= 1"),
        ((2, 3, 0), "budget = 0 verifies nothing; every value must be >= 1"),
        ((-1, 2, 2), "a negative topk is meaningless; every value must be >= 1"),
        ((1, 4, 3), "with topk = 1 the tree is a chain of depth 4, so the budget must be 4"),
        ((1, 3, 5), "with topk = 1 the tree is a chain of depth 3, so the budget must be 3"),
        ((2, 3, 11), f"a top-2 tree of depth 3 offers at most 2 + 2·2·2 = {_max_eagle_nodes(2, 3)} nodes"),
        ((4, 1, 5), f"one level of top-4 offers at most {_max_eagle_nodes(4, 1)} nodes"),
    ]
    for (topk, depth, budget), reason in impossible:
        case = f"sglang_flags(topk={topk}, depth={depth}, budget={budget})"
        try:
            got = call(sglang_flags, topk, depth, budget)
        except ValueError as e:
            check(str(e).strip() != "", f"{case} raised ValueError with no message: say which setting is "
                  f"impossible and why, e.g. raise ValueError(\"...\") ({reason})")
            continue
        except Exception as e:  # noqa: BLE001 (any other error is the wrong kind)
            raise AssertionError(f"{case} raised {type(e).__name__}({e}); raise ValueError for an impossible "
                                 f"setting: {reason}") from None
        check(False, f"{case} returned {got!r}; it should raise ValueError: {reason}")
    passed("exercise 3: sglang_flags maps (topk, depth, budget) to SGLang's flags, root token counted, and "
           "refuses settings no tree can hold")


# ---- how a failing grader looks in Jupyter ---------------------------------------------------------------


def _in_grading(tb) -> bool:
    return tb.tb_frame.f_code.co_filename == __file__


def _learner_frames(tb):
    """The traceback `tb` without the frames of this module (the learner's frames stay, in order)."""
    kept = []
    while tb is not None:
        if not _in_grading(tb):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _hint_first(hint: str, grader: str):
    """IPython shows what an exception's `_render_traceback_` returns in place of the traceback."""
    red, dim, plain = "\x1b[0;31m", "\x1b[2m", "\x1b[0m"
    return lambda: [f"{red}AssertionError{plain}: {hint}",
                    f"{dim}(found by grading.{grader}; the grader's own code is not shown){plain}"]


def _grader(fn: Callable) -> Callable:
    """Wrap a check_*: its hint (an AssertionError raised here) shows as two lines in Jupyter, hint first;
    any other error keeps the learner's frames only. pytest and plain Python see the same exceptions."""

    @functools.wraps(fn)
    def grade(*args, **kwargs):
        __tracebackhide__ = True  # IPython and pytest skip this frame
        try:
            return fn(*args, **kwargs)
        except AssertionError as e:
            last = e.__traceback__
            while last.tb_next is not None:
                last = last.tb_next
            if _in_grading(last):  # a hint: the grader raised it
                e._render_traceback_ = _hint_first(str(e), fn.__name__)
                raise
            raise e.with_traceback(_learner_frames(e.__traceback__))  # the learner's own assert
        except Exception as e:
            raise e.with_traceback(_learner_frames(e.__traceback__))

    return grade


for _name, _fn in list(globals().items()):  # every grader: check_* (not the helper `check`)
    if _name.startswith("check_") and isinstance(_fn, types.FunctionType):
        globals()[_name] = _grader(_fn)
del _name, _fn
