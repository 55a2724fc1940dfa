"""Speculative decoding for a batch of requests: ragged acceptance, per-row caches, rows that leave.

Derived in notebooks/09_serving.ipynb.

    out = generate_batch(target, prompts, DraftModelDrafter(draft, gamma=3), max_new_tokens=64)
    out.tokens, out.steps, out.rows[0].tau        # new tokens per prompt, batched target passes, one row's τ

B prompts of different lengths decode together. Every step each row drafts its own chain (γ_b tokens, and
γ_b = 0 is plain decoding for that row), the target reads every row in ONE forward, and each row accepts its own
number of drafts. So after a step the rows' texts and caches have grown by different amounts: the batch is
ragged. Rows that reach EOS or their length budget leave it, and the batch shrinks.

How the caches stay rectangular (`Ragged`): each model's Hugging Face cache [B, heads, L, d] comes with a mask
valid [B, L] of the slots that hold the row's text, in order. Everything a row feeds is right-aligned (left
padding), so a row's last token is in the last column; pads are hidden by the mask, and positions are counted
per row from the mask, so a pad never moves a token's rotary position. After verification `keep` keeps each
row's first n_b valid slots (its committed text but the pending token) and packs them to the right again: ONE
gather per layer, which also drops the rows that left. We chose this over leaving the rejected slots in place as
holes (no copy, but the cache and the mask grow by γ + 1 slots a step, whatever is accepted) because it keeps
chapter 03's invariant per row, cache length = committed length - 1, and the cache no longer than the longest
row. Engines avoid the copy differently: vLLM's paged attention writes each row's K/V into blocks of its own
and frees the rejected slots in a block table.

Chain drafters only (what vLLM and SGLang batch too): the draft model (`DraftModelDrafter` with a chain), an
EAGLE-1 chain (`EagleDrafter` with branching [1] * γ) and prompt lookup (`PromptLookupDrafter`); each is
turned into its batched form (`batched`), which drafts every row in one forward per token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec_lab import checks, lm
from specdec_lab.decoding import Generation, cut
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.eagle import EagleDrafter
from specdec_lab.ngram import PromptLookupDrafter, prompt_lookup
from specdec_lab.sampling import Warp
from specdec_lab.tree import DraftTree, verify_tree

__all__ = ["Ragged", "BatchGeneration", "generate_batch", "batched", "switch_off_policy"]


class Ragged:
    """A Hugging Face KV cache for a batch whose rows hold texts of different lengths.

    valid [B, L]: True where slot l of row b holds a token of row b's text (in order); the rest are pads.
    """

    def __init__(self, cache, batch: int):
        self.cache, self.valid = cache, torch.zeros(batch, 0, dtype=torch.bool)  # [B, L]

    def lengths(self) -> list[int]:
        """Tokens held per row."""
        return self.valid.sum(1).tolist()

    def block(self, rows: Sequence[Sequence[int]], device=None) -> tuple[Tensor, Tensor, Tensor]:
        """The rows' new tokens, right-aligned, as one input: ids [B, n], positions [B, n], mask [B, n, L + n]
        (True = may attend: the row's held slots, then its own new tokens causally; a pad sees only itself).
        The new slots are recorded as held; the caller's forward must append them to the cache."""
        B, n = len(rows), max(len(r) for r in rows)
        if all(len(r) == n for r in rows):  # every row feeds as many tokens (a drafting level): no padding
            ids, real = torch.tensor(rows, dtype=torch.long).reshape(B, n), torch.ones(B, n, dtype=torch.bool)
        else:
            ids, real = torch.zeros(B, n, dtype=torch.long), torch.zeros(B, n, dtype=torch.bool)  # [B, n]
            for b, r in enumerate(rows):
                ids[b, n - len(r):], real[b, n - len(r):] = torch.as_tensor(r, dtype=torch.long), True
        held = self.valid.sum(1, keepdim=True)  # [B, 1]
        positions = (held + real.cumsum(1) - 1).clamp(min=0)  # [B, n] a pad's position is never read
        causal = torch.ones(n, n, dtype=torch.bool).tril()  # [n, n]
        new = (causal & real[:, None, :]) | torch.eye(n, dtype=torch.bool)  # [B, n, n] pads hidden but from themselves
        mask = torch.cat([self.valid[:, None, :].expand(B, n, -1), new], -1)  # [B, n, L + n]
        self.valid = torch.cat([self.valid, real], 1)  # [B, L + n]
        return ids.to(device), positions.to(device), mask.to(device)

    def forward(self, model, rows: Sequence[Sequence[int]], last: int = 1, hidden: bool = False):
        """One forward of an HF model over the rows' new tokens: logits of the last `last` columns [B, last, V]
        (and HF's hidden states [B, n, H] per layer with hidden=True)."""
        ids, positions, mask = self.block(rows, model.device)
        out = lm.forward(model, ids, self.cache, positions, mask, hidden=hidden, last=last)
        return out if hidden else (out, None)

    def keep(self, lengths: Sequence[int], rows: Sequence[int]) -> None:
        """THE batch rollback: keep batch rows `rows` (in that order), row b its first lengths[b] held tokens,
        packed to the right: the cache becomes [len(rows), heads, max(lengths), d]."""
        n = torch.as_tensor(list(lengths), dtype=torch.long)[:, None]  # [B', 1]
        valid = self.valid[list(rows)]  # [B', L]
        kept = valid & (valid.cumsum(1) <= n)  # [B', L] the first n_b held slots
        width = int(n.max()) if len(rows) else 0
        order = kept.int().sort(dim=1, stable=True).indices  # [B', L] each row's dropped slots, then its kept ones
        index = order[:, kept.shape[1] - width:]  # [B', width] the kept slots last, in order
        lm.gather_rows(self.cache, list(rows), index)
        self.valid = torch.arange(width) >= width - n  # [B', width]


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


# ---- the batched drafters: each row's chain, every row in one forward per drafted token ----------------------


class _Plain:
    """No drafter: every row proposes nothing, and generate_batch is batched plain decoding."""

    needs_hidden, gamma = False, 0

    def start(self, target, texts):
        pass

    def propose(self, texts, gammas, warp):
        return [([], None)] * len(texts)

    def commit(self, texts, alive, states):
        pass


class _Lookup(_Plain):
    """Prompt lookup per row (no model, no state)."""

    def __init__(self, drafter: PromptLookupDrafter):
        self.gamma, self.max_ngram = drafter.num_tokens, drafter.max_ngram

    def propose(self, texts, gammas, warp):
        return [(prompt_lookup(t, g, self.max_ngram) if g > 0 else [], None) for t, g in zip(texts, gammas)]


class _DraftModel(_Plain):
    """The draft model's chain for every row (chapter 03's drafter, batched): its own `Ragged` cache holds a
    prefix of each row's committed text; `propose` feeds each row what its cache lacks, then one token per
    level for the whole batch."""

    def __init__(self, drafter: DraftModelDrafter):
        self.model, self.gamma = drafter.model, drafter.gamma
        self.context = lm.context_length(drafter.model) or float("inf")

    def start(self, target, texts):
        DraftModelDrafter(self.model).start(target, torch.tensor([max(texts, key=len)]))  # vocabulary, context
        self.cache, self.matched = Ragged(lm.new_cache(self.model), len(texts)), None

    def propose(self, texts, gammas, warp):
        # the deepest draft is read at position T + γ - 2: a row near the end of the draft's context drafts fewer
        gammas = [max(min(g, self.context - len(t) + 1), 0) for t, g in zip(texts, gammas)]
        n, held = max(gammas), self.cache.lengths()
        self.matched = held  # the held slots that are the committed text's, whatever is accepted
        if n == 0:
            return [([], None)] * len(texts)
        x, tokens, qs = [t[h:] for t, h in zip(texts, held)], [], []  # [B] ragged: what each cache lacks
        for level in range(n):
            logits = self.cache.forward(self.model, x)[0][:, -1]  # [B, V] after each row's last token
            if warp.greedy:
                token = logits.argmax(-1)  # [B]
            else:
                q = warp.probs(logits)  # [B, V]
                token = warp.sample(q)[:, 0]  # [B]
                qs.append(q)
            tokens.append(token)
            x = token[:, None].tolist()
        self.matched = [len(t) + n - 1 for t in texts]  # committed text, then n - 1 fed drafts (the last never fed)
        tokens, q = torch.stack(tokens, 1).tolist(), torch.stack(qs, 1) if qs else None  # [B, n], [B, n, V]
        return [(tokens[b][:g], None if q is None else q[b, :g]) for b, g in enumerate(gammas)]

    def commit(self, texts, alive, states):
        # keep what matches the committed text (the fed accepted drafts), at most all of it but the pending token
        self.cache.keep([min(len(texts[b]) - 1, self.matched[b]) for b in alive], alive)


class _EagleChain(_Plain):
    """An EAGLE-1 chain for every row (chapter 06's drafter, batched): its cache holds each row's TRUE pairs
    (feature of position p, token p + 1), and `commit` adds the pairs of the positions the target just read."""

    needs_hidden = True

    def __init__(self, drafter: EagleDrafter):
        self.net, self.gamma = drafter.net, len(drafter.branching)

    def start(self, target, texts):
        EagleDrafter(self.net).start(target, torch.tensor([texts[0]]))  # the size and mask checks
        self.cache, self.root, self.n_true = Ragged(lm.new_cache(), len(texts)), None, [0] * len(texts)

    def propose(self, texts, gammas, warp):
        n = max(gammas)
        if self.root is None or n == 0:
            return [([], None)] * len(texts)  # the prefill pass drafts nothing
        out, tokens = self.root, []  # [B, 1, H] the predicted feature of each row's pending token
        for level in range(n):
            if level:  # feed each row's last draft with the feature that predicted it, at position n_true + level - 1
                ids, positions, mask = self.cache.block(tokens[-1][:, None].tolist(), out.device)
                out = self.net(out, ids, positions, mask[:, None], self.cache.cache)  # [B, 1, H]
            tokens.append(self.net.logits(out[:, -1]).argmax(-1))  # [B] top-1: deterministic (q = None)
        tokens = torch.stack(tokens, 1).tolist()  # [B, n]
        return [(tokens[b][:g], None) for b, g in enumerate(gammas)]

    @torch.no_grad()
    def commit(self, texts, alive, states):
        self.cache.keep([self.n_true[b] for b in alive], alive)  # drop the drafted nodes: only true pairs stay
        if not alive:
            return
        texts, states, n_true = [texts[b] for b in alive], [states[b] for b in alive], [self.n_true[b] for b in alive]
        # the pairs whose next token is committed: the positions the target read, up to the pending token
        m = [min(s[0].shape[0], len(t) - 1 - k) for s, t, k in zip(states, texts, n_true)]
        width, weight = max(m), self.net.fc.weight
        feature = torch.zeros(len(alive), width, self.net.hidden, dtype=weight.dtype, device=weight.device)  # [B',w,H]
        for b, s in enumerate(states):
            if m[b]:
                feature[b, width - m[b]:] = self.net.true_feature([h[: m[b]] for h in s]).to(feature)
        tokens = [t[k + 1: k + 1 + j] for t, k, j in zip(texts, n_true, m)]  # the token after each of those positions
        ids, positions, mask = self.cache.block(tokens, weight.device)
        out = self.net(feature, ids, positions, mask[:, None], self.cache.cache)  # [B', width, H]
        self.n_true, self.root = [k + j for k, j in zip(n_true, m)], out[:, -1:]  # root [B', 1, H]


def batched(drafter):
    """The batched form of a chain drafter: None (plain decoding), DraftModelDrafter with a chain, an
    EagleDrafter with a chain (EAGLE-1), PromptLookupDrafter. Trees are refused with what to pass instead."""
    drafter = checks.drafter(drafter)
    if drafter is None:
        return _Plain()
    if isinstance(drafter, PromptLookupDrafter):
        return _Lookup(drafter)
    if isinstance(drafter, DraftModelDrafter) and all(b == 1 for b in drafter.branching):
        return _DraftModel(drafter)
    if isinstance(drafter, EagleDrafter) and not drafter.dynamic and all(b == 1 for b in drafter.branching):
        return _EagleChain(drafter)
    raise checks.ArgumentError(f"generate_batch drafts chains only (as vLLM and SGLang batch them), got "
                               f"{type(drafter).__name__} with a tree: pass DraftModelDrafter(draft, gamma=3), "
                               "EagleDrafter.from_zoo(target) (a chain) or PromptLookupDrafter(), or decode the "
                               "tree one prompt at a time with generate()")


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
                                   f"[T] tensor), got {checks._show(prompts)}: for one prompt use generate(), or "
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
    batch, warp, eos = batched(drafter), Warp(temperature, top_k, top_p, generator), checks.eos_ids(eos_token_id)
    out = BatchGeneration([Generation(tokens=[], target_calls=0) for _ in texts], 0, 0.0, [0.0] * len(texts))
    T0, active = [len(t) for t in texts], [i for i in range(len(texts)) if max_new_tokens > 0]
    cache = Ragged(lm.new_cache(target), len(active))  # row b of the caches is prompt active[b]
    if active:
        batch.start(target, [texts[i] for i in active])
    while active:
        live, budget = [texts[i] for i in active], [max_new_tokens - len(texts[i]) + T0[i] for i in active]
        gammas = _gammas(gamma, batch, active, out.rows)
        drafts = batch.propose(live, [max(min(g, b - 1), 0) for g, b in zip(gammas, budget)], warp)  # 1. propose
        new = [t[h:] + d for t, h, (d, _) in zip(live, cache.lengths(), drafts)]  # uncached committed, then drafts
        n = 1 + max(len(d) for d, _ in drafts)
        logits, states = cache.forward(target, new, n, batch.needs_hidden)  # 2. ONE pass: [B, n, V]
        alive, read, now = [], [], time.perf_counter() - start
        for b, i in enumerate(active):  # 3. verify and 4. commit, row by row, with generate's verifier and cut
            d, q = drafts[b]
            g = len(d)
            path, emitted = verify_tree(logits[b, n - g - 1:], DraftTree.chain(d, q), warp)  # [g + 1, V] row b's
            emitted, done = cut(emitted, budget[b], eos)
            texts[i] += emitted
            out.rows[i].record(len(path), g, g)
            if out.rows[i].target_calls == 1:
                out.first_token_seconds[i] = now
            if states is not None:  # the target's states at the committed tokens it read (the uncached, the drafts)
                w = states[0].shape[1]
                read.append(tuple(h[b, w - len(new[b]): w - g + min(len(path), len(emitted))] for h in states))
            if done or len(texts[i]) - T0[i] >= max_new_tokens:
                out.rows[i].seconds = now  # this row leaves the batch
            else:
                alive.append(b)
        cache.keep([len(texts[active[b]]) - 1 for b in alive], alive)  # each row: committed but the pending token
        batch.commit([texts[i] for i in active], alive, read)
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


def _gammas(gamma, batch, active: list[int], rows: list[Generation]) -> list[int]:
    """One γ per active row, from generate_batch's `gamma` (see there)."""
    if gamma is None:
        return [batch.gamma] * len(active)
    if callable(gamma):
        values = gamma(len(active), [rows[i] for i in active], batch.gamma)
    elif isinstance(gamma, Sequence):
        if len(gamma) != len(rows):
            raise checks.ArgumentError(f"gamma has {len(gamma)} values for {len(rows)} prompts: pass one per prompt")
        values = [gamma[i] for i in active]
    else:
        values = [gamma] * len(active)
    values = [checks.integer(g, "gamma", "tokens drafted for a row this step", 0) for g in values]
    if len(values) != len(active):
        raise checks.ArgumentError(f"the gamma policy returned {len(values)} values for {len(active)} active rows")
    if values and max(values) > 0 and type(batch) is _Plain:
        raise checks.ArgumentError("gamma > 0 without a drafter: pass a drafter, or gamma=None")
    return values
