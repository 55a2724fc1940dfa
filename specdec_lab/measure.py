"""Measurements: the course's one way to time forward passes (its two cost ratios c and v(n)), Hugging Face's
own `generate` as the baseline every decoder is checked and timed against (`hf_generate`), where the target's token
ranks among a draft's guesses (`draft_ranks`, `hit_rates`), and what a draft tree achieves on one prompt
(`topk_hit_rates`, `measure_tree`, chapter 04's explorer).

    c    = time of one cached 1-token draft forward / time of one cached 1-token target forward
    v(n) = time of one cached n-token target forward / time of one cached 1-token target forward   (v(1) = 1)

Both at the same context (128 tokens by default), on one torch thread unless told otherwise. A speculative
round with a chain of γ drafts then costs γ·c + v(γ + 1) target steps (chapter 02). Two ways to take the times, always named:

- "loop" (the default, what the speedup formula needs): the models take turns, as in the decoding loop, so
  each call finds the caches as cold as the loop leaves them. On a CPU this makes a small draft look dearer.
- "bench": each model runs its own block of calls, opened by one untimed call so its weights are warm, as
  benchmarks and model cards report.

Every round visits every (model, n) once in a shuffled order; round 0 is a warm-up. The statistic is the
MINIMUM over the rounds: load from other programs can only add time, so the minimum is the figure that
repeats on a busy machine, where a median does not. `best_times` is that timer, and the tuner times with it too.

    t = forward_costs({"target": target, "draft": draft}, ns=range(1, 10))
    c, v = cost_ratios(t)          # c, {n: v(n)}
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable

import torch

from specdec_lab import lm

__all__ = ["PATTERNS", "forward_costs", "best_times", "cost_ratios", "ForwardTimer", "bandwidth", "product_rates",
           "predicted_v", "round_shape", "predicted_speedup", "pass_against_steps", "step_profile", "hf_generate",
           "draft_ranks", "hit_rates", "topk_hit_rates", "measure_tree"]

PATTERNS = ("loop", "bench")


@torch.inference_mode()
def forward_costs(models: dict, ns: Iterable[int] = (1,), context: int = 128, rounds: int = 40,
                  pattern: str = "loop", seed: int = 0, batch: int = 1, threads: int = 1) -> dict[tuple[str, int], float]:
    """{(name, n): milliseconds} of one cached forward over n new tokens after `context` tokens: the minimum
    over `rounds` interleaved rounds (after one warm-up round).

    threads: torch threads to time on (1 by default; time at the thread count the decoding you predict runs at).
    batch: requests decoded together, each with its own `context` tokens and n new ones per call (a server's
    batch: v(n) and c at batch B are the ratios of these times, as in economics.Roofline.step_time(B, n)).

    models: {name: model}; the first is the target: it is timed at every n, the others (drafts) at n = 1.
    pattern: "loop" times, for each n in a shuffled order, the target over n tokens then each draft over one
    token; "bench" times each model's calls in a block of its own (shuffled within the block).
    """
    if pattern not in PATTERNS:
        raise ValueError(f"pattern={pattern!r}: use 'loop' (models take turns, as in decoding) or 'bench' "
                         "(each model in a block of its own)")
    if not (isinstance(batch, int) and batch >= 1):
        raise ValueError(f"batch={batch!r}: give a whole number of requests, 1 or more")
    ns = sorted(set(ns) | {1})
    names = list(models)
    first = models[names[0]]
    device = next(first.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    vocab = first.config.vocab_size
    prefix = torch.randint(0, vocab, (batch, context), generator=gen).to(device)  # [B, context]
    new = torch.randint(0, vocab, (batch, max(ns)), generator=gen).to(device)  # [B, n_max]
    caches = {name: lm.new_cache(model) for name, model in models.items()}
    for name, model in models.items():
        lm.forward(model, prefix, caches[name])  # the context, read once; every timed call is cropped back to it

    def forward(name: str, n: int) -> None:
        lm.forward(models[name], new[:, :n], caches[name])  # [B, n, V]; cropped back to the context after

    def crop(key: tuple[str, int]) -> None:
        lm.crop(caches[key[0]], context)

    calls = [(names[0], n) for n in ns]
    if pattern == "loop":  # target over n, then every draft over one token: the loop's alternation
        calls = [call for n in ns for call in [(names[0], n)] + [(d, 1) for d in names[1:]]]
        groups = [calls[i: i + len(names)] for i in range(0, len(calls), len(names))]
    else:
        groups = [[call] for call in calls] + [[(d, 1)] for d in names[1:]]

    def schedule(r: int):  # round r's calls, in order; (None, f): f runs untimed
        order = torch.randperm(len(groups), generator=gen).tolist()
        if pattern == "bench":  # keep each model's calls together, shuffled within its block
            order.sort(key=lambda i: names.index(groups[i][0][0]))
        last = None
        for i in order:
            for name, n in groups[i]:
                if pattern == "bench" and name != last:
                    yield None, lambda name=name: (forward(name, 1), crop((name, 1)))  # the block starts warm
                last = name
                yield (name, n), lambda name=name, n=n: forward(name, n)

    with _threads(threads):
        return best_times(schedule, rounds, device, after=crop)


def best_times(schedule, rounds: int, device=None, after=None) -> dict:
    """The course's one timer: {key: milliseconds}, each timed call's MINIMUM over `rounds` rounds.

    schedule(r) yields round r's calls in the order they run, as (key, function) pairs; key None runs the function
    untimed (it sets the scene: what runs just before the next call in the loop being measured). after(key), when
    given, runs untimed after each timed call (a cache cropped back, say). Round 0 warms up and is not kept.

    Why the minimum: load from other programs can only add time, so the minimum is the figure that repeats on a
    busy machine, where a median does not. `forward_costs` and the tuner (`tune.measure`) both time with it.
    """
    cuda = device is not None and torch.device(device).type == "cuda"
    best: dict = {}
    for r in range(rounds + 1):
        for key, call in schedule(r):
            if key is None:
                call()
                continue
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            if cuda:
                torch.cuda.synchronize()
            ms = 1e3 * (time.perf_counter() - t0)
            if after is not None:
                after(key)
            if r:  # round 0 warms up
                best[key] = min(ms, best.get(key, float("inf")))
    return best


def cost_ratios(times: dict[tuple[str, int], float], target: str = "target",
                draft: str = "draft") -> tuple[float | None, dict[int, float]]:
    """(c, {n: v(n)}) from `forward_costs` times; c is None when no draft was timed."""
    one = times[(target, 1)]
    c = times[(draft, 1)] / one if (draft, 1) in times else None
    v = {n: ms / one for (name, n), ms in sorted(times.items()) if name == target}
    return c, v


class ForwardTimer:
    """Seconds spent inside model forwards while decoding: `seconds` = {"target": s, "draft": s}.

    Hooks on the target and on every module that drafts (a draft model, Medusa heads, an EAGLE net, the target's
    LM head when a drafter reads it). Only outermost calls count: the target's own LM head inside its forward is
    the target's time. What a decoder spends OUTSIDE these forwards is its overhead (chapter 08's efficiency).

        with ForwardTimer(target, [draft]) as timer:
            generate(target, ids, DraftModelDrafter(draft))
        timer.seconds                   # {"target": ..., "draft": ...}
    """

    def __init__(self, target, drafting=()):
        self.kind = {id(m): "draft" for m in drafting if m is not None}
        self.kind[id(target)] = "target"
        self.modules = [target] + list({id(m): m for m in drafting if m is not None and m is not target}.values())
        self.seconds, self.handles, self.depth = {"target": 0.0, "draft": 0.0}, [], 0

    def _enter(self, module, args):
        if self.depth == 0:
            self.started, self.outer = time.perf_counter(), self.kind[id(module)]
        self.depth += 1

    def _leave(self, module, args, out):
        self.depth -= 1
        if self.depth == 0:
            self.seconds[self.outer] += time.perf_counter() - self.started

    def __enter__(self) -> ForwardTimer:
        for m in self.modules:
            self.handles += [m.register_forward_pre_hook(self._enter),
                             m.register_forward_hook(self._leave, always_call=True)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.handles, self.depth = [], 0


# ---- this machine's own roofline (chapter 11): bandwidth, the product rate by n, where one step's time goes ------


@contextlib.contextmanager
def _threads(threads: int):
    """Run the body on `threads` torch threads, then restore the count."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@torch.inference_mode()
def bandwidth(megabytes: int = 1024, rounds: int = 5, threads: int = 1) -> float:
    """Bytes per second this machine streams from memory: a sum over an fp32 tensor of `megabytes` (larger than the
    last-level cache: the default 1 GB is), the best of `rounds` reads. The roofline's BW for this CPU."""
    x = torch.ones(megabytes * 2**20 // 4)  # [n] fp32, written once so its pages exist
    with _threads(threads):
        t = best_times(lambda r: [("read", x.sum)], rounds)["read"] / 1e3  # seconds
    return x.numel() * 4 / t


@torch.inference_mode()
def product_rates(ns: Iterable[int] = (1, 2, 4, 8, 16, 32, 64), dtype: torch.dtype = torch.float32,
                  shape: tuple[int, int] = (576, 1536), rounds: int = 20, threads: int = 1) -> dict[int, float]:
    """{n: FLOP per second} of an n-token linear layer x [n, K] @ W [K, N] in `dtype`, its weights in cache (the
    default shape is one of SmolLM2-135M's MLP projections, 3.5 MB in fp32): the rate the arithmetic itself runs at.
    Small n is a matrix-vector product held back by reading W; the largest n nears the CPU's peak in that dtype."""
    K, N = shape
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=gen).to(dtype)  # [N, K] as nn.Linear stores it
    xs = {n: torch.randn(n, K, generator=gen).to(dtype) for n in ns}  # [n, K]
    calls = [(n, lambda n=n: torch.nn.functional.linear(xs[n], w)) for n in ns]  # [n, N]
    with _threads(threads):
        ms = best_times(lambda r: calls, rounds)
    return {n: 2 * n * K * N / (ms[n] / 1e3) for n in ns}


def predicted_v(params: int, bytes_per_param: int, bw: float, rates: dict[int, float], other_ms: float
                ) -> dict[int, float]:
    """{n: v(n)} a roofline built from this CPU's measurements predicts: the linear layers take
    max(2·N·n / rate(n), N·b / bw) (the arithmetic at the product rate measured at n, or reading the weights once),
    everything else takes `other_ms` at every n (what `step_profile` gave for one token). Pass the peak rate at
    every n for the classic roofline."""
    linear = {n: max(2 * params * n / rate, params * bytes_per_param / bw) * 1e3 for n, rate in rates.items()}  # ms
    return {n: (linear[n] + other_ms) / (linear[min(rates)] + other_ms) for n in rates}


def round_shape(gens) -> dict[str, float]:
    """What a method's rounds looked like over some `generate` runs: {"tau": tokens per target pass, "nodes": drafted
    tokens the target verified per pass, "depth": how deep the drafter proposed per pass}. The first pass of each
    run, which reads the prompt, is left out of nodes and depth."""
    passes = sum(g.target_calls - 1 for g in gens)
    return {"tau": sum(len(g.tokens) for g in gens) / sum(g.target_calls for g in gens),
            "nodes": sum(sum(g.draft_nodes[1:]) for g in gens) / max(passes, 1),
            "depth": sum(sum(g.draft_lengths[1:]) for g in gens) / max(passes, 1)}


def predicted_speedup(tau: float, nodes: float, levels: float, v: dict[int, float], c: float) -> float:
    """τ / (v(N + 1) + L·c): a round emits τ tokens for one target pass over its N drafted tokens and the pending
    one, plus L drafting forwards of c steps each. v: {n: steps} as measured, read piecewise-linearly between."""
    keys = sorted(v)
    n = min(max(nodes + 1, keys[0]), keys[-1])
    a = max(k for k in keys if k <= n)
    b = min(k for k in keys if k >= n)
    v_n = v[a] if a == b else v[a] + (v[b] - v[a]) * (n - a) / (b - a)
    return tau / (v_n + levels * c)


@torch.inference_mode()
def pass_against_steps(model, n: int = 8, context: int = 128) -> dict:
    """Row i of one cached n-token pass against n cached one-token steps after the same `context` random tokens:
    {"max_logit_diff", "argmax_equal", "rows"}. fp32 differs by summation order only; bf16 by its rounding."""
    device = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (1, context + n), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)

    def after_context():
        cache = lm.new_cache(model)
        lm.forward(model, ids[:, :context], cache)
        return cache

    whole = lm.forward(model, ids[:, context:], after_context())[0]                               # [n, V]
    cache = after_context()
    steps = torch.cat([lm.forward(model, ids[:, context + i:context + i + 1], cache)[0] for i in range(n)])  # [n, V]
    return {"max_logit_diff": (whole - steps).abs().max().item(),
            "argmax_equal": int((whole.argmax(-1) == steps.argmax(-1)).sum()), "rows": n}


@torch.inference_mode()
def step_profile(model, n: int = 1, context: int = 128, rounds: int = 5, threads: int = 1) -> dict[str, float]:
    """Where one cached forward over n tokens spends its time: {part: milliseconds}, the best of `rounds`.

    "layers' linears" (q, k, v, o and the MLP's three projections of every layer), "LM head", and "everything else"
    (attention, norms, rotary positions, masks, and the Python between the kernels), with "total". Forward hooks
    on every nn.Linear time the products; the hooks themselves add a few microseconds each to "everything else".
    """
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    spent = {"layers' linears": 0.0, "LM head": 0.0}
    started: dict[int, float] = {}

    def enter(module, args):
        started[id(module)] = time.perf_counter()

    def leave(part):
        def hook(module, args, out):
            spent[part] += time.perf_counter() - started[id(module)]
        return hook

    handles = [m.register_forward_pre_hook(enter) for m in linears + [head]]
    handles += [m.register_forward_hook(leave("layers' linears")) for m in linears]
    handles.append(head.register_forward_hook(leave("LM head")))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, context + n), generator=gen)  # [1, context + n]
    device = next(model.parameters()).device
    cache = lm.new_cache(model)
    best: dict[str, float] = {}
    try:
        with _threads(threads):
            lm.forward(model, ids[:, :context].to(device), cache)
            for r in range(rounds + 1):
                spent.update({k: 0.0 for k in spent})
                t0 = time.perf_counter()
                lm.forward(model, ids[:, context:].to(device), cache)  # [1, n, V]
                total = time.perf_counter() - t0
                lm.crop(cache, context)
                parts = dict(spent, **{"everything else": total - sum(spent.values()), "total": total})
                if r and parts["total"] < best.get("total", float("inf")) / 1e3:  # round 0 warms up
                    best = {k: 1e3 * v for k, v in parts.items()}
    finally:
        for h in handles:
            h.remove()
    return best


# ---- Hugging Face's own generate: the baseline every decoder of the course is compared with ------------------


def hf_generate(model, ids: torch.Tensor, max_new_tokens: int, eos_token_id=None, assistant=None,
                num_assistant_tokens: int = 4, schedule: str = "constant",
                confidence_threshold: float | None = None, prompt_lookup_num_tokens: int | None = None,
                temperature: float = 0.0) -> torch.Tensor:
    """Hugging Face's own `model.generate`, assisted by `assistant` when given: the new ids [n].

    temperature 0: greedy; otherwise sampling from softmax(logits / temperature) with no top-k or top-p
    (HF's default top_k=50 is switched off), drawing from torch's global generator.
    prompt_lookup_num_tokens: HF's prompt lookup decoding instead (draft length; HF's own n-gram size, 2).

    eos_token_id None: never stop early (the model's generation_config default is overridden).
    Assisted generation reads its draft settings from the ASSISTANT's generation_config, in 4.x and in 5.x
    alike: `num_assistant_tokens=...` passed to `generate()` itself is ignored there (5.24: the draft length
    stays at the assistant's default of 20, and its default confidence threshold of 0.4 cuts drafts short).
    So we set `num_assistant_tokens`, `num_assistant_tokens_schedule` and `assistant_confidence_threshold`
    (None or 0: off) on the assistant's config for this call and restore them afterwards ("heuristic"
    rewrites `num_assistant_tokens` in place).
    """
    from transformers.utils import logging as hf_logging

    # Keywords, not a GenerationConfig: 5.x fills a config's None fields from the model's defaults, which
    # would bring back the model's EOS; an explicit eos_token_id=None keyword switches it off.
    # The pad id stays the model's own (or None): HF's assistant masks every occurrence of the pad id in the
    # text, so a pad id that the model also generates (say 0) silently corrupts the drafts.
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                  attention_mask=torch.ones_like(ids))
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    saved = None
    if assistant is not None:
        assistant_config = assistant.generation_config
        keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        saved = {k: getattr(assistant_config, k, None) for k in keys}
        assistant_config.num_assistant_tokens = num_assistant_tokens
        assistant_config.num_assistant_tokens_schedule = schedule
        assistant_config.assistant_confidence_threshold = confidence_threshold or 0.0
        kwargs["assistant_model"] = assistant
    if prompt_lookup_num_tokens is not None:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
        if eos_token_id is None:  # 4.53's prompt lookup needs an EOS id to search for: one no model can emit
            kwargs["eos_token_id"] = model.config.get_text_config().vocab_size
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the assistant's inner generate() warns about its own config
    try:
        with torch.no_grad():
            out = model.generate(ids, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        if saved is not None:
            for k, v in saved.items():
                setattr(assistant.generation_config, k, v)
    # 4.53's prompt lookup can accept a whole candidate past max_new_tokens (greedy-correct tokens, too many of
    # them); cut to the budget so every method is compared on the same text.
    return out[0, ids.shape[1]:ids.shape[1] + max_new_tokens]


# ---- what a draft tree achieves on one prompt (chapter 04's explorer) ----------------------------------------


@torch.inference_mode()
def draft_ranks(draft, texts: list[tuple[torch.Tensor, int]], k: int = 4) -> list[list[int]]:
    """Per text (ids [1, T + n], T), the rank (0 = the draft's top choice, k = not in its top k) of each of the n
    continuation tokens among the draft's guesses there, teacher-forced: the draft reads the true text, as it does
    along an accepted path."""
    ranks = []
    for full, T in texts:
        logits = lm.forward(draft, full[:, :-1])[0, T - 1:]  # [n, V] the draft before each continuation token
        hits = logits.topk(k, -1).indices == full[0, T:, None]  # [n, k] where the target's token sits
        ranks.append(torch.where(hits.any(-1), hits.int().argmax(-1), k).tolist())
    return ranks


def hit_rates(ranks: list[list[int]], k: int = 4) -> list[float]:
    """hit[j-1] = P(the target's token is among the draft's top j), j = 1..k: h(j) of chapter 04; hit[0] is α."""
    flat = [r for text in ranks for r in text]
    return [sum(r < j for r in flat) / len(flat) for j in range(1, k + 1)]


def topk_hit_rates(target, draft, ids, max_new_tokens: int = 40, k: int = 4, eos_token_id=None) -> list[float]:
    """hit[j-1] = fraction of the target's greedy continuation of ids [1, T] whose token is among the draft's
    top j there (teacher-forced: the draft reads the prompt plus the target's own tokens), j = 1..k.

    Under greedy verification a level of j children after an accepted node is accepted exactly when this
    event happens at that position, so these are the h(j) of the tree model (hit[0] is the chain's α).
    """
    from specdec_lab.decoding import generate

    want = generate(target, ids, None, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id).tokens
    full = torch.cat([ids, torch.tensor([want], device=ids.device)], 1)  # [1, T + n]
    return hit_rates(draft_ranks(draft, [(full, ids.shape[1])], k), k)


def measure_tree(target, draft, ids, branching: list[int], max_new_tokens: int = 40, eos_token_id=None) -> dict:
    """The explorer's second mode: run the real pair with DraftModelDrafter(branching) on one prompt ids [1, T].

    Returns the measured τ (tokens per target pass), the nodes verified per pass, whether the output equals
    the target's greedy decoding, and the prediction `economics.tree_expected_tokens(branching, hit)` with the
    top-k hit rates measured on the same prompt (`topk_hit_rates`), for the tree and for the chain.
    """
    from specdec_lab.decoding import generate
    from specdec_lab.drafters import DraftModelDrafter
    from specdec_lab.economics import tree_expected_tokens

    hit = topk_hit_rates(target, draft, ids, max_new_tokens, max(branching), eos_token_id)
    want = generate(target, ids, None, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id).tokens
    gen = generate(target, ids, DraftModelDrafter(draft, branching=list(branching)), max_new_tokens=max_new_tokens,
                   eos_token_id=eos_token_id)
    return {
        "branching": list(branching),
        "hit": hit,
        "predicted_tau": tree_expected_tokens(branching, hit),
        "measured_tau": len(gen.tokens) / gen.target_calls,
        "target_calls": gen.target_calls,
        "nodes_per_pass": sum(gen.draft_nodes) / gen.target_calls,
        "same_as_greedy": gen.tokens == want,
    }
