"""Chapter 02's graders (exercises/02_speedup_economics.ipynb): what speculation buys.

1. `check_expected_tokens`: E[tokens per target pass] = 1 + α + ... + α^γ, α = 0 and α = 1 included (where the
   closed form is 0/0).
2. `check_speedup`: S = E[tokens] / (1 + γ·c), then the question what the sweep over γ = 4, 6, 8 shows.
3. `check_optimal_gamma`: the γ in 1..max_gamma with the largest speedup, 0 when none beats plain decoding.
4. `check_crossover_batch`: the batch B* where verifying t tokens per request turns compute-bound, on
   rooflines with efficiency, KV reads and long contexts (math.inf when the KV reads outgrow the arithmetic).
5. `check_measured_speedup`: c and v(n) measured by the learner on this machine (zoo's tiny pair, checked against
   `measure.forward_costs` within a tolerance taken from the spread of the grader's own repeated measurements),
   and the speedup predicted from them (exact on synthetic costs, then against a timed speculative run; the
   tolerance rule is in its docstring).

The library is the reference (`economics.expected_tokens`, `speedup`, `optimal_gamma`,
`Roofline.crossover_batch`); the wrong answers the hints name are the library's formulas with one term or
one factor off (a missing bonus token, a sum one term short, a cost of 1 + c, a roofline without efficiency).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import transformers

from specdec_lab import economics, measure, zoo
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.economics import QWEN25_7B_ON_H100, Roofline
from specdec_lab.grading._common import call, check, grader, number, one_thread, passed
from specdec_lab.prompts import load_prompts


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


# ---- exercise 02.5: c and v(n) measured here, and the speedup they predict ------------------------------------

MEASURE_GAMMA = 4  # the run the prediction is checked against: greedy, a chain of 4 drafts
MEASURE_NS = tuple(range(1, MEASURE_GAMMA + 2))  # v(1) .. v(γ + 1)


def _pair():
    """The course's tiny target and draft (embedded, offline) and their tokenizer."""
    transformers.logging.disable_progress_bar()
    return zoo.load_pair("tiny", device="cpu")


def _reference_costs(target, draft, ns, pattern: str) -> tuple[float, dict[int, float]]:
    """(c, {n: v(n)}) as the course measures them (`measure.forward_costs`, minimum over 10 rounds)."""
    return measure.cost_ratios(measure.forward_costs({"target": target, "draft": draft}, ns, rounds=10,
                                                     pattern=pattern))


def _timed_run(target, draft, tok, gamma: int) -> dict:
    """Greedy decoding of 4 suite prompts, 32 new tokens each, plain and with the draft model at `gamma`,
    interleaved prompt by prompt, twice over, after a warm-up. Returns the seconds of each (per prompt the
    faster of the two repetitions), how far the two repetitions' speedups differ (relative), and the acceptance
    of the drafts."""
    prompts = [tok(p["prompt"], return_tensors="pt").input_ids for p in load_prompts()[::13]]  # 4 prompts

    def run(ids, spec):
        return generate(target, ids, DraftModelDrafter(draft, gamma) if spec else None, max_new_tokens=32)

    run(prompts[0], False), run(prompts[0], True)  # warm-up
    times = [[[], []] for _ in range(2)]  # [repetition][plain, spec][prompt] seconds
    accepted = tested = 0
    full = []
    for rep in range(2):
        for ids in prompts:
            times[rep][0].append(run(ids, False).seconds)
            g = run(ids, True)
            times[rep][1].append(g.seconds)
            if rep == 0:  # greedy: the second repetition drafts and accepts the same tokens
                accepted += sum(g.accept_lengths)
                tested += sum(min(n + 1, d) for n, d in zip(g.accept_lengths, g.draft_lengths))
                full += [n for n, d in zip(g.accept_lengths, g.draft_lengths) if d == gamma]
    speedups = [sum(p) / sum(s) for p, s in times]
    return {"plain": sum(map(min, zip(*(t[0] for t in times)))), "spec": sum(map(min, zip(*(t[1] for t in times)))),
            "spread": (max(speedups) - min(speedups)) / min(speedups),
            "alpha": accepted / tested, "tau_full": 1 + sum(full) / len(full)}


def _cost_hint(what: str, got: float, lo: float, hi: float) -> str:
    return (f"{what} = {got:.3g}, but this machine measures {lo:.3g} to {hi:.3g} just now: time cached forwards "
            "after a context, and take the MINIMUM over many repeats (not the mean: load from other programs only "
            "adds time), after an untimed warm-up call")


def _v_accepted(got: float, measured: list[float]) -> bool:
    """Whether a learner's v(n) agrees with the grader's measurements of it. The tolerance applies to v(n) - 1,
    what a pass over n tokens costs beyond a one-token pass: on the relative scale of v itself, v = 1.05
    ("verification is free") would pass against a measured 1.3. With lo and hi the least and greatest measured
    excess: [lo / f, hi * f] with f = 1.25 + (hi - lo) / lo (a quarter, plus the machine's own spread), widened
    by 0.05 for excesses too small to measure relatively."""
    lo, hi = max(min(measured) - 1, 0.01), max(max(measured) - 1, 0.01)
    f = 1.25 + (hi - lo) / lo
    return lo / f - 0.05 <= got - 1 <= hi * f + 0.05


@grader
def check_measured_speedup(measure_costs: Callable, predict_speedup: Callable) -> None:
    """Exercise 02.5: measure_costs(target, draft, ns) -> (c, {n: v(n)}); predict_speedup(α, γ, c, v) -> speedup.

    1. predict_speedup on synthetic costs: E[tokens](α, γ) / (v(γ + 1) + γ·c) exactly (`economics.speedup` with
       verify_cost = v(γ + 1)); hints for v(γ), a missing bonus token, c and v swapped, v left out.
    2. measure_costs on the tiny pair, on one thread. The grader measures the same ratios three times itself
       (`measure.forward_costs`, 10 rounds: models taking turns before and after the learner's call, and in
       blocks). For each ratio, with lo and hi the least and greatest of its three values, the learner's value
       passes in [lo / f, hi · f], f = 1.25 + (hi - lo) / lo: a quarter for what a different but sound
       measurement gives, plus the spread the machine showed the grader itself. For v(n) the same applies to
       v(n) - 1, the cost beyond a one-token pass (`_v_accepted`).
    3. A timed run (`_timed_run`: 4 prompts, 32 tokens, plain and at γ = 4, twice over, the faster repetition of
       each prompt kept) gives the measured speedup S and the acceptance α̂. The learner's prediction
       P = predict_speedup(α̂, 4, c, v) passes when S · (1 - tol) <= P <= S · margin · (1 + tol), where
       margin = max(1, R_max / S) with R_max the largest of the grader's own predictions from its three
       measurements (how far forward passes alone overestimate the clock here: the loop's own Python, and costs
       the loop pays above the isolated timings), and tol = 0.15 + (R_max - R_min) / R_min + d + |E(α̂, 4) / τ_full
       - 1|: the spread of those predictions, the relative difference d between the two repetitions' speedups,
       and how far i.i.d. acceptance misses the measured tokens per pass.
    """
    # 1. the formula, on synthetic costs
    for alpha, gamma, c in [(0.8, 4, 0.2), (0.6, 2, 0.1), (0.9, 6, 0.05), (0.7, 3, 0.3), (1.0, 3, 0.1)]:
        v = {n: 1 + 0.06 * (n - 1) ** 1.4 for n in range(1, gamma + 3)}  # [v(1) .. v(γ + 2)], v(1) = 1
        case = f"predict_speedup({alpha}, {gamma}, c={c}, v={{{', '.join(f'{n}: {x:.3f}' for n, x in v.items())}}})"
        want = economics.speedup(alpha, gamma, c, v[gamma + 1])
        try:
            got = number(predict_speedup, alpha, gamma, c, v)
        except KeyError as e:
            raise AssertionError(f"{case} raised KeyError {e}: v holds the costs of passes of 1 to "
                                 f"{gamma + 2} tokens; a round's verification pass needs v(γ + 1)") from None
        if abs(got - want) <= 1e-4 * want:
            continue
        tokens = economics.expected_tokens(alpha, gamma)
        wrongs = [(tokens / (v[gamma] + gamma * c), "v(γ) instead of v(γ+1): the verification pass reads the "
                   "γ drafts AND the token before them, γ + 1 tokens"),
                  (tokens / (v[gamma + 2] + gamma * c), "v(γ+2): the verification pass reads γ + 1 tokens"),
                  ((tokens - 1) / (v[gamma + 1] + gamma * c), "speedup without the bonus token: a round emits the "
                   "accepted drafts plus one token of the target's own (expected tokens of exercise 1)"),
                  (tokens / (c + gamma * v[gamma + 1]), "c and v swapped: γ draft steps cost c each, the one "
                   "verification pass costs v(γ+1)"),
                  (tokens / (1 + gamma * c), "the verification cost is left out: exercise 2 assumed a pass over "
                   "γ + 1 tokens costs one step; use the measured v(γ+1) instead"),
                  (tokens / (1 + v[gamma + 1] + gamma * c), "one step too many: the round's cost is the drafts plus "
                   "the verification pass, v(γ+1) + γ·c target steps (the pass replaces the plain step)")]
        for wrong, hint in wrongs:
            check(abs(got - wrong) > 1e-4 * want, f"{hint} ({case} = {got:.4g}, expected {want:.4g})")
        check(False, f"{case} = {got:.4g}, expected {want:.4g}: expected tokens per round over the cost of a round "
              "in target steps, with the measured verification cost")

    # 2. the learner's measurement against the grader's, taken around it
    gamma, ns = MEASURE_GAMMA, MEASURE_NS
    with one_thread():
        target, draft, tok = _pair()
        refs = [_reference_costs(target, draft, ns, "loop")]
        got = call(measure_costs, target, draft, ns)
        refs += [_reference_costs(target, draft, ns, "loop"), _reference_costs(target, draft, ns, "bench")]
        check(isinstance(got, (tuple, list)) and len(got) == 2, f"measure_costs should return (c, v), got {got!r}")
        c, v = got
        check(not isinstance(c, dict), "c and v swapped: return (c, v), the number c first, then the dict v")
        check(isinstance(v, dict) and all(n in v for n in ns), f"v should be a dict with a key for every n in ns = "
              f"{list(ns)}, got {v!r}")
        c, v = float(c), {n: float(v[n]) for n in ns}
        check(abs(v[1] - 1) < 1e-3, f"v(1) = {v[1]:.4g}: v(n) is the n-token pass's time over the 1-token pass's "
              "time, so v(1) = 1")
        f_of = lambda lo, hi: 1.25 + (hi - lo) / lo  # noqa: E731
        lo, hi = min(r[0] for r in refs), max(r[0] for r in refs)
        if not lo / f_of(lo, hi) <= c <= hi * f_of(lo, hi):
            check(not (c > 1 and lo / f_of(lo, hi) <= 1 / c <= hi * f_of(lo, hi)), f"c = {c:.3g} is inverted: c is "
                  "the draft's step time over the TARGET's, below 1 for a smaller draft")
            check(False, _cost_hint("c", c, lo, hi))
        for n in ns[1:]:
            measured_v = [r[1][n] for r in refs]
            check(_v_accepted(v[n], measured_v), _cost_hint(f"v({n})", v[n], min(measured_v), max(measured_v)))

        # 3. the prediction against a timed run
        run = _timed_run(target, draft, tok, gamma)
    alpha = run["alpha"]
    measured = run["plain"] / run["spec"]
    predicted = number(predict_speedup, alpha, gamma, c, v)
    own = [economics.speedup(alpha, gamma, rc, rv[gamma + 1]) for rc, rv in refs]
    margin = max(1.0, max(own) / measured)
    tol = (0.15 + (max(own) - min(own)) / min(own) + run["spread"]
           + abs(economics.expected_tokens(alpha, gamma) / run["tau_full"] - 1))
    low, high = measured * (1 - tol), measured * margin * (1 + tol)
    facts = (f"predicted {predicted:.2f}x from your c = {c:.3f} and v({gamma + 1}) = {v[gamma + 1]:.2f} at α̂ = "
             f"{alpha:.2f}, γ = {gamma}; measured {measured:.2f}x; the grader's own costs predict {min(own):.2f}x to "
             f"{max(own):.2f}x")
    check(predicted >= low, f"the prediction is too low for this run: {facts}")
    check(predicted <= high, f"the prediction is too high for this run: {facts}")
    passed(f"exercise 5: {facts}. What separates a prediction from the clock: the loop's own time outside the "
           "forward passes, and the load on this machine")
