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
import time

import torch

__all__ = ["PRECISIONS", "cpu_bf16_is_native", "training_dtype", "autocast"]

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
        raise ValueError(f"precision={precision!r} is not one of {PRECISIONS}: use 'auto' to let the hardware "
                         "decide, 'fp32' for the same numbers on every machine, 'bf16' to force it.")
    kind = torch.device(device).type
    if precision == "fp32" or kind not in ("cpu", "cuda"):
        return torch.float32
    if precision == "bf16":
        return torch.bfloat16
    native = cpu_bf16_is_native() if kind == "cpu" else torch.cuda.is_bf16_supported()
    return torch.bfloat16 if native else torch.float32


def autocast(device: torch.device | str, precision: str = "auto"):
    """A context that runs matrix products in `training_dtype(device, precision)`; weights stay fp32."""
    dtype = training_dtype(device, precision)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)
