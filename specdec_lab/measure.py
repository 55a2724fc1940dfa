"""The course's one way to time forward passes, and its two cost ratios c and v(n).

    c    = time of one cached 1-token draft forward / time of one cached 1-token target forward
    v(n) = time of one cached n-token target forward / time of one cached 1-token target forward   (v(1) = 1)

Both at the same context (128 tokens by default), on one torch thread. A speculative round with a chain of γ
drafts then costs γ·c + v(γ + 1) target steps (chapter 02). Two ways to take the times, always named:

- "loop" (the default, what the speedup formula needs): the models take turns, as in the decoding loop, so
  each call finds the caches as cold as the loop leaves them. On a CPU this makes a small draft look dearer.
- "bench": each model runs its own block of calls, opened by one untimed call so its weights are warm, as
  benchmarks and model cards report.

Every round visits every (model, n) once in a shuffled order; round 0 is a warm-up. The statistic is the
MINIMUM over the rounds: load from other programs can only add time, so the minimum is the figure that
repeats on a busy machine, where a median does not.

    t = forward_costs({"target": target, "draft": draft}, ns=range(1, 10))
    c, v = cost_ratios(t)          # c, {n: v(n)}
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from specdec_lab import lm

__all__ = ["PATTERNS", "forward_costs", "cost_ratios"]

PATTERNS = ("loop", "bench")


@torch.inference_mode()
def forward_costs(models: dict, ns: Iterable[int] = (1,), context: int = 128, rounds: int = 40,
                  pattern: str = "loop", seed: int = 0) -> dict[tuple[str, int], float]:
    """{(name, n): milliseconds} of one cached forward over n new tokens after `context` tokens: the minimum
    over `rounds` interleaved rounds (after one warm-up round).

    models: {name: model}; the first is the target: it is timed at every n, the others (drafts) at n = 1.
    pattern: "loop" times, for each n in a shuffled order, the target over n tokens then each draft over one
    token; "bench" times each model's calls in a block of its own (shuffled within the block).
    """
    if pattern not in PATTERNS:
        raise ValueError(f"pattern={pattern!r}: use 'loop' (models take turns, as in decoding) or 'bench' "
                         "(each model in a block of its own)")
    ns = sorted(set(ns) | {1})
    names = list(models)
    first = models[names[0]]
    device = next(first.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, first.config.vocab_size, (1, context), generator=gen).to(device)  # [1, context]
    new = torch.randint(0, first.config.vocab_size, (1, max(ns)), generator=gen).to(device)  # [1, n_max]
    caches = {name: lm.new_cache(model) for name, model in models.items()}
    for name, model in models.items():
        lm.forward(model, prefix, caches[name])  # the context, read once; every timed call is cropped back to it

    def timed(name: str, n: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        lm.forward(models[name], new[:, :n], caches[name])  # [1, n, V]
        if device.type == "cuda":
            torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t0)
        lm.crop(caches[name], context)
        return ms

    calls = [(names[0], n) for n in ns]
    if pattern == "loop":  # target over n, then every draft over one token: the loop's alternation
        calls = [call for n in ns for call in [(names[0], n)] + [(d, 1) for d in names[1:]]]
        groups = [calls[i: i + len(names)] for i in range(0, len(calls), len(names))]
    else:
        groups = [[call] for call in calls] + [[(d, 1)] for d in names[1:]]
    best: dict[tuple[str, int], float] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for r in range(rounds + 1):
            order = torch.randperm(len(groups), generator=gen).tolist()
            if pattern == "bench":  # keep each model's calls together, shuffled within its block
                order.sort(key=lambda i: names.index(groups[i][0][0]))
            last = None
            for i in order:
                for name, n in groups[i]:
                    if pattern == "bench" and name != last:
                        timed(name, 1)  # untimed: the block starts with this model's weights warm
                    last = name
                    ms = timed(name, n)
                    if r:  # round 0 warms up
                        best[(name, n)] = min(ms, best.get((name, n), float("inf")))
    finally:
        torch.set_num_threads(threads)
    return best


def cost_ratios(times: dict[tuple[str, int], float], target: str = "target",
                draft: str = "draft") -> tuple[float | None, dict[int, float]]:
    """(c, {n: v(n)}) from `forward_costs` times; c is None when no draft was timed."""
    one = times[(target, 1)]
    c = times[(draft, 1)] / one if (draft, 1) in times else None
    v = {n: ms / one for (name, n), ms in sorted(times.items()) if name == target}
    return c, v
