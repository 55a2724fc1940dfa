"""Side-by-side benchmarks on the held-out prompt suite (batch 1): `specdec-lab bench`.

`specdec-lab bench` (chapter 08's showdown) runs every method of the course, plus Hugging Face's assisted
generation and prompt lookup, on the same models and prompts, greedy and at temperature 0.7, and reports
per prompt category τ (tokens per target pass), target passes, tokens per second, the speedup over plain
decoding measured in the same run, and on how many prompts the greedy output equals plain decoding's token
for token. `specdec-lab bench --method draft` is chapter 03's narrower table (draft model against HF).
`specdec-lab bench --batch B` is chapter 09's batched showdown: the chain methods decoding B prompts at a time.

Every method decodes the same prompts with the same max_new_tokens and EOS. Methods run interleaved, prompt
by prompt (so a slow spell on a shared machine hits all of them alike), after a warm-up on the first
prompt. Hugging Face's passes are counted with a forward hook on the target. When sampling, torch's global
generator is seeded per prompt, so a run repeats exactly. Ctrl-C stops a run and keeps what was measured: `run`
and `showdown` raise `Interrupted`, whose `partial` holds the prompts every method finished, and the command
line saves those results (marked partial) to its --json/--csv files.

Used by notebooks/03_draft_target.ipynb, 06_eagle.ipynb, 08_showdown.ipynb and by the command line, whose
handlers (flags in, exit code out) live in `__main__`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specdec_lab import chat, prompts as suite

CATEGORIES = tuple(dict.fromkeys(suite.CATEGORIES + chat.CATEGORIES))  # the zoo suite's, then the chat prompts'
# (code, edit, doc, chat, rewrite: a real chat model's prompts share "code" with the suite)

__all__ = ["Row", "Interrupted", "run", "draft_methods", "format_table", "count_calls", "showdown_methods",
           "showdown", "format_showdown", "leaderboard_markdown", "save_results", "batch_methods", "batch_showdown",
           "format_batch_showdown"]


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


# A method maps (input_ids [1, T]) to (new token ids, target passes or None to count them with a hook).
Method = Callable[[torch.Tensor], tuple[list[int], int | None]]


def draft_methods(target, draft, max_new_tokens: int = 64, gamma: int = 3, eos_token_id=None,
                  naive: bool = False, hf_defaults: bool = True) -> dict[str, Method]:
    """Plain decoding (ours and HF's), the draft-model drafter (cached; naive optional), HF assisted."""
    from specdec_lab import measure  # imported here so that `specdec-lab --help` stays quick
    from specdec_lab.decoding import generate, generate_naive
    from specdec_lab.drafters import DraftModelDrafter

    n, eos = max_new_tokens, eos_token_id

    def ours(drafter_factory):
        def call(ids):
            gen = generate(target, ids, drafter_factory(), max_new_tokens=n, eos_token_id=eos)
            return gen.tokens, gen.target_calls
        return call

    def hf(**kw):
        return lambda ids: (measure.hf_generate(target, ids, n, eos_token_id=eos, **kw).tolist(), None)

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
        progress: bool | str = False, seed: int | None = None, drafting=None) -> list[Row]:
    """Time every method on every prompt (interleaved); the first method is the reference for `same`.

    seed: when sampling, torch.manual_seed(seed + i) before every method's run on prompt i. Without a seed
    (greedy) every mismatch is classified as a tie or a bug (`identity.compare`): each row's `verdicts`.
    progress: a progress bar (tqdm, on stderr); a string is its label.
    drafting: the modules the methods draft with (a draft model, heads, nets, the target's LM head): given, each
    row also records the seconds spent inside the target's and their forwards (`measure.ForwardTimer`).
    """
    from contextlib import nullcontext

    from tqdm.auto import tqdm

    from specdec_lab.measure import ForwardTimer

    rows = {name: Row(name) for name in methods}
    bar = tqdm(total=len(prompts) * len(methods), desc=progress if isinstance(progress, str) else "bench",
               disable=not progress, leave=True)
    timer = ForwardTimer(target, drafting) if drafting is not None else None
    try:
        with torch.inference_mode(), timer or nullcontext():
            for _ in range(warmup):
                for method in methods.values():
                    method(prompts[0])
            for i, ids in enumerate(prompts):
                for name, method in methods.items():
                    if seed is not None:
                        torch.manual_seed(seed + i)
                    inside = sum(timer.seconds.values()) if timer else 0.0
                    with count_calls(target) as calls:
                        start = time.perf_counter()
                        tokens, passes = method(ids)
                        seconds = time.perf_counter() - start
                    inside = sum(timer.seconds.values()) - inside if timer else 0.0
                    row = rows[name]
                    passes = passes if passes is not None else len(calls)
                    row.tokens += len(tokens)
                    row.target_calls += passes
                    row.seconds += seconds
                    row.prompts += 1
                    row.outputs.append(tokens)
                    row.calls_each.append(passes)
                    row.seconds_each.append(seconds)
                    row.forward_each.append(inside)
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
    from specdec_lab import identity

    for row in rows:
        row.same = sum(a == b for a, b in zip(row.outputs, rows[0].outputs))
        if greedy:
            row.verdicts = identity.compare(target, prompts, row.outputs, rows[0].outputs).verdicts()
    return rows


def format_table(rows: list[Row]) -> str:
    """The rows as a fixed-width table; speedup relative to the first row."""
    base = rows[0].tokens_per_second
    width = max(len(r.method) for r in rows)
    lines = [f"{'method':<{width}} | {'τ':>5} | {'target calls':>12} | {'tokens/s':>8} | {'speedup':>7} | same output",
             "-" * (width + 58)]
    for r in rows:
        lines.append(f"{r.method:<{width}} | {r.tau:5.2f} | {r.target_calls:12d} | {r.tokens_per_second:8.1f} | "
                     f"{r.tokens_per_second / base:6.2f}x | "
                     + _identical(dict(identical=r.same, prompts=r.prompts, ties=r.ties, bugs=r.bugs)))
    return "\n".join(lines)


def suite_prompts(tokenizer, category: str | None = None, limit: int | None = None) -> list[torch.Tensor]:
    """The held-out prompt suite as [1, T] id tensors."""
    from specdec_lab.prompts import load_prompts

    prompts = load_prompts(category)[:limit]
    return [tokenizer(p["prompt"], return_tensors="pt").input_ids for p in prompts]


# ---- chapter 08: the showdown ------------------------------------------------------------------------

TEMPERATURES = (0.0, 0.7)  # greedy, and the sampling temperature of the showdown
EARLY_EXIT = 8  # the draft model of a real model without a small sibling here: its first 8 layers


def showdown_methods(target, draft, max_new_tokens: int = 64, temperature: float = 0.0, eos_token_id=None,
                     gamma: int = 3, branching: Sequence[int] = (2, 2, 1, 1), heads: dict | None = None,
                     drafting: list | None = None, auto: bool = False) -> dict[str, Method | str]:
    """Every method of the course at one temperature: {name: method, or a string saying why it cannot run}.

    The settings are the chapters' defaults for the zoo pair: draft chain γ=3 (03: near the peak of the measured
    speedup, which is flat there; which γ is fastest changes from run to run), tree [2, 2, 1, 1]
    (04), Medusa's 24-node tree (05), EAGLE-1 chain γ=4 and EAGLE-2's dynamic tree for EAGLE-2 and -3 (06),
    prompt lookup (10 tokens, n-grams up to 3) and lookahead W=4, N=4, G=4 (07). heads: {method: folder} of
    the Medusa heads and EAGLE drafts to use (None: `heads.find(target)`, the zoo's for the zoo target, else what
    `specdec-lab train-heads` trained for it); a method without any is left out, saying how to train it.
    drafting: a list that receives every module the methods draft with (for `run(..., drafting=)`).
    auto: also the tuned settings (`tune`, chapter 08 section 7), each after its default: the draft model's chain
    and tree (`tune.auto_draft_model`), EAGLE-2's and EAGLE-3's dynamic trees (`tune.auto_eagle`). The tuner
    measures this device here, before any timing, and each name says what it picked.
    """
    from specdec_lab import measure, tune
    from specdec_lab.decoding import generate
    from specdec_lab.drafters import DraftModelDrafter
    from specdec_lab.lookahead import lookahead_generate
    from specdec_lab.ngram import PromptLookupDrafter

    n, eos, T = max_new_tokens, eos_token_id, temperature

    def ours(make):
        def call(ids):
            gen = generate(target, ids, make(), max_new_tokens=n, temperature=T, eos_token_id=eos)
            return gen.tokens, gen.target_calls
        return call

    def hf(**kw):
        return lambda ids: (measure.hf_generate(target, ids, n, eos_token_id=eos, temperature=T, **kw).tolist(), None)

    def tuned(auto, describe):  # (name, method) of a tuned drafter: the tuner measures here, once (remembered)
        drafter, pick = auto()
        return f"{describe(pick.settings)} (auto)", ours(lambda: drafter)  # generate's start() resets it

    methods: dict[str, Method | str] = {
        "target only": ours(lambda: None),
        f"draft model, chain γ={gamma}": ours(lambda: DraftModelDrafter(draft, gamma)),
    }
    if auto:
        name, method = tuned(lambda: tune.auto_draft_model(target, draft, chain=True),
                             lambda s: f"draft model, chain γ={len(s['branching'])}")
        methods[name] = method
    methods[f"draft model, tree {list(branching)}"] = ours(lambda: DraftModelDrafter(draft, branching=list(branching)))
    if auto:
        name, method = tuned(lambda: tune.auto_draft_model(target, draft),
                             lambda s: f"draft model, tree {s['branching']}")
        methods[name] = method
    from specdec_lab import heads as trained
    from specdec_lab.eagle import EagleDrafter, EagleNet
    from specdec_lab.medusa import MedusaDrafter, MedusaHeads

    heads = trained.find(target) if heads is None else heads
    nets = {m: _loaded(target, heads[m], EagleNet.from_pretrained) for m in ("eagle1", "eagle3") if m in heads}
    if "medusa" in heads:
        medusa = MedusaHeads.from_pretrained(target, heads["medusa"])
        methods[f"Medusa, {len(MedusaDrafter(medusa).choices)}-node tree"] = ours(lambda: MedusaDrafter(medusa))
    else:
        methods["Medusa, 24-node tree"] = trained.missing(target, "medusa")
    for name, method, make in [("EAGLE-1, chain γ=4", "eagle1", lambda net: EagleDrafter(net, [1, 1, 1, 1])),
                               ("EAGLE-2, dynamic tree", "eagle1", lambda net: EagleDrafter(net, dynamic=True)),
                               ("EAGLE-3, dynamic tree", "eagle3", lambda net: EagleDrafter(net, dynamic=True))]:
        net = nets.get(method)
        methods[name] = ours(lambda make=make, net=net: make(net)) if net else trained.missing(target, method)
        if auto and net and "dynamic" in name:
            tuned_name, tuned_method = tuned(lambda net=net: tune.auto_eagle(target, net),
                                             lambda s: f"{name.split(',')[0]}, tree {s['budget']} nodes, depth {s['depth']}")
            methods[tuned_name] = tuned_method
    if drafting is not None:  # whatever drafts: the draft model (HF's assistant too), heads, nets, the LM head they read
        drafting += [draft, target.get_output_embeddings(), *nets.values()] + ([medusa] if "medusa" in heads else [])
        drafting += [m for net in nets.values() for m in (net.fuse, net.out_norm) if m is not None]  # EAGLE-3's,
        # called outside the net's forward (the fuse of the target's states at commit, the norm before the head)
    methods["prompt lookup (10, 3)"] = ours(lambda: PromptLookupDrafter(10, 3))
    if T == 0:
        def lookahead(ids):
            gen = lookahead_generate(target, ids, n, eos_token_id=eos, window=4, ngram=4, guesses=4)
            return gen.tokens, gen.target_calls
        methods["lookahead (4, 4, 4)"] = lookahead
    else:
        methods["lookahead (4, 4, 4)"] = "greedy only (its Jacobi window and n-gram check compare argmaxes)"
    methods[f"HF assisted, γ={gamma}"] = hf(assistant=draft, num_assistant_tokens=gamma)
    methods["HF prompt lookup, 10"] = hf(prompt_lookup_num_tokens=10)
    return methods


_LOADED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {folder: module}


def _loaded(target, folder, load):
    """`load(target, folder)`, once per target and folder: every temperature of a showdown drafts with the same
    modules, so what `tune` measured for them at the first one (and remembers per module) holds for the next."""
    per_target = _LOADED.setdefault(target, {})
    if str(folder) not in per_target:
        per_target[str(folder)] = load(target, folder)
    return per_target[str(folder)]


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


def showdown(target, draft, tokenizer, prompts: list[dict] | None = None, temperatures: Sequence[float] = TEMPERATURES,
             max_new_tokens: int = 64, heads: dict | None = None, progress: bool = False, template: bool = False,
             **settings) -> list[dict]:
    """Run `showdown_methods` on the prompt suite at each temperature; one result dict per (temperature,
    method, category), category "all" included, and one per method that cannot run (its "skipped" says why).

    Each dict: temperature, method, category, prompts, tokens, target_calls, seconds, tau, tokens_per_s,
    speedup (over "target only" in the same category and run), identical (prompts whose output equals plain
    decoding's; greedy only, None when sampling), skipped. prompts: load_prompts() entries (default: all 52).
    template: each prompt is a user message in the tokenizer's chat template (a chat model; `chat.held_out()`).
    Ctrl-C raises `Interrupted` with the results so far: earlier temperatures whole, the current one over the
    prompts every method finished.
    """
    from specdec_lab.prompts import load_prompts

    prompts = load_prompts() if prompts is None else prompts
    device = next(target.parameters()).device
    ids = [(chat.chat_ids(tokenizer, p["prompt"]) if template else tokenizer(p["prompt"], return_tensors="pt").input_ids)
           .to(device) for p in prompts]
    results = []
    for T in temperatures:
        try:
            drafting = []
            methods = showdown_methods(target, draft, max_new_tokens, T, tokenizer.eos_token_id,
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


def format_showdown(results: list[dict], temperature: float) -> str:
    """One temperature's results as two fixed-width tables: all prompts, then the speedup by category."""
    rows = [r for r in results if r["temperature"] == temperature]
    every = [r for r in rows if r["category"] == "all"]
    width = max(len(r["method"]) for r in every)
    greedy = temperature == 0
    head = (f"{'method':<{width}} |     τ | target calls | tokens/s | speedup |  limit | eff. | "
            + ("identical" if greedy else ""))
    lines = [f"temperature {temperature:g}" + (" (greedy)" if greedy else " (sampling)"), head, "-" * len(head)]
    for r in every:
        if r["skipped"]:
            lines.append(f"{r['method']:<{width}} | n/a: {r['skipped']}")
            continue
        same = _identical(r) if greedy else ""
        limit = f"{r['limit']:5.2f}x | {r['efficiency']:4.2f}" if r.get("limit") else "    -- |   --"
        lines.append(f"{r['method']:<{width}} | {r['tau']:5.2f} | {r['target_calls']:12d} | {r['tokens_per_s']:8.1f} | "
                     f"{r['speedup']:6.2f}x | {limit} | {same}")
    cats = [c for c in CATEGORIES if any(r["category"] == c for r in rows)]
    lines += ["", f"{'speedup by category':<{width}} | " + " | ".join(f"{c:>6}" for c in cats + ["all"])]
    for r in every:
        if not r["skipped"]:
            by = {x["category"]: x["speedup"] for x in rows if x["method"] == r["method"]}
            lines.append(f"{r['method']:<{width}} | " + " | ".join(f"{by[c]:5.2f}x" for c in cats + ["all"]))
    return "\n".join(lines)


def leaderboard_markdown(results: list[dict]) -> str:
    """The README's leaderboard, from a greedy (0) and a sampled run: τ, speedup per category, the limit the method's
    own forwards allow and the share of it reached (greedy), identity, and the sampled run's τ and speedup."""
    temps = sorted({r["temperature"] for r in results})
    if temps[0] != 0 or len(temps) != 2:
        raise ValueError(f"the leaderboard wants one greedy and one sampled temperature, got {temps}")
    T = temps[1]
    get = {(r["temperature"], r["method"], r["category"]): r for r in results}
    cats = [c for c in CATEGORIES if any(r["category"] == c for r in results)]
    lines = [f"| method | τ | speedup: {' | '.join(cats)} | **all** | limit | efficiency | identical to greedy | "
             f"τ at T = {T:g} | speedup at T = {T:g} |", "|---" * (len(cats) + 8) + "|"]
    for r in (r for r in results if r["temperature"] == 0 and r["category"] == "all"):
        m = r["method"]
        by = " | ".join(f"{get[0, m, c]['speedup']:.2f}x" for c in CATEGORIES if (0, m, c) in get)
        s = get[T, m, "all"]
        sampled = "greedy only | greedy only" if s["skipped"] else f"{s['tau']:.2f} | {s['speedup']:.2f}x"
        limit = f"{r['limit']:.2f}x | {r['efficiency']:.2f}" if r.get("limit") else "-- | --"
        lines.append(f"| {m} | {r['tau']:.2f} | {by} | **{r['speedup']:.2f}x** | {limit} | {_identical(r)} | "
                     f"{sampled} |")
    return "\n".join(lines)


def _identical(r: dict) -> str:
    """'52/52', or with the mismatches named: '51/52 (1 tie)', '50/52 (1 tie, 1 BUG)'."""
    ties, bugs = r.get("ties") or 0, r.get("bugs") or 0
    notes = [f"{ties} {'tie' if ties == 1 else 'ties'}"] if ties else []
    notes += [f"{bugs} BUG{'S' * (bugs > 1)}"] if bugs else []
    return f"{r['identical']}/{r['prompts']}" + (f" ({', '.join(notes)})" if notes else "")


def save_results(results: list[dict], meta: dict, json_path=None, csv_path=None) -> None:
    """Write the showdown's results: JSON ({"meta": ..., "results": [...]}) and/or CSV (one line per result)."""
    import csv
    import json
    from pathlib import Path

    for path in (json_path, csv_path):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if json_path:
        Path(json_path).write_text(json.dumps({"meta": meta, "results": results}, indent=1, ensure_ascii=False) + "\n")
    if csv_path:
        with open(csv_path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(results[0]))
            writer.writeheader()
            writer.writerows(results)


# ---- chapter 09: the batched showdown --------------------------------------------------------------------


def batch_methods(target, draft, gamma: int = 3, heads: dict | None = None) -> dict:
    """The chain methods `serving.generate_batch` runs: {name: drafter (None: plain decoding), or why not}.
    The same settings as the showdown's chains: draft model γ, EAGLE-1 chain γ=4, prompt lookup (10, 3)."""
    from specdec_lab import heads as trained
    from specdec_lab.drafters import DraftModelDrafter
    from specdec_lab.eagle import EagleDrafter, EagleNet
    from specdec_lab.ngram import PromptLookupDrafter

    heads = trained.find(target) if heads is None else heads
    eagle = (EagleDrafter(EagleNet.from_pretrained(target, heads["eagle1"]), [1, 1, 1, 1]) if "eagle1" in heads
             else trained.missing(target, "eagle1"))
    return {"target only": None, f"draft model, chain γ={gamma}": DraftModelDrafter(draft, gamma),
            "EAGLE-1, chain γ=4": eagle, "prompt lookup (10, 3)": PromptLookupDrafter(10, 3)}


def batch_showdown(target, draft, tokenizer, prompts: list[dict] | None = None, batch: int = 8,
                   temperatures: Sequence[float] = (0.0,), max_new_tokens: int = 64, gamma: int = 3,
                   heads: dict | None = None, progress: bool = False) -> list[dict]:
    """`batch_methods` decoding the prompts `batch` at a time with `serving.generate_batch`, interleaved chunk by
    chunk, at each temperature; one dict per (temperature, method), plus "target only, batch 1" (one prompt at a
    time with `generate`: the reference of the greedy identity check, and what batching itself gains).

    Each dict: temperature, method, batch, prompts, tokens, steps (batched target passes), row_passes (passes
    summed over rows), seconds, tau (tokens / row_passes), tokens_per_s, speedup (over batched plain decoding in
    the same run), identical (rows equal to their own single-sequence greedy decoding; greedy only), skipped.
    """
    from tqdm.auto import tqdm

    from specdec_lab.decoding import generate
    from specdec_lab.prompts import load_prompts
    from specdec_lab.serving import generate_batch

    prompts = load_prompts() if prompts is None else prompts
    ids = [tokenizer(p["prompt"]).input_ids for p in prompts]
    chunks = [ids[s:s + batch] for s in range(0, len(ids), batch)]
    methods = batch_methods(target, draft, gamma, heads)
    runnable = {name: d for name, d in methods.items() if not isinstance(d, str)}
    eos, results = tokenizer.eos_token_id, []
    for T in temperatures:
        kw = dict(max_new_tokens=max_new_tokens, temperature=T, eos_token_id=eos)
        single = Row("target only, batch 1")
        rows = {name: Row(name) for name in runnable}
        steps = dict.fromkeys(runnable, 0)
        for name, drafter in runnable.items():  # warm-up
            generate_batch(target, chunks[0], drafter, **dict(kw, max_new_tokens=4))
        bar = tqdm(total=len(chunks) * (len(runnable) + 1), desc=f"batch {batch}, T={T:g}", disable=not progress)
        for i, chunk in enumerate(chunks):
            start = time.perf_counter()
            for p in chunk:
                g = torch.Generator().manual_seed(i)
                gen = generate(target, [p], generator=g, **kw)
                single.outputs.append(gen.tokens)
                single.tokens += len(gen.tokens)
                single.target_calls += gen.target_calls
            single.seconds += time.perf_counter() - start
            bar.update()
            for name, drafter in runnable.items():
                out = generate_batch(target, chunk, drafter, generator=torch.Generator().manual_seed(i), **kw)
                row = rows[name]
                row.outputs += out.tokens
                row.tokens += out.new_tokens
                row.target_calls += sum(g.target_calls for g in out.rows)
                row.seconds += out.seconds
                steps[name] += out.steps
                bar.update()
        bar.close()
        base = rows["target only"]
        for row, n_steps, B in [(single, single.target_calls, 1)] + [(rows[m], steps[m], batch) for m in runnable]:
            same = sum(a == b for a, b in zip(row.outputs, single.outputs)) if T == 0 else None
            results.append(dict(temperature=T, method=row.method, batch=B, prompts=len(ids), tokens=row.tokens,
                                steps=n_steps, row_passes=row.target_calls, seconds=round(row.seconds, 4),
                                tau=round(row.tau, 4), tokens_per_s=round(row.tokens_per_second, 2),
                                speedup=round(row.tokens_per_second / base.tokens_per_second, 4), identical=same,
                                skipped=None))
        results += [dict(temperature=T, method=name, batch=batch, prompts=0, tokens=0, steps=0, row_passes=0,
                         seconds=0.0, tau=None, tokens_per_s=None, speedup=None, identical=None, skipped=why)
                    for name, why in methods.items() if isinstance(why, str)]
    return results


def format_batch_showdown(results: list[dict], temperature: float) -> str:
    """One temperature's batched results as a fixed-width table."""
    rows = [r for r in results if r["temperature"] == temperature]
    width = max(len(r["method"]) for r in rows)
    greedy = temperature == 0
    head = (f"{'method':<{width}} | batch |     τ | batched passes | tokens/s | speedup | "
            + ("identical to its own greedy" if greedy else ""))
    lines = [f"temperature {temperature:g}" + (" (greedy)" if greedy else " (sampling)") + ": speedup over batched "
             "plain decoding (target only) in the same run", head, "-" * len(head)]
    for r in rows:
        if r["skipped"]:
            lines.append(f"{r['method']:<{width}} | n/a: {r['skipped']}")
            continue
        same = f"{r['identical']}/{r['prompts']}" if greedy else ""
        lines.append(f"{r['method']:<{width}} | {r['batch']:5d} | {r['tau']:5.2f} | {r['steps']:14d} | "
                     f"{r['tokens_per_s']:8.1f} | {r['speedup']:6.2f}x | {same}")
    return "\n".join(lines)
