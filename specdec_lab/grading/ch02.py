"""Chapter 02's graders (exercises/02_speedup_economics.ipynb): what speculation buys.

1. `check_expected_tokens`: E[tokens per target pass] = 1 + α + ... + α^γ, α = 0 and α = 1 included (where the
   closed form is 0/0).
2. `check_speedup`: S = E[tokens] / (1 + γ·c), then the question what the sweep over γ = 4, 6, 8 shows.
3. `check_optimal_gamma`: the γ in 1..max_gamma with the largest speedup, 0 when none beats plain decoding.
4. `check_crossover_batch`: the batch B* where verifying t tokens per request turns compute-bound, on
   rooflines with efficiency, KV reads and long contexts (math.inf when the KV reads outgrow the arithmetic).

The library is the reference (`economics.expected_tokens`, `speedup`, `optimal_gamma`,
`Roofline.crossover_batch`); the wrong answers the hints name are the library's formulas with one term or
one factor off (a missing bonus token, a sum one term short, a cost of 1 + c, a roofline without efficiency).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from specdec_lab import economics
from specdec_lab.economics import QWEN25_7B_ON_H100, Roofline
from specdec_lab.grading._common import call, check, grader, number, passed


@grader
def check_expected_tokens(expected_tokens: Callable[[float, int], float]) -> None:
    """Exercise 02.1: E[tokens per target pass] = Σ_{i=0}^{γ} α^i."""
    fn = expected_tokens
    tol = 1e-4  # relative: float32 closed forms near α = 1 are off by about 1e-5
    for alpha, gamma in [(0.6, 1), (0.75, 5), (0.95, 12), (0.3, 0), (0.0, 6), (0.999, 7), (1.0, 4), (1.0, 0)]:
        case = f"expected_tokens({alpha}, {gamma})"
        want = economics.expected_tokens(alpha, gamma)
        try:
            got = number(fn, alpha, gamma)
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
        if gamma > 0 and abs(got - economics.expected_tokens(alpha, gamma - 1)) <= tol * want:
            check(False, f"{case} = {got:.4g} stops one term early: the sum runs over i = 0..γ, "
                  "(1 - α^(γ+1)) / (1 - α)")
        if abs(got - economics.expected_tokens(alpha, gamma + 1)) <= tol * want:
            check(False, f"{case} = {got:.4g} has one term too many: the sum runs over i = 0..γ")
        if alpha < 1 and abs(got - 1 / (1 - alpha)) <= tol * want:
            check(False, f"{case} = {got:.4g} is the infinite geometric sum 1 / (1 - α): only γ tokens are "
                  "drafted, so truncate it, (1 - α^(γ+1)) / (1 - α)")
        check(False, f"{case} = {got:.4g}, expected {want:.4g}: draft i (1-based) is reached and accepted with "
              "probability α^i, so E = 1 + α + ... + α^γ")
    passed("exercise 1: expected_tokens is right on 8 hidden cases, α = 0 and α = 1 included")


SWEEP_ALPHA, SWEEP_C, SWEEP_GAMMAS = 0.7, 0.05, (4, 6, 8)  # exercise 02.2's question: α = 0.7, c = 0.05, γ = 4, 6, 8


@grader
def check_speedup(speedup: Callable[[float, int, float], float], what_the_numbers_show: Callable[[], str]) -> None:
    """Exercise 02.2: S = E[tokens] / (1 + γ·c) (Leviathan et al. 2023), then the question about γ = 4, 6, 8."""
    for alpha, gamma, c in [(0.8, 3, 0.1), (0.9, 7, 0.02), (0.5, 2, 0.3), (0.0, 4, 0.05), (1.0, 5, 0.0),
                            (0.6, 1, 0.0)]:
        case = f"speedup({alpha}, {gamma}, {c})"
        tokens = economics.expected_tokens(alpha, gamma)
        want = economics.speedup(alpha, gamma, c)
        got = number(speedup, alpha, gamma, c)
        if abs(got - want) <= 1e-4 * want:
            continue
        if abs(got - tokens) <= 1e-4 * want:
            check(False, f"{case} = {got:.4g} is the tokens per pass alone: divide by the cost of a round")
        for wrong, what in [(1 + c, "1 + c"), (gamma * c, "γ·c"), (1 + (gamma + 1) * c, "1 + (γ+1)·c")]:
            if wrong and abs(got - tokens / wrong) <= 1e-4 * want:
                check(False, f"{case} = {got:.4g} divides by {what}: a round costs one target pass plus γ draft "
                      "tokens at c each, 1 + γ·c target steps")
        check(False, f"{case} = {got:.4g}, expected {want:.4g} = E[tokens per pass] / (1 + γ·c)")
    rows = {g: (number(speedup, SWEEP_ALPHA, g, SWEEP_C), economics.expected_tokens(SWEEP_ALPHA, g))
            for g in SWEEP_GAMMAS}
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


@grader
def check_optimal_gamma(optimal_gamma: Callable[..., int]) -> None:
    """Exercise 02.3: the γ in 1..max_gamma with the largest speedup, or 0 when none beats plain decoding."""
    s = economics.speedup
    cases = [(0.85, 0.07, 10), (0.75, 0.12, 32), (0.95, 0.01, 32), (0.5, 0.3, 32), (0.2, 0.3, 32), (0.9, 0.0, 20),
             (1.0, 0.0, 12), (0.0, 0.05, 8), (0.7, 0.02, 5)]
    for alpha, c, max_gamma in cases:
        case = f"optimal_gamma({alpha}, {c}, max_gamma={max_gamma})"
        got = call(optimal_gamma, alpha, c, max_gamma)
        want = economics.optimal_gamma(alpha, c, max_gamma)
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


@grader
def check_crossover_batch(crossover_batch: Callable) -> None:
    """Exercise 02.4: the batch B* where a step over B·t tokens turns compute-bound."""
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
        got = number(crossover_batch, m, t)
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
