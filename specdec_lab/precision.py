"""Which precision training runs in: bfloat16 autocast only where the hardware does bf16 natively.

A CPU with AVX512-BF16 or AMX multiplies bf16 matrices at least as fast as fp32 ones, so autocast saves
time there. Every other CPU (AVX2 laptops, many cloud machines) only emulates bf16: the same product runs
10 to 40 times slower than in fp32. So `autocast(device)` asks the hardware before it turns bf16 on:

    with precision.autocast(hidden.device):        # "auto": bf16 where native, else fp32
        loss = model(x)

CUDA GPUs that support bf16 (Ampere and newer) get it; everything else trains in plain fp32.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import time

import torch

from specdec_lab import checks

__all__ = ["PRECISIONS", "cpu_bf16_is_native", "training_dtype", "decoding_dtype", "cpu_name", "autocast"]

PRECISIONS = ("auto", "fp32", "bf16")


@functools.cache
def cpu_bf16_is_native() -> bool:
    """True when a bf16 matrix product on this CPU runs within 5x the time of an fp32 one.

    Natively (AVX512-BF16, AMX) a small bf16 product costs 0.5-2x the fp32 one; emulated it costs 10-70x more,
    so the probe (a few 256x256 products, 5 to 150 ms) cannot confuse the two. It measures rather than reads CPU flags
    because the flags can say yes while the math library is limited to older instructions.
    """

    def best_seconds(dtype: torch.dtype) -> float:
        a, b = torch.randn(256, 256).to(dtype), torch.randn(256, 256).to(dtype)
        a @ b  # warm-up: first calls pick kernels
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        return min(times)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return best_seconds(torch.bfloat16) < 5 * best_seconds(torch.float32)
    finally:
        torch.set_num_threads(threads)


def training_dtype(device: torch.device | str, precision: str = "auto") -> torch.dtype:
    """The dtype training's matrix products run in: torch.bfloat16 or torch.float32.

    precision: "auto" (bf16 where the device does it natively), "fp32", or "bf16" (forced, even if emulated).
    """
    if precision not in PRECISIONS:
        raise checks.ArgumentError(f"precision={precision!r} is not one of {PRECISIONS}: use 'auto' to let the "
                                   "hardware decide, 'fp32' for the same numbers on every machine, 'bf16' to force it.")
    kind = torch.device(device).type
    if precision == "fp32" or kind not in ("cpu", "cuda"):
        return torch.float32
    if precision == "bf16":
        return torch.bfloat16
    native = cpu_bf16_is_native() if kind == "cpu" else torch.cuda.is_bf16_supported()
    return torch.bfloat16 if native else torch.float32


# Environment variables that hold the math libraries to older instructions: an AVX2-only CPU simulated on a newer one
# (`ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`); a timing made under them must say so.
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


@functools.cache
def cpu_name() -> str:
    """This CPU as timings should name it: its model name and whether bf16 is native here, e.g. "AMD EPYC 9R14
    (native bf16)" or "Intel(R) Core(TM) i7-8650U (emulated bf16)", and any ISA_LIMITS set, e.g. "Intel(R) Xeon(R)
    Processor (emulated bf16; simulated: ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2)"."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:  # not Linux: platform's answer
        pass
    limits = ", ".join(f"{k}={os.environ[k]}" for k in ISA_LIMITS if os.environ.get(k))
    return f"{name} ({'native' if cpu_bf16_is_native() else 'emulated'} bf16{f'; simulated: {limits}' if limits else ''})"


def decoding_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype a real model's weights decode in on `device` (chapter 11, `bench --target`): bfloat16 where the
    hardware multiplies it natively, else float32.

    On a CPU at batch 1 a pass over a few tokens costs 1.5-2 steps in fp32 but about one step in native bf16 (its
    matrix products stay cheap up to 8-16 rows: `measure.product_rates`), which is what speculation needs. The
    price: bf16 rounds an n-token pass differently from one-token steps, so greedy outputs may part at near-ties of
    the logits (`identity.compare` counts them as ties, not bugs); fp32 stays the exact reference.
    """
    return training_dtype(device, "auto")


def autocast(device: torch.device | str, precision: str = "auto"):
    """A context that runs matrix products in `training_dtype(device, precision)`; weights stay fp32."""
    dtype = training_dtype(device, precision)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)
