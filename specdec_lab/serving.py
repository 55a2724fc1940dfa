"""Speculative decoding for a batch of requests: ragged acceptance, per-row caches, rows that leave.

Derived in notebooks/09_serving.ipynb.

    out = generate_batch(target, prompts, DraftModelDrafter(draft, gamma=3), max_new_tokens=64)
    out.tokens, out.steps, out.rows[0].tau        # new tokens per prompt, batched target passes, one row's τ

B prompts of different lengths decode together. Every step each row drafts its own chain (γ_b tokens, and
γ_b = 0 is plain decoding for that row), the target reads every row in ONE forward, and each row accepts its own
number of drafts. So after a step the rows' texts and caches have grown by different amounts: the batch is
ragged. Rows that reach EOS or their length budget leave it, and the batch shrinks.

The caches stay rectangular in `ragged.Ragged`, whose docstring says how: left padding, a mask of valid slots, and
one gather per layer as the rollback, which keeps chapter 03's invariant per row (cache length =
committed length - 1). vLLM avoids that copy with paged attention: each row's K/V in blocks of its own, rejected
slots freed in a block table.

Chain drafters only (what vLLM and SGLang batch too), through the drafter protocol's batch members
(`drafters.Drafter`: start_batch, propose_batch, commit_batch): the draft model (`DraftModelDrafter` with a chain)
and an EAGLE-1 chain (`EagleDrafter` with branching [1] * γ) draft every row in one forward per token; prompt
lookup (`PromptLookupDrafter`), and any drafter that writes only `propose`, drafts row by row. Each row is
verified and committed with generate's own helpers (`decoding.verify_and_cut`, `decoding.committed_rows`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec_lab import checks, lm
from specdec_lab.decoding import Generation, NoDraft, committed_rows, verify_and_cut
from specdec_lab.ragged import Ragged
from specdec_lab.sampling import Warp
from specdec_lab.tree import DraftTree

__all__ = ["BatchGeneration", "generate_batch", "switch_off_policy"]


@dataclass
class BatchGeneration:
    """What one call of `generate_batch` produced.

    rows: one `Generation` per prompt, in the prompts' order (its target_calls = the passes it took part in;
        its seconds = when it finished, from the start of the call). first_token_seconds: when each prompt's
        first new token was ready (time to first token, TTFT). steps: batched target passes.
    prefill_seconds, prefill_tokens: the first step, the prefill (the target reads every prompt, a draft model
        reads them too and drafts its first chain, EAGLE reads the target's states of them), and the new tokens
        it emitted; the steps after it are decoding (`decode_throughput`).
    """

    rows: list[Generation]
    steps: int = 0
    seconds: float = 0.0
    first_token_seconds: list[float] = field(default_factory=list)
    prefill_seconds: float = 0.0
    prefill_tokens: int = 0

    @property
    def tokens(self) -> list[list[int]]:
        return [g.tokens for g in self.rows]

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.rows)

    @property
    def throughput(self) -> float:
        """New tokens per second over the whole batch."""
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_throughput(self) -> float:
        """New tokens per second of the steps after the prefill: what a cost model of one decoding step predicts."""
        seconds = self.seconds - self.prefill_seconds
        return (self.new_tokens - self.prefill_tokens) / seconds if seconds > 0 else 0.0


def switch_off_policy(max_batch: int, min_alpha: float = 0.0) -> Callable:
    """A γ policy for generate_batch: the drafter's γ while at most `max_batch` rows are active, else 0
    (speculation off); and 0 for a row whose measured acceptance α fell below `min_alpha` after 4 passes."""
    def policy(batch_size: int, rows: Sequence[Generation], gamma: int) -> list[int]:
        if batch_size > max_batch:
            return [0] * len(rows)
        return [0 if len(g.accept_lengths) >= 4 and g.acceptance_rate < min_alpha else gamma for g in rows]
    return policy


def _prompts(target, prompts, max_new_tokens) -> list[list[int]]:
    if isinstance(prompts, Tensor) and prompts.dim() == 2:  # [B, T] without padding
        prompts = list(prompts)
    if isinstance(prompts, (str, Tensor)) or not isinstance(prompts, Sequence) or not len(prompts):
        raise checks.ArgumentError(f"prompts must be a non-empty list of prompts (each a list of token ids or a "
                                   f"[T] tensor), got {checks.show(prompts)}: for one prompt use generate(), or "
                                   "pass [tok(text).input_ids for text in texts]")
    vocab, context = target.config.get_text_config().vocab_size, lm.context_length(target)
    return [checks.prompt(p, max_new_tokens, vocab, context, "cpu")[0][0].tolist() for p in prompts]


@torch.inference_mode()
def generate_batch(target, prompts, drafter=None, max_new_tokens: int = 64, temperature: float = 0.0,
                   top_k: int | None = None, top_p: float | None = None, eos_token_id=None,
                   generator: torch.Generator | None = None, gamma=None) -> BatchGeneration:
    """Decode every prompt of `prompts` (token-id lists of any lengths) together, speculating with `drafter`.

    gamma: None (the drafter's), an int, a list (one per prompt), or a policy called each step as
    policy(active rows, their Generations so far, the drafter's γ) -> one γ per active row (`switch_off_policy`).
    Each row's output is exactly its own `generate()` output's distribution (greedy: the same tokens).
    """
    start = time.perf_counter()
    max_new_tokens = checks.integer(max_new_tokens, "max_new_tokens", "tokens to generate", 0)
    texts = _prompts(target, prompts, max_new_tokens)  # B lists; each grows by what its row commits
    drafter = checks.drafter(drafter) or NoDraft()
    lacks = [m for m in ("gamma", "start_batch", "propose_batch", "commit_batch") if not hasattr(drafter, m)]
    if lacks:
        raise checks.ArgumentError(f"{checks.show(drafter)} lacks the batch members {', '.join(lacks)}: subclass "
                                   "specdec_lab.drafters.Drafter (a drafter that writes only propose batches as is)")
    warp, eos = Warp(temperature, top_k, top_p, generator), checks.eos_ids(eos_token_id)
    out = BatchGeneration([Generation(tokens=[], target_calls=0) for _ in texts], 0, 0.0, [0.0] * len(texts))
    T0, active = [len(t) for t in texts], [i for i in range(len(texts)) if max_new_tokens > 0]
    cache = Ragged(lm.new_cache(target), len(active))  # row b of the caches is prompt active[b]
    if active:
        drafter.start_batch(target, [texts[i] for i in active])
    while active:
        live, budget = [texts[i] for i in active], [max_new_tokens - len(texts[i]) + T0[i] for i in active]
        gammas = [max(min(g, b - 1), 0) for g, b in zip(_gammas(gamma, drafter, active, out.rows), budget)]
        drafts = drafter.propose_batch(live, gammas, warp)  # 1. propose: a chain per row
        new = [t[h:] + d for t, h, (d, _) in zip(live, cache.lengths(), drafts)]  # uncached committed, then drafts
        n = 1 + max(len(d) for d, _ in drafts)
        logits, states = cache.forward(target, new, n, drafter.needs_hidden)  # 2. ONE pass: [B, n, V]
        alive, read, now = [], [], time.perf_counter() - start
        for b, i in enumerate(active):  # 3. verify and 4. commit, row by row, with generate's helpers
            d, q = drafts[b]
            g = len(d)
            path, emitted, done = verify_and_cut(logits[b, n - g - 1:], DraftTree.chain(d, q), warp, budget[b], eos)
            texts[i] += emitted
            out.rows[i].record(len(path), g, g)
            if out.rows[i].target_calls == 1:
                out.first_token_seconds[i] = now
            if states is not None:  # the target's states at the committed tokens it read (the uncached, the drafts)
                rows = [states[0].shape[1] - len(new[b]) + r for r in committed_rows(len(new[b]) - g, path, len(emitted))]
                read.append(tuple(h[b, rows] for h in states))
            if done or len(texts[i]) - T0[i] >= max_new_tokens:
                out.rows[i].seconds = now  # this row leaves the batch
            else:
                alive.append(b)
        cache.keep([len(texts[active[b]]) - 1 for b in alive], alive)  # each row: committed but the pending token
        drafter.commit_batch([texts[i] for i in active], alive, read if states is not None else None)
        active = [active[b] for b in alive]
        assert cache.lengths() == [len(texts[i]) - 1 for i in active], "a row's cache lost track of its text"
        out.steps += 1
        if out.steps == 1:  # the prefill ends here: every model has read the prompts
            out.prefill_seconds = time.perf_counter() - start
            out.prefill_tokens = sum(len(t) - t0 for t, t0 in zip(texts, T0))
    for i, g in enumerate(out.rows):
        g.tokens = texts[i][T0[i]:]
    out.seconds = time.perf_counter() - start
    return out


def _gammas(gamma, drafter, active: list[int], rows: list[Generation]) -> list[int]:
    """One γ per active row, from generate_batch's `gamma` (see there)."""
    if gamma is None:
        return [drafter.gamma] * len(active)
    if callable(gamma):
        values = gamma(len(active), [rows[i] for i in active], drafter.gamma)
    elif isinstance(gamma, Sequence):
        if len(gamma) != len(rows):
            raise checks.ArgumentError(f"gamma has {len(gamma)} values for {len(rows)} prompts: pass one per prompt")
        values = [gamma[i] for i in active]
    else:
        values = [gamma] * len(active)
    values = [checks.integer(g, "gamma", "tokens drafted for a row this step", 0) for g in values]
    if len(values) != len(active):
        raise checks.ArgumentError(f"the gamma policy returned {len(values)} values for {len(active)} active rows")
    if values and max(values) > 0 and isinstance(drafter, NoDraft):
        raise checks.ArgumentError("gamma > 0 without a drafter: pass a drafter, or gamma=None")
    return values
