"""Chapter 11's graders (exercises/11_real_model.ipynb): a real model's speedup on your CPU, from what you measure.

1. `check_compute_bound`: the smallest n at which a pass over n tokens is compute-bound (2n / b FLOP per byte of
   weights at least the ridge rate(n) / bandwidth), on synthetic machines; then the learner's v(n), measured on the
   model they pass, against `measure.forward_costs` taken around their call (chapter 02's rule, wider: `_v_near`).
2. `check_predicted_speedup`: τ / (v(N + 1) + L·c), exactly, with v read piecewise-linearly between the sizes
   measured; then the learner's prediction from their own v and c against the clock of a timed run.
3. `check_draft_vocab_token`: one sampled token of a round whose draft scores only a draft vocabulary. A
   chi-square test over the whole vocabulary catches a residual renormalised over the draft vocabulary only (the
   tokens outside are never emitted) and a q that is not the distribution the draft token was drawn from.
4. `check_sampled_run`: a seeded sampled run and its τ: the seed repeats it, another seed does not, τ is the
   tokens per target pass of that very run.

The library is the reference (`measure.predicted_speedup`, `measure.round_shape`, `decoding.generate`); the
hints name the wrong formulas the graders compute beside it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec_lab import measure
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.grading._common import (P_VALUE_MIN, call, check, chi_square, counts_of, fmt, grader, number,
                                         one_thread, passed, seeded)
from specdec_lab.grading.ch02 import _pair as _tiny  # the zoo's tiny pair: the graders' default model
from specdec_lab.prompts import load_prompts

V_NS = (1, 2, 4, 8)  # the pass sizes exercise 1 measures
PATTERNS = ("loop", "bench")  # the grader's own measurements after the learner's: two orders of the calls


def _v_near(got: float, measured: list[float]) -> bool:
    """Chapter 02's rule for a learner's v(n) (`grading.ch02._v_accepted`) with a wider factor: on v(n) - 1, within
    [lo / f - 0.05, hi * f + 0.05], f = 1.5 + (hi - lo) / lo, lo and hi the least and greatest of the grader's
    three measurements. Wider than chapter 02's 1.25, since a 135M-parameter model's timings on a shared CPU spread
    more between calls; "free" (v = 1) and "n steps" (v = n) still fall outside it."""
    lo, hi = max(min(measured) - 1, 0.01), max(max(measured) - 1, 0.01)
    f = 1.5 + (hi - lo) / lo
    return lo / f - 0.05 <= got - 1 <= hi * f + 0.05


def _bound_at(bandwidth: float, rates: dict, b: float, flop_per_byte) -> int | None:
    return next((n for n in sorted(rates) if flop_per_byte(n, b) >= rates[n] / bandwidth), None)


@grader
def check_compute_bound(compute_bound_at: Callable, measure_v: Callable, model=None) -> None:
    """Exercise 11.1: compute_bound_at(bandwidth, rates, bytes_per_param) -> n or None; measure_v(model, ns) -> {n: v}.

    1. compute_bound_at on four synthetic machines (a CPU in fp32 and bf16, a GPU, one that never turns): the
       first n, in increasing order, with 2n / b >= rates[n] / bandwidth; hints for b left out, the peak rate used
       at every n, the inequality turned round.
    2. measure_v on `model` (default: the zoo's tiny target) at n = 1, 2, 4, 8, one thread, against three
       `measure.forward_costs` runs taken around the learner's call: v(n) - 1 within `_v_near`'s tolerance.
    3. The learner's compute_bound_at on this CPU's measured bandwidth and product rates, in the model's dtype: printed.
    """
    machines = [  # (bandwidth B/s, {n: FLOP/s}, bytes per weight)
        (28e9, {1: 21e9, 2: 26e9, 4: 41e9, 8: 60e9, 16: 76e9, 32: 89e9, 64: 96e9}, 4),
        (28e9, {1: 20e9, 2: 42e9, 4: 71e9, 8: 110e9, 16: 149e9, 32: 179e9, 64: 203e9}, 2),
        (3.35e12, {n: 0.6 * 989e12 * min(1, n / 64) for n in (1, 8, 64, 128, 256, 512)}, 2),
        (20e9, {1: 30e9, 2: 60e9, 4: 120e9}, 4),
    ]
    def case(bw, rates, b):
        return f"compute_bound_at({bw:.3g}, {{{', '.join(f'{n}: {r:.3g}' for n, r in rates.items())}}}, {b})"

    got = [call(compute_bound_at, bw, dict(rates), b) for bw, rates, b in machines]
    want = [_bound_at(bw, rates, b, lambda n, b: 2 * n / b) for bw, rates, b in machines]
    if got != want:  # a hint where the answers are, machine for machine, one wrong formula's
        wrongs = [([_bound_at(bw, r, b, lambda n, b: 2 * n) for bw, r, b in machines], "a pass over n tokens does "
                   "2n FLOP per WEIGHT; a weight is b bytes, so it does 2n / b FLOP per byte read"),
                  ([next((n for n in sorted(r) if 2 * n / b >= max(r.values()) / bw), None) for bw, r, b in machines],
                   "the ridge at the PEAK rate: on a CPU the product over few tokens runs far below its peak, so "
                   "compare with rate(n) / bandwidth at each n"),
                  ([next((n for n in sorted(r) if 2 * n / b <= r[n] / bw), None) for bw, r, b in machines],
                   "the inequality is turned round: below the ridge a pass is memory-bound; it turns compute-bound "
                   "where its FLOP per byte reach rate(n) / bandwidth")]
        i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
        shown = f"{case(*machines[i])} = {got[i]}, expected {want[i]}"
        for answers, hint in wrongs:
            check(answers != got, f"{hint} ({shown})")
        check(False, shown + (" (None: no n in rates is compute-bound)" if want[i] is None else ""))


    with one_thread():
        model = model if model is not None else _tiny()[0]
        refs = [measure.forward_costs({"target": model}, V_NS, rounds=6)]
        got = call(measure_v, model, V_NS)
        refs += [measure.forward_costs({"target": model}, V_NS, rounds=6, pattern=pattern) for pattern in PATTERNS]
    check(isinstance(got, dict) and all(n in got for n in V_NS), f"measure_v(model, {V_NS}) should return a dict "
          f"with a key for every n, got {fmt(got) if not isinstance(got, dict) else got}")
    v = {n: float(got[n]) for n in V_NS}
    check(abs(v[1] - 1) < 1e-3, f"v(1) = {v[1]:.4g}: v(n) is a pass over n tokens over a pass over one, so v(1) = 1")
    for n in V_NS[1:]:
        measured = [r["target", n] / r["target", 1] for r in refs]
        check(_v_near(v[n], measured), f"v({n}) = {v[n]:.3g}, but this machine measures {min(measured):.3g} to "
              f"{max(measured):.3g} just now: time cached forwards over n NEW tokens after a context, crop the cache "
              "back after each, and take the minimum over repeats after a warm-up")
    dtype = next(model.parameters()).dtype
    with one_thread():
        bw, rates = measure.bandwidth(), measure.product_rates(dtype=dtype)
    at = call(compute_bound_at, bw, rates, torch.tensor([], dtype=dtype).element_size())
    passed("v(n) measured here: " + ", ".join(f"v({n}) = {v[n]:.2f}" for n in V_NS[1:])
           + f"; this CPU reads {bw / 1e9:.1f} GB/s and multiplies {str(dtype).removeprefix('torch.')} at "
           + ", ".join(f"{k}: {r / 1e9:.0f}" for k, r in rates.items()) + " GFLOP/s at n tokens, so your "
           + (f"compute_bound_at says a pass turns compute-bound at n = {at}" if at else
              "compute_bound_at finds no compute-bound pass up to 64 tokens"))


@grader
def check_predicted_speedup(predicted_speedup: Callable, v: dict | Callable | None = None, c: float | None = None, target=None,
                            make_drafter: Callable | None = None, prompts: list | None = None) -> None:
    """Exercise 11.2: predicted_speedup(tau, nodes, levels, v, c) -> τ / (v(N + 1) + L·c).

    1. Exact on synthetic rounds (fractional N: v read linearly between the sizes it holds); hints for v(N), the
       drafting left out, τ - 1, v at the nearest size.
    2. Against the clock: `target` and `make_drafter` (default: the zoo's tiny pair with a draft-model chain of 3,
       its v and c measured by the library; v may be exercise 1's measure_v, called on the target at n = 1 to 6)
       decode `prompts` (default: 3 suite prompts, 32 new tokens) plain and
       speculative, interleaved, twice, the faster of each kept; τ, N and L come from the run
       (`measure.round_shape`, L = the proposals' depth). The learner's prediction from THEIR v and c passes when
       S · (0.8 - d) <= P <= S · (1.4 + d), S the measured speedup and d the relative spread of the two repeats'
       speedups: a prediction leaves out the loop's own work, so it may run above the clock, not far below it.
    """
    v_syn = {1: 1.0, 2: 1.05, 4: 1.12, 8: 1.3, 16: 1.6, 32: 2.3}
    for tau, nodes, levels, c_syn in [(2.2, 3.7, 3.7, 0.05), (2.4, 5.8, 2.8, 0.06), (1.5, 23.6, 1.0, 0.04),
                                      (1.3, 14.0, 0.0, 0.0), (2.85, 23.1, 6.5, 0.05)]:
        case = f"predicted_speedup({tau}, {nodes}, {levels}, v={v_syn}, c={c_syn})"
        want = measure.predicted_speedup(tau, nodes, levels, v_syn, c_syn)
        got = number(predicted_speedup, tau, nodes, levels, dict(v_syn), c_syn)
        if abs(got - want) <= 1e-6 * want:
            continue
        nearest = v_syn[min(v_syn, key=lambda k: abs(k - (nodes + 1)))]
        wrongs = [(measure.predicted_speedup(tau, nodes - 1, levels, v_syn, c_syn), "v(N) instead of v(N + 1): "
                   "the pass reads the N drafted tokens AND the pending one"),
                  (measure.predicted_speedup(tau, nodes, 0, v_syn, c_syn), "the drafting is left out: L forwards of "
                   "c steps each"),
                  (measure.predicted_speedup(tau - 1, nodes, levels, v_syn, c_syn), "τ - 1: τ already counts every "
                   "token a round emits, the target's own included"),
                  (tau / (nearest + levels * c_syn), "v at the nearest measured size: read v linearly between the "
                   "two sizes around N + 1")]
        for wrong, hint in wrongs:
            check(abs(got - wrong) > 1e-6 * want, f"{hint} ({case} = {got:.4g}, expected {want:.4g})")
        check(False, f"{case} = {got:.4g}, expected {want:.4g}: τ over v(N + 1) + L·c")


    with one_thread():
        if target is None:
            target, draft, tok = _tiny()
            make_drafter = lambda: DraftModelDrafter(draft, 3)  # noqa: E731
            prompts = [tok(p["prompt"], return_tensors="pt").input_ids for p in load_prompts()[::17]]
            if v is None or c is None:
                v, c = measure.cost_ratios(measure.forward_costs({"target": target, "draft": draft}, range(1, 6),
                                                                 rounds=10))[::-1]
        check(v is not None and c is not None and prompts, "pass your own v and c (exercise 1 and the cell above) "
              "and the prompts the run decodes")
        if callable(v):  # exercise 1's measure_v: measured now, on this target
            v = call(v, target, tuple(range(1, 7)))
        runs, secs = [None] * len(prompts), [[[float("inf")] * len(prompts) for _ in range(2)] for _ in range(2)]
        with torch.inference_mode():
            generate(target, prompts[0], None, 8), generate(target, prompts[0], make_drafter(), 8)  # warm-up
            for rep in range(2):
                for i, ids in enumerate(prompts):
                    secs[rep][0][i] = generate(target, ids, None, 32).seconds
                    runs[i] = generate(target, ids, make_drafter(), 32)
                    secs[rep][1][i] = runs[i].seconds
    speedups = [sum(s[0]) / sum(s[1]) for s in secs]
    S = sum(map(min, zip(*(s[0] for s in secs)))) / sum(map(min, zip(*(s[1] for s in secs))))
    d = (max(speedups) - min(speedups)) / min(speedups)
    shape = measure.round_shape(runs)
    P = number(predicted_speedup, shape["tau"], shape["nodes"], shape["depth"], dict(v), float(c))
    check(S * (0.8 - d) <= P <= S * (1.4 + d), f"your prediction {P:.2f}x from your v and c (τ {shape['tau']:.2f}, "
          f"N {shape['nodes']:.1f}, L {shape['depth']:.1f}) against the clock's {S:.2f}x (repeats {fmt(speedups)}): "
          + ("too high: are v and c measured on this model, in the precision it runs in, with the cache as the "
             "loop has it?" if P > S else "too low: v(n) and c are in one-token steps of THIS target"))
    passed(f"predicted {P:.2f}x, measured {S:.2f}x (τ {shape['tau']:.2f}, N {shape['nodes']:.1f}, "
           f"L {shape['depth']:.1f}): the clock keeps {S / P:.0%} of the prediction")


@grader
def check_draft_vocab_token(draft_vocab_token: Callable) -> None:
    """Exercise 11.3: draft_vocab_token(p [V], draft_logits [k], d2t [k], generator) -> one emitted token id.

    The draft samples from softmax(draft_logits) over its k tokens (d2t maps them into the vocabulary); the
    round accepts with min(1, p / q) and on rejection samples the residual max(0, p - q) over ALL V tokens. Three
    cases, 20,000 draws each, one seeded generator: the emitted tokens must be distributed as p (chi-square,
    p-value >= 1e-4), tokens outside the draft vocabulary included.
    """
    cases = [  # (p over V, draft logits over k, d2t)
        (torch.tensor([0.3, 0.05, 0.2, 0.1, 0.15, 0.05, 0.1, 0.05]), torch.tensor([1.0, 0.2, -0.5]), [0, 2, 4]),
        (torch.tensor([0.05, 0.4, 0.05, 0.1, 0.3, 0.1]), torch.tensor([0.0, 0.0, 0.0, 0.0]), [1, 2, 3, 5]),
        (torch.tensor([0.1, 0.1, 0.6, 0.1, 0.1]), torch.tensor([2.0, -1.0]), [4, 0]),
    ]
    gen = seeded(11)
    for p, logits, d2t in cases:
        case = f"p = {fmt(p, 2)}, draft vocabulary {d2t}, draft logits {fmt(logits, 2)}"
        draws = []
        for _ in range(20_000):
            t = call(draft_vocab_token, p.clone(), logits.clone(), torch.tensor(d2t), gen)
            t = int(t)
            check(0 <= t < len(p), f"{case}: emitted token {t}, outside the vocabulary of {len(p)} tokens")
            draws.append(t)
        counts = counts_of(draws, len(p))
        outside = [i for i in range(len(p)) if i not in d2t]
        check(counts[outside].sum() > 0, f"{case}: no token outside the draft vocabulary ({outside}) was ever "
              "emitted, though p gives them mass: after a rejection the residual max(0, p - q) covers ALL tokens, "
              "and q is 0 outside the draft vocabulary (the draft never proposes them); a residual renormalised "
              "over the draft vocabulary only, or a q with mass outside it, drops them")
        _, pv = chi_square(counts, p)
        check(pv >= P_VALUE_MIN, f"{case}: emitted frequencies {fmt(counts.double() / counts.sum(), 2)} are not p "
              f"(chi-square p-value {pv:.2g}): q in min(1, p / q) and in the residual must be the distribution the "
              "draft token was drawn from, softmax over the k draft logits, scattered to its tokens, 0 elsewhere")
    passed("a draft vocabulary leaves the round exact: the emitted tokens follow p, outside tokens included")


@grader
def check_sampled_run(sampled_run: Callable, target=None, make_drafter: Callable | None = None, ids=None,
                      temperature: float = 0.7) -> None:
    """Exercise 11.4: sampled_run(target, ids, make_drafter, temperature, seed) -> (new tokens, τ), 32 new tokens.

    Against `decoding.generate` with a torch.Generator seeded with `seed`: the same seed repeats the tokens, three
    other seeds do not all repeat them (the run samples), and τ is that run's tokens over its target passes.
    Default: the zoo's tiny pair with a draft-model chain of 3, on a suite prompt.
    """
    if target is None:
        target, draft, tok = _tiny()
        make_drafter = lambda: DraftModelDrafter(draft, 3)  # noqa: E731
        ids = tok(load_prompts()[5]["prompt"], return_tensors="pt").input_ids
    out = call(sampled_run, target, ids, make_drafter, temperature, 0)
    check(isinstance(out, (tuple, list)) and len(out) == 2, f"sampled_run should return (tokens, tau), got {out!r}")
    tokens, tau = list(out[0]), float(out[1])
    again = list(call(sampled_run, target, ids, make_drafter, temperature, 0)[0])
    check(tokens == again, "the same seed gave different tokens: make a torch.Generator, seed it with `seed`, and "
          "pass it to generate(..., generator=...)")
    others = [list(call(sampled_run, target, ids, make_drafter, temperature, s)[0]) for s in (1, 2, 3)]
    check(any(o != tokens for o in others), f"seeds 0 to 3 all gave the same tokens: pass temperature={temperature} "
          "to generate (temperature 0 is greedy)")
    ref = generate(target, ids, make_drafter(), 32, temperature=temperature, generator=torch.Generator().manual_seed(0))
    check(tokens == ref.tokens, "the tokens are not generate's with a generator seeded with `seed`, 32 new tokens")
    accepted = sum(ref.accept_lengths) / max(ref.target_calls, 1)
    check(abs(tau - accepted) > 1e-9 or abs(ref.tau - accepted) < 1e-9, f"τ = {tau:.3f} is the accepted drafts per "
          "pass; τ counts every token a pass emits, the target's own included")
    check(abs(tau - ref.acceptance_rate) > 1e-9 or abs(ref.tau - ref.acceptance_rate) < 1e-9,
          f"τ = {tau:.3f} is α, the share of tested drafts accepted; τ is tokens per target pass")
    check(abs(tau - ref.tau) < 1e-9, f"τ = {tau:.3f}, but that run emitted {len(ref.tokens)} tokens in "
          f"{ref.target_calls} target passes ({ref.tau:.3f})")
    greedy = generate(target, ids, make_drafter(), 32)
    passed(f"a seeded sampled run at T = {temperature:g}: {len(tokens)} tokens, τ {tau:.2f} (greedy, the same drafter "
           f"and prompt: τ {greedy.tau:.2f})")
