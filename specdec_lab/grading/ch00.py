"""Chapter 00's graders (exercises/00_setup_and_models.ipynb): decoding is memory-bound.

The four exercises are back-of-the-envelope formulas checked on hidden model/hardware pairs:

1. `check_weight_bytes`: the bytes of a model's weights, N · b.
2. `check_memory_bound_ms`: the bandwidth floor of a decode step, N · b / BW, in milliseconds.
3. `check_free_tokens`: how many tokens a step can process before the arithmetic catches up with the weight
   reads, F · b / (2 · BW).
4. `check_gpu_answer`: the floor for a 70.6B bf16 model on an H200.

The expected values come from chapter 02's roofline (`economics.Roofline`). A wrong answer off by a telltale
factor (1e3, 1e9, 1e12, 2) gets a hint naming the unit slip.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from specdec_lab.economics import Roofline
from specdec_lab.grading._common import call, check, fmt, grader, passed


def _floor_ms(params: float, bytes_per_param: float, bandwidth: float) -> float:
    """A decode step's bandwidth floor in ms: the roofline's step time with free arithmetic and no overhead."""
    m = Roofline(params=params, bandwidth=bandwidth, peak_flops=math.inf, bytes_per_param=bytes_per_param,
                 overhead=0.0)
    return 1e3 * m.step_time()


def _free_tokens(peak_flops: float, bandwidth: float, bytes_per_param: float) -> float:
    """K* = F · b / (2 · BW): the roofline's crossover at full efficiency without KV reads (N cancels out)."""
    return Roofline(params=1.0, bandwidth=bandwidth, peak_flops=peak_flops, bytes_per_param=bytes_per_param,
                    efficiency=1.0).crossover_batch()


def _ratio_hint(got: float, want: float, what: str) -> str:
    """Name the usual unit slip when `got` is off from `want` by a telltale factor."""
    r = got / want if want else float("inf")
    for factor, slip in [(1e3, "seconds vs milliseconds, or TB/s vs GB/s"),
                         (1e-3, "milliseconds vs seconds, or GB/s vs TB/s"),
                         (1e9, "GB/s is 1e9 bytes per second"), (1e-9, "GB/s is 1e9 bytes per second"),
                         (2.0, "bytes per parameter"), (0.5, "bytes per parameter"),
                         (1e12, "TFLOP/s is 1e12 FLOP per second"), (1e-12, "TFLOP/s is 1e12 FLOP per second")]:
        if abs(r / factor - 1) < 0.02:
            return f"{what}: you returned {fmt(got)}, {fmt(factor)} times the right value. Check your units: {slip}?"
    return f"{what}: you returned {fmt(got)}, expected {fmt(want)}."


@grader
def check_weight_bytes(weight_bytes: Callable[[float, float], float]) -> None:
    """Exercise 00.1: weight_bytes(n_params, bytes_per_param) = N · b."""
    for n, b in [(8.03e9, 2), (1.5e9, 4), (405e9, 1), (7e9, 0.5)]:
        got = float(call(weight_bytes, n, b))
        check(abs(got - n * b) <= 1e-6 * n * b, _ratio_hint(got, n * b, f"weight_bytes({fmt(n)}, {b})"))
    passed("exercise 1: weight_bytes is right for 4 models (fp32, bf16, fp8, int4)")


@grader
def check_memory_bound_ms(memory_bound_ms: Callable[[float, float, float], float]) -> None:
    """Exercise 00.2: memory_bound_ms(n_params, bytes_per_param, bandwidth_gb_s) = N · b / BW, in ms."""
    cases = [(8.03e9, 2, 1008), (1.5e9, 4, 100), (405e9, 1, 8000), (7e9, 0.5, 120)]  # params, bytes, GB/s
    for n, b, gbs in cases:
        want = _floor_ms(n, b, gbs * 1e9)
        got = float(call(memory_bound_ms, n, b, gbs))
        check(abs(got - want) <= 1e-6 * want,
              _ratio_hint(got, want, f"memory_bound_ms({fmt(n)} params, {b} bytes each, {gbs} GB/s)")
              + " The floor is (bytes read per step) / (bytes per second), in milliseconds.")
    passed("exercise 2: memory_bound_ms gives the bandwidth floor of a decode step for 4 model/hardware pairs")


@grader
def check_free_tokens(free_tokens: Callable[[float, float, float], float]) -> None:
    """Exercise 00.3: free_tokens(peak_tflops, bandwidth_gb_s, bytes_per_param) = F · b / (2 · BW)."""
    cases = [(989, 3350, 2), (312, 2039, 2), (165, 1008, 2), (1979, 3350, 1)]  # TFLOP/s, GB/s, bytes/param
    for tflops, gbs, b in cases:
        want = _free_tokens(tflops * 1e12, gbs * 1e9, b)
        got = float(call(free_tokens, tflops, gbs, b))
        hint = _ratio_hint(got, want, f"free_tokens({tflops} TFLOP/s, {gbs} GB/s, {b} bytes/param)")
        if abs(got * 2 / want - 1) < 0.02 or abs(got / 2 / want - 1) < 0.02:
            hint += " Each token costs 2 FLOPs per parameter (a multiply and an add)."
        check(abs(got - want) <= 1e-6 * want, hint)
    passed("exercise 3: free_tokens finds where the arithmetic of K tokens catches up with the weight reads")


@grader
def check_gpu_answer(h200_floor_ms: Callable[[], float]) -> None:
    """Exercise 00.4: h200_floor_ms(), the floor of a 70.6B model in bf16 on an H200 (4.8 TB/s), in ms."""
    want = _floor_ms(70.6e9, 2, 4.8e12)
    answer_ms = call(h200_floor_ms)
    check(isinstance(answer_ms, (int, float)), f"return a number of milliseconds, not {answer_ms!r}")
    check(abs(answer_ms - want) <= 0.05 * want, _ratio_hint(float(answer_ms), want, "h200_floor_ms()"))
    passed(f"exercise 4: {answer_ms:.1f} ms per step, so at most {1e3 / answer_ms:.0f} tokens/s per sequence")
