"""Side-by-side benchmark on the held-out prompt suite (greedy, batch 1): `specdec-lab bench --method draft`.

Every method decodes the same prompts with the same max_new_tokens and EOS. Methods run interleaved, prompt
by prompt (so a slow spell on a shared machine hits all of them alike), after a warm-up on the first
prompt. Each row reports τ (tokens per target pass), the target passes, tokens per second, the speedup over
the first row (plain decoding with this package's loop), and on how many prompts the output equals the
first row's token for token. Hugging Face's passes are counted with a forward hook on the target.

Used by notebooks/03_draft_target.ipynb and by the command line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

__all__ = ["Row", "run", "draft_methods", "format_table", "count_calls", "METHODS"]


@dataclass
class Row:
    """One method's totals over the suite."""

    method: str
    tokens: int = 0
    target_calls: int = 0
    seconds: float = 0.0
    same: int = 0  # prompts whose output equals the reference row's
    prompts: int = 0
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def tau(self) -> float:
        """Tokens emitted per target forward pass."""
        return self.tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@contextmanager
def count_calls(model):
    """Count forward calls of `model` (a list whose length grows by one per call)."""
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


# A method maps (input_ids [1, T]) to (new token ids, target passes or None to count them with a hook).
Method = Callable[[torch.Tensor], tuple[list[int], int | None]]


def draft_methods(target, draft, max_new_tokens: int = 64, gamma: int = 3, eos_token_id=None,
                  naive: bool = False, hf_defaults: bool = True) -> dict[str, Method]:
    """Plain decoding (ours and HF's), the draft-model drafter (cached; naive optional), HF assisted."""
    from specdec_lab import lm  # imported here so that `specdec-lab --help` stays quick
    from specdec_lab.decoding import generate, generate_naive
    from specdec_lab.drafters import DraftModelDrafter

    n, eos = max_new_tokens, eos_token_id

    def ours(drafter_factory):
        def call(ids):
            gen = generate(target, ids, drafter_factory(), max_new_tokens=n, eos_token_id=eos)
            return gen.tokens, gen.target_calls
        return call

    def hf(**kw):
        return lambda ids: (lm.hf_generate(target, ids, n, eos_token_id=eos, **kw).tolist(), None)

    methods = {
        "target only": ours(lambda: None),
        "target only, HF generate": hf(),
        f"draft model γ={gamma}": ours(lambda: DraftModelDrafter(draft, gamma)),
    }
    if naive:
        def naive_call(ids):
            gen = generate_naive(target, draft, ids, gamma=gamma, max_new_tokens=n, eos_token_id=eos)
            return gen.tokens, gen.target_calls
        methods[f"draft model γ={gamma}, no KV cache"] = naive_call
    methods[f"HF assisted, {gamma} tokens"] = hf(assistant=draft, num_assistant_tokens=gamma)
    methods["HF assisted, heuristic schedule"] = hf(assistant=draft, num_assistant_tokens=gamma,
                                                    schedule="heuristic")
    if hf_defaults:  # what assisted generation does when given nothing but the assistant (5.x defaults)
        methods["HF assisted, HF defaults"] = hf(assistant=draft, num_assistant_tokens=20,
                                                 confidence_threshold=0.4)
    return methods


def run(target, methods: dict[str, Method], prompts: list[torch.Tensor], warmup: int = 2,
        progress: bool = False) -> list[Row]:
    """Time every method on every prompt (interleaved); the first method is the reference for `same`."""
    rows = {name: Row(name) for name in methods}
    with torch.inference_mode():
        for _ in range(warmup):
            for method in methods.values():
                method(prompts[0])
        for i, ids in enumerate(prompts):
            for name, method in methods.items():
                with count_calls(target) as calls:
                    start = time.perf_counter()
                    tokens, passes = method(ids)
                    seconds = time.perf_counter() - start
                row = rows[name]
                row.tokens += len(tokens)
                row.target_calls += passes if passes is not None else len(calls)
                row.seconds += seconds
                row.prompts += 1
                row.outputs.append(tokens)
            if progress:
                print(f"\rprompt {i + 1}/{len(prompts)}", end="", flush=True)
    if progress:
        print()
    rows = list(rows.values())
    for row in rows:
        row.same = sum(a == b for a, b in zip(row.outputs, rows[0].outputs))
    return rows


def format_table(rows: list[Row]) -> str:
    """The rows as a fixed-width table; speedup relative to the first row."""
    base = rows[0].tokens_per_second
    width = max(len(r.method) for r in rows)
    lines = [f"{'method':<{width}} | {'τ':>5} | {'target calls':>12} | {'tokens/s':>8} | {'speedup':>7} | same output",
             "-" * (width + 58)]
    for r in rows:
        lines.append(f"{r.method:<{width}} | {r.tau:5.2f} | {r.target_calls:12d} | {r.tokens_per_second:8.1f} | "
                     f"{r.tokens_per_second / base:6.2f}x | {r.same}/{r.prompts}")
    return "\n".join(lines)


def suite_prompts(tokenizer, category: str | None = None, limit: int | None = None) -> list[torch.Tensor]:
    """The held-out prompt suite as [1, T] id tensors."""
    from specdec_lab.prompts import load_prompts

    prompts = load_prompts(category)[:limit]
    return [tokenizer(p["prompt"], return_tensors="pt").input_ids for p in prompts]


def bench_draft(args) -> int:
    from specdec_lab import zoo

    target, draft, tok = zoo.load_pair(args.pair, device="cpu")
    prompts = suite_prompts(tok, args.category, args.limit)
    methods = draft_methods(target, draft, args.max_new_tokens, args.gamma, tok.eos_token_id, naive=args.naive)
    print(f"pair {args.pair!r}, {len(prompts)} prompts, greedy, max_new_tokens={args.max_new_tokens}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    rows = run(target, methods, prompts, progress=True)
    print(format_table(rows))
    ours, hf = rows[2], rows[3 + bool(args.naive)]
    print(f"\ndraft model γ={args.gamma}: {ours.tokens_per_second / rows[0].tokens_per_second:.2f}x target only, "
          f"{ours.tokens_per_second / hf.tokens_per_second:.2f}x {hf.method} "
          f"({ours.tokens_per_second / max(r.tokens_per_second for r in rows if r.method.startswith('HF assisted')):.2f}x "
          "the fastest HF assisted row)")
    return 0 if all(r.same == r.prompts for r in rows) else 1


# `specdec-lab bench --method NAME` runs METHODS[NAME](args); later chapters add their methods here.
METHODS = {"draft": bench_draft}


def add_arguments(parser) -> None:
    parser.add_argument("--method", choices=sorted(METHODS), default="draft", help="what to benchmark")
    parser.add_argument("--pair", default="tiny", help="model pair for zoo.load_pair (default: the embedded one)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=3, help="draft tokens per target pass (default 3: the "
                        "best for the zoo pair on a 2-core CPU, see notebook 03)")
    parser.add_argument("--category", choices=["code", "edit", "doc"], help="only this prompt category")
    parser.add_argument("--limit", type=int, help="only the first N prompts")
    parser.add_argument("--naive", action="store_true", help="also time the loop without KV caches")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
