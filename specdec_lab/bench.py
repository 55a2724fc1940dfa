"""The benchmark harness: `run` times methods side by side on the same prompts, one at a time or in batches, and
`showdown` and `batch_showdown` (`specdec-lab bench`) drive it over temperatures and prompt categories.

`specdec-lab bench` (chapter 08's showdown) runs every method of the course, plus Hugging Face's assisted
generation and prompt lookup, on the same models and prompts, greedy and at temperature 0.7, and reports
per prompt category τ (tokens per target pass), target passes, tokens per second, the speedup over plain
decoding measured in the same run, and on how many prompts the greedy output equals plain decoding's token
for token. `specdec-lab bench --method draft` is chapter 03's narrower table (draft model against HF).
`specdec-lab bench --batch B` is chapter 09's batched showdown: the chain methods decoding B prompts at a time.

Three modules, one job each: `lineup` builds the methods (what runs), this module times them (how it runs),
`report` prints and saves the results (what is shown); the command line's handlers live in `__main__`.

Every method decodes the same prompts with the same max_new_tokens and EOS. Methods run interleaved, prompt
by prompt or batch by batch (so a slow spell on a shared machine hits all of them alike), after a warm-up on the
first. Hugging Face's passes are counted with a forward hook on the target. When sampling, torch's global
generator is seeded per prompt (or batch), so a run repeats exactly. Ctrl-C stops a run and keeps what was
measured: `run` and `showdown` raise `Interrupted`, whose `partial` holds the prompts every method finished, and
the command line saves those results (marked partial) to its --json/--csv files.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from specdec_lab import chat, identity, lineup
from specdec_lab import prompts as suite
from specdec_lab.lineup import BatchMethod, Method
from specdec_lab.measure import ForwardTimer
from specdec_lab.prompts import load_prompts

CATEGORIES = tuple(dict.fromkeys(suite.CATEGORIES + chat.CATEGORIES))  # the zoo suite's, then the chat prompts'
# (code, edit, doc, chat, rewrite: a real chat model's prompts share "code" with the suite)

__all__ = ["CATEGORIES", "Row", "Interrupted", "count_calls", "run", "suite_prompts", "showdown", "batch_showdown"]


@dataclass
class Row:
    """One method's totals over the suite."""

    method: str
    tokens: int = 0
    target_calls: int = 0
    seconds: float = 0.0
    same: int = 0  # prompts whose output equals the reference row's
    prompts: int = 0
    verdicts: list[str] = field(default_factory=list, repr=False)  # greedy, per prompt: "same", "tie" or "bug"
    outputs: list[list[int]] = field(default_factory=list, repr=False)  # per prompt: the new tokens
    calls_each: list[int] = field(default_factory=list, repr=False)  # per prompt: target passes
    seconds_each: list[float] = field(default_factory=list, repr=False)  # per prompt: wall clock
    forward_each: list[float] = field(default_factory=list, repr=False)  # per prompt: seconds inside model forwards
    steps: int = 0  # batched target passes (run with a batch); each prompt's own passes are in calls_each

    @property
    def ties(self) -> int:
        return self.verdicts.count("tie")

    @property
    def bugs(self) -> int:
        return self.verdicts.count("bug")

    @property
    def tau(self) -> float:
        """Tokens emitted per target forward pass."""
        return self.tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def forward_seconds(self) -> float:
        """Seconds inside the target's and the drafter's forwards (`measure.ForwardTimer`); 0 when not timed."""
        return sum(self.forward_each)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a benchmark. `partial`: what the interrupted function returns, over the prompts that every
    method finished before the interrupt (a KeyboardInterrupt, so a notebook cell still stops as usual)."""

    def __init__(self, partial):
        super().__init__()
        self.partial = partial


@contextmanager
def count_calls(model):
    """Count forward calls of `model` (a list whose length grows by one per call)."""
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


def run(target, methods: dict[str, Method | BatchMethod], prompts: list[torch.Tensor], warmup: int = 2,
        progress: bool | str = False, seed: int | None = None, drafting=None, batch: int | None = None) -> list[Row]:
    """Time every method on every prompt (interleaved); the first method is the reference for `same`.

    batch: None, each method decodes one prompt [1, T] per call (`lineup.Method`); B, each decodes B prompts per
    call (`lineup.BatchMethod`), and a row's seconds_each shares a batch's time among its prompts.
    seed: when sampling, torch.manual_seed(seed + i) before every method's run on prompt (or batch) i. Without a
    seed (greedy) every mismatch is classified as a tie or a bug (`identity.compare`): each row's `verdicts`.
    progress: a progress bar (tqdm, on stderr); a string is its label.
    drafting: the modules the methods draft with (a draft model, heads, nets, the target's LM head): given, each
    row also records the seconds spent inside the target's and their forwards (`measure.ForwardTimer`).
    """
    size = batch or 1
    chunks = [prompts[s: s + size] for s in range(0, len(prompts), size)]
    rows = {name: Row(name) for name in methods}
    bar = tqdm(total=len(chunks) * len(methods), desc=progress if isinstance(progress, str) else "bench",
               disable=not progress, leave=True)
    timer = ForwardTimer(target, drafting) if drafting is not None else None
    try:
        with torch.inference_mode(), timer or nullcontext():
            for _ in range(warmup):
                for method in methods.values():
                    method(chunks[0] if batch else prompts[0])
            for i, chunk in enumerate(chunks):
                for name, method in methods.items():
                    if seed is not None:
                        torch.manual_seed(seed + i)
                    inside = sum(timer.seconds.values()) if timer else 0.0
                    with count_calls(target) as calls:
                        start = time.perf_counter()
                        if batch:
                            outputs, passes, steps = method(chunk)
                        else:
                            tokens, n = method(chunk[0])
                            outputs, passes, steps = [tokens], [n if n is not None else len(calls)], 0
                        seconds = time.perf_counter() - start
                    inside = sum(timer.seconds.values()) - inside if timer else 0.0
                    row, k = rows[name], len(chunk)
                    row.tokens += sum(map(len, outputs))
                    row.target_calls += sum(passes)
                    row.steps += steps
                    row.seconds += seconds
                    row.prompts += k
                    row.outputs += outputs
                    row.calls_each += passes
                    row.seconds_each += [seconds / k] * k
                    row.forward_each += [inside / k] * k
                    bar.update()
    except KeyboardInterrupt:
        done = min(row.prompts for row in rows.values())  # prompts that every method finished
        partial = [_subset(row, range(done)) for row in rows.values()]
        raise Interrupted(_same(target, prompts[:done], partial, seed is None)) from None
    finally:
        bar.close()
    return _same(target, prompts, list(rows.values()), seed is None)


def _same(target, prompts: list[torch.Tensor], rows: list[Row], greedy: bool) -> list[Row]:
    """Set each row's `same` (the prompts whose output equals the first row's) and, greedy, its `verdicts`: a
    mismatch is a near-tie of the target's logits (fine in half precision) or a bug (`identity.compare`)."""
    for row in rows:
        row.same = sum(a == b for a, b in zip(row.outputs, rows[0].outputs))
        if greedy:
            row.verdicts = identity.compare(target, prompts, row.outputs, rows[0].outputs).verdicts()
    return rows


def suite_prompts(tokenizer, category: str | None = None, limit: int | None = None) -> list[torch.Tensor]:
    """The held-out prompt suite as [1, T] id tensors."""
    prompts = load_prompts(category)[:limit]
    return [tokenizer(p["prompt"], return_tensors="pt").input_ids for p in prompts]


# ---- chapter 08: the showdown ------------------------------------------------------------------------

def _subset(row: Row, indices: Sequence[int]) -> Row:
    """The row restricted to some prompts (a category)."""
    sub = Row(row.method)
    for i in indices:
        sub.tokens += len(row.outputs[i])
        sub.target_calls += row.calls_each[i]
        sub.seconds += row.seconds_each[i]
        sub.prompts += 1
        sub.outputs.append(row.outputs[i])
        sub.calls_each.append(row.calls_each[i])
        sub.seconds_each.append(row.seconds_each[i])
        sub.forward_each += row.forward_each[i:i + 1]
        sub.verdicts += row.verdicts[i:i + 1]
    return sub


def _result(temperature: float, category: str, row: Row, base: Row) -> dict:
    """One line of the showdown: `row` against plain decoding's `base` on the same prompts.

    limit: the speedup the method's own forwards allow, measured in the same run: plain decoding's forward
    seconds per token over the method's (its target passes and its drafting), i.e. τ over the cost of one of its
    steps in one-token target passes. efficiency = speedup / limit: the share the loop's own work (verification,
    cache bookkeeping, Python outside the forwards) leaves of that limit. None when forwards were not timed.
    """
    same = sum(a == b for a, b in zip(row.outputs, base.outputs))
    speedup = row.tokens_per_second / base.tokens_per_second
    timed = row.forward_seconds > 0 and base.forward_seconds > 0
    limit = (base.forward_seconds / base.tokens) / (row.forward_seconds / row.tokens) if timed else None
    return dict(temperature=temperature, method=row.method, category=category, prompts=row.prompts,
                tokens=row.tokens, target_calls=row.target_calls, seconds=round(row.seconds, 4),
                tau=round(row.tau, 4), tokens_per_s=round(row.tokens_per_second, 2), speedup=round(speedup, 4),
                identical=same if temperature == 0 else None, ties=row.ties if temperature == 0 else None,
                bugs=row.bugs if temperature == 0 else None, skipped=None,
                forward_s=round(row.forward_seconds, 4) if timed else None,
                limit=round(limit, 4) if timed else None, efficiency=round(speedup / limit, 4) if timed else None)


def showdown(target, draft, tokenizer, prompts: list[dict] | None = None,
             temperatures: Sequence[float] = lineup.TEMPERATURES,
             max_new_tokens: int = 64, heads: dict | None = None, progress: bool = False, template: bool = False,
             **settings) -> list[dict]:
    """Run `lineup.showdown_methods` on the prompt suite at each temperature; one result dict per (temperature,
    method, category), category "all" included, and one per method that cannot run (its "skipped" says why).

    Each dict: temperature, method, category, prompts, tokens, target_calls, seconds, tau, tokens_per_s,
    speedup (over "target only" in the same category and run), identical (prompts whose output equals plain
    decoding's; greedy only, None when sampling), skipped. prompts: load_prompts() entries (default: all 52).
    template: each prompt is a user message in the tokenizer's chat template (a chat model; `chat.held_out()`).
    Ctrl-C raises `Interrupted` with the results so far: earlier temperatures whole, the current one over the
    prompts every method finished.
    """
    prompts = load_prompts() if prompts is None else prompts
    device = next(target.parameters()).device
    ids = [(chat.chat_ids(tokenizer, p["prompt"]) if template else tokenizer(p["prompt"], return_tensors="pt").input_ids)
           .to(device) for p in prompts]
    results = []
    for T in temperatures:
        try:
            drafting = []
            methods = lineup.showdown_methods(target, draft, max_new_tokens, T, tokenizer.eos_token_id,
                                       heads=heads, drafting=drafting, **settings)
            runnable = {name: m for name, m in methods.items() if not isinstance(m, str)}
            label = progress and f"T={T:g}"
            rows = run(target, runnable, ids, 1, label, seed=None if T == 0 else 0, drafting=drafting)
        except KeyboardInterrupt as stop:
            partial = getattr(stop, "partial", None)  # run's rows over the prompts it finished
            if partial and partial[0].prompts:
                results += _results(T, methods, prompts, partial)
            raise Interrupted(results) from None
        results += _results(T, methods, prompts, rows)
    return results


def _results(T: float, methods: dict[str, Method | str], prompts: list[dict], rows: list[Row]) -> list[dict]:
    """One temperature's result dicts, per category, from `run`'s rows (which may cover only the first prompts)."""
    rows = {row.method: row for row in rows}
    prompts = prompts[:rows["target only"].prompts]
    results = []
    for cat in ("all", *CATEGORIES):
        idx = [i for i, p in enumerate(prompts) if cat in ("all", p["category"])]
        if not idx:
            continue
        base = _subset(rows["target only"], idx)
        for name, method in methods.items():
            if not isinstance(method, str):
                results.append(_result(T, cat, _subset(rows[name], idx), base))
            elif cat == "all":  # cannot run here: one line that says why
                results.append(dict(temperature=T, method=name, category=cat, prompts=0, tokens=0,
                                    target_calls=0, seconds=0.0, tau=None, tokens_per_s=None, speedup=None,
                                    identical=None, ties=None, bugs=None, skipped=method, forward_s=None,
                                    limit=None, efficiency=None))
    return results


# ---- chapter 09: the batched showdown --------------------------------------------------------------------


def batch_showdown(target, draft, tokenizer, prompts: list[dict] | None = None, batch: int = 8,
                   temperatures: Sequence[float] = (0.0,), max_new_tokens: int = 64, gamma: int = 3,
                   heads: dict | None = None, progress: bool = False) -> list[dict]:
    """`lineup.batch_methods` decoding the prompts `batch` at a time (`run` with a batch), at each temperature; one
    dict per (temperature, method), "target only, batch 1" first (one prompt at a time with `generate`: the
    reference of the greedy identity check, and what batching itself gains).

    Each dict: temperature, method, batch, prompts, tokens, steps (batched target passes), row_passes (passes
    summed over rows), seconds, tau (tokens / row_passes), tokens_per_s, speedup (over batched plain decoding in
    the same run), identical (rows equal to their own single-sequence greedy decoding; greedy only), skipped.
    """
    prompts = load_prompts() if prompts is None else prompts
    ids = [tokenizer(p["prompt"], return_tensors="pt").input_ids for p in prompts]
    results = []
    for T in temperatures:
        methods = lineup.batch_methods(target, draft, max_new_tokens, T, tokenizer.eos_token_id, gamma, heads)
        runnable = {name: m for name, m in methods.items() if not isinstance(m, str)}
        rows = run(target, runnable, ids, 1, progress and f"batch {batch}, T={T:g}", 0 if T else None, batch=batch)
        base = next(row for row in rows if row.method == "target only")
        for row in rows:
            single = row.method == "target only, batch 1"
            results.append(dict(temperature=T, method=row.method, batch=1 if single else batch, prompts=len(ids),
                                tokens=row.tokens, steps=row.steps, row_passes=row.target_calls,
                                seconds=round(row.seconds, 4), tau=round(row.tau, 4),
                                tokens_per_s=round(row.tokens_per_second, 2),
                                speedup=round(row.tokens_per_second / base.tokens_per_second, 4),
                                identical=row.same if T == 0 else None, skipped=None))
        results += [dict(temperature=T, method=name, batch=batch, prompts=0, tokens=0, steps=0, row_passes=0,
                         seconds=0.0, tau=None, tokens_per_s=None, speedup=None, identical=None, skipped=why)
                    for name, why in methods.items() if isinstance(why, str)]
    return results
