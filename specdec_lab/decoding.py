"""The speculative loop: a drafter proposes, the target checks every proposal in one pass, caches roll back.

Derived in notebooks/03_draft_target.ipynb.

    gen = generate(target, ids, DraftModelDrafter(draft, gamma=4), max_new_tokens=64)
    gen.tokens, gen.target_calls, gen.tau              # new tokens, target passes, τ

One loop serves every method: the drafter's `propose()` returns a `DraftTree` (a chain, or from chapter 04
a tree read through a tree mask), the target scores the pending token plus the drafts in ONE cached forward,
`verify` keeps the accepted prefix plus one corrected or bonus token, and the target cache is cropped (chain)
or compacted (tree) back to the committed text. With no drafter the same loop proposes nothing and is plain
autoregressive decoding: the baseline every speedup is measured against.

Cache invariant (asserted every step): before each target forward the cache holds every committed token
except the last one, cache_len == len(committed) - 1; that last, "pending" token is the first input of
the next forward.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec_lab import checks, lm
from specdec_lab.lm import context_length
from specdec_lab.sampling import probs_from_logits, verify_chain
from specdec_lab.tree import DraftTree, compact, tree_forward, verify_tree

__all__ = ["Warp", "Generation", "generate", "generate_naive", "verify", "context_length"]


@dataclass
class Warp:
    """The sampling settings the target and the drafter share, and the generator every draw comes from.

    `probs(logits)` turns logits into the distribution to sample from (temperature 0: one-hot argmax).
    Applying the same Warp to both models keeps p and q comparable (the accept test needs that).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None

    def __post_init__(self):
        self.temperature = checks.temperature(self.temperature)
        self.top_k, self.top_p = checks.top_k(self.top_k), checks.top_p(self.top_p)
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise checks.ArgumentError(f"generator must be a torch.Generator or None, got {self.generator!r}: "
                                       "pass torch.Generator().manual_seed(0)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: Tensor) -> Tensor:
        """[..., V] logits -> [..., V] probabilities, warped."""
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)

    def sample(self, probs: Tensor) -> Tensor:
        """[B, V] probabilities -> [B, 1] token ids drawn with the shared generator."""
        return torch.multinomial(probs, 1, generator=self.generator)


@dataclass
class Generation:
    """What one call of `generate` produced, and what it cost.

    tokens: the new token ids only (not the prompt), at most max_new_tokens, ending at the first EOS.
    target_calls: target forward passes (the prompt is read in the first one, together with its drafts).
    accept_lengths: per target call, how many drafted tokens the verifier accepted (0 to γ).
    draft_lengths: per target call, how many tokens deep the drafter proposed (γ for a chain, the depth of a
        tree; 0 for plain decoding). draft_nodes: per target call, how many tokens the target verified
        besides the pending one (γ for a chain, every node of a tree).
    seconds: wall-clock time of the whole call.
    """

    tokens: list[int]
    target_calls: int
    accept_lengths: list[int] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)
    draft_nodes: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tau(self) -> float:
        """τ, the mean number of tokens emitted per target call: len(tokens) / target_calls.

        Each call emits its accepted drafts plus one corrected or bonus token, so τ = 1 + mean(accept_lengths)
        except where EOS or the length budget cut the last call short. τ ranges from 1 (plain decoding, or
        nothing accepted) to γ + 1 (everything accepted); it is NOT the per-token acceptance rate α.
        """
        return len(self.tokens) / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_rate(self) -> float:
        """α, the fraction of the drafted tokens the verifier TESTED that it accepted.

        A call that accepts n of its d drafts tested n + 1 of them when n < d (the rejected one is the
        last) and all d when n = d; drafts after a rejection were never tested and do not count. For a
        tree, d is its depth: α is then the chance that a level holds the target's token, given the one
        above did.
        """
        tested = sum(min(n + 1, d) for n, d in zip(self.accept_lengths, self.draft_lengths))
        return sum(self.accept_lengths) / tested if tested else 0.0


def verify(logits: Tensor, tree: DraftTree, warp: Warp) -> list[int]:
    """The tokens one target pass lets us emit: the accepted drafts plus one corrected or bonus token.

    logits: [γ+1, V] the target's logits at the pending token and at each of the γ drafts of a chain.
    Sampling: p = warp.probs(logits), then `sampling.verify_chain(p, tree.q, tree.tokens)`.
    Greedy: p is one-hot on the argmax, where verify_chain keeps the drafts that equal the target's
    argmax and then emits the argmax at the first mismatch (or the bonus position); done here with
    tensor ops and without drawing random numbers (tests check both give the same tokens).
    """
    if not tree.is_chain:
        raise NotImplementedError("decoding.verify handles chains; tree drafts are verified in specdec_lab.tree")
    gamma = len(tree)
    if warp.greedy:
        best = logits.argmax(-1)  # [γ+1] the target's choice after the pending token and after each draft
        drafts = torch.as_tensor(tree.tokens, dtype=best.dtype)  # [γ]
        n = int((best[:gamma] == drafts).cumprod(0).sum())  # leading drafts equal to the target's argmax
        return best[: n + 1].tolist()  # accepted drafts (equal to best there), then the target's own token
    return verify_chain(warp.probs(logits), tree.q, tree.tokens, warp.generator)  # [γ+1, V], [γ, V] | None


def _prompt(target, input_ids, max_new_tokens) -> tuple[Tensor, int]:
    """(input_ids as a [1, T] long tensor, max_new_tokens), or an error that says what to change."""
    checks.model(target, "target", "load one with AutoModelForCausalLM.from_pretrained(name), or "
                 "target, draft, tok = zoo.load_pair('tiny')")
    vocab = target.config.get_text_config().vocab_size
    return checks.prompt(input_ids, max_new_tokens, vocab, context_length(target), target.device)


@torch.inference_mode()
def generate(target, input_ids, drafter=None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, eos_token_id: int | Sequence[int] | None = None,
             generator: torch.Generator | None = None) -> Generation:
    """Decode up to max_new_tokens tokens after input_ids with `target`, speculating with `drafter`.

    drafter: None (plain decoding) or any object with `propose(ids, warp, limit) -> DraftTree` and the hooks
    `start(target, ids)` and `commit(ids, accepted)` (see drafters.Drafter). temperature 0 is greedy;
    otherwise softmax(logits / T) with optional top-k / top-p, the same warp for target and drafter.
    Output distribution: exactly the target's own (greedy: identical tokens). Stops after max_new_tokens
    tokens or at the first eos_token_id (which is included), even inside an accepted draft.
    generator: a seeded torch.Generator makes sampling reproducible.
    Context: prompt + max_new_tokens must fit the target's position table (config.max_position_embeddings or
    n_positions), else a ValueError says how many new tokens fit; a drafter never drafts past it either.
    Every argument is checked before any model runs (specdec_lab.checks).
    """
    start = time.perf_counter()
    drafter = checks.drafter(drafter)
    warp = Warp(temperature, top_k, top_p, generator)
    eos = checks.eos_ids(eos_token_id)
    ids, max_new_tokens = _prompt(target, input_ids, max_new_tokens)  # [1, T0]
    T0 = T = ids.shape[1]
    buf = torch.empty(1, T0 + max_new_tokens, dtype=torch.long, device=ids.device)  # committed + drafts
    buf[:, :T0] = ids
    if drafter is not None:
        drafter.start(target, ids)
    cache = lm.new_cache(target)
    gen = Generation(tokens=[], target_calls=0)
    needs_hidden = getattr(drafter, "needs_hidden", False)  # Medusa, EAGLE: draft from the target's states
    typical = getattr(drafter, "typical", None)  # Medusa's lossy typical acceptance, (threshold, alpha)
    while T - T0 < max_new_tokens:
        budget = max_new_tokens - (T - T0)  # tokens we may still emit; a pass emits at most drafts + 1
        tree = drafter.propose(buf[:, :T], warp, budget - 1) if drafter is not None else DraftTree([], [])
        n = len(tree)
        if tree.depth > budget - 1:
            raise RuntimeError(f"the drafter proposed {tree.depth} tokens deep when at most {budget - 1} were allowed")
        past = lm.cache_len(cache)
        assert past == (T - 1 if gen.target_calls else 0), f"target cache holds {past}, committed {T}"
        if tree.is_chain and not needs_hidden and typical is None:
            if n:
                buf[0, T:T + n] = torch.as_tensor(tree.tokens)
            logits = lm.forward_last(target, buf[:, past:T + n], cache, n + 1)[0]  # [n+1, V] pending + n drafts
            emitted = verify(logits, tree, warp)  # accepted drafts + one corrected / bonus token
            path = list(range(len(emitted) - 1))
        else:  # chapter 04: the whole tree in one forward (tree mask), then walk it from the root
            out = tree_forward(target, buf[:, past:T], tree.parents, tree.tokens, cache, hidden=needs_hidden)
            logits, hidden = out if needs_hidden else (out, None)  # [n+1, V], layers x [1, T-past+n, H]
            path, emitted = verify_tree(logits, tree, warp, typical)
            compact(cache, T, path)  # keep the committed text and the accepted nodes' K/V
        accepted = len(emitted) - 1
        emitted = emitted[:budget]
        hit = next((i for i, t in enumerate(emitted) if t in eos), None) if eos else None
        if hit is not None:
            emitted = emitted[: hit + 1]  # cut at the first EOS, even inside an accepted draft
        k = len(emitted)
        buf[0, T:T + k] = torch.as_tensor(emitted)
        T += k
        lm.crop(cache, T - 1)  # drop the KV of rejected drafts; the new last token stays pending
        assert lm.cache_len(cache) == T - 1, f"target cache holds {lm.cache_len(cache)}, committed {T}"
        gen.target_calls += 1
        gen.accept_lengths.append(accepted)
        gen.draft_lengths.append(tree.depth)
        gen.draft_nodes.append(n)
        if hit is not None:
            break
        if needs_hidden:  # chapter 05: the target's states at the committed tokens it just read
            rows = list(range(T - k - past)) + [T - k - past + j for j in path[:k]]
            drafter.commit(buf[:, :T], accepted, path[:k], hidden=tuple(h[0, rows] for h in hidden))
        elif drafter is not None:
            drafter.commit(buf[:, :T], accepted, path[:k])
    gen.tokens = buf[0, T0:T].tolist()
    gen.seconds = time.perf_counter() - start
    return gen


@torch.inference_mode()
def generate_naive(target, draft, input_ids, gamma: int = 3, max_new_tokens: int = 64, temperature: float = 0.0,
                   top_k: int | None = None, top_p: float | None = None, eos_token_id=None,
                   generator: torch.Generator | None = None) -> Generation:
    """The textbook loop without caches: both models re-read the whole text at every step.

    Same draws in the same order as `generate(..., DraftModelDrafter(draft, gamma))`, so with equal seeds
    the two emit the same tokens (up to fp32 rounding in the logits). Kept as the reference the cached
    loop is checked and timed against; like it, drafts only while the draft's context has room.
    """
    start = time.perf_counter()
    gamma = checks.integer(gamma, "gamma", "tokens drafted per step")
    checks.model(draft, "draft", "pass the draft model itself (generate_naive(target, draft, ids))")
    ids, max_new_tokens = _prompt(target, input_ids, max_new_tokens)
    ids = ids[0].tolist()
    warp, eos, T0 = Warp(temperature, top_k, top_p, generator), checks.eos_ids(eos_token_id), len(ids)
    draft_context = context_length(draft) or float("inf")
    gen = Generation(tokens=[], target_calls=0)
    while len(ids) - T0 < max_new_tokens:
        budget = max_new_tokens - (len(ids) - T0)
        n = max(min(gamma, budget - 1, draft_context - len(ids) + 1), 0)  # the draft reads up to len(ids)+n-2
        drafted, qs = list(ids), []
        for _ in range(n):  # the draft re-reads everything, then appends one token
            logits = lm.forward(draft, torch.tensor([drafted]))[0, -1]  # [V]
            if warp.greedy:
                drafted.append(int(logits.argmax()))
            else:
                q = warp.probs(logits[None])  # [1, V]
                drafted.append(int(warp.sample(q)))
                qs.append(q)
        tree = DraftTree.chain(drafted[len(ids):], torch.cat(qs) if qs else None)
        logits = lm.forward(target, torch.tensor([drafted]))[0, len(ids) - 1:]  # [n+1, V]
        emitted = verify(logits, tree, warp)
        gen.accept_lengths.append(len(emitted) - 1)
        gen.draft_lengths.append(n)
        gen.draft_nodes.append(n)
        gen.target_calls += 1
        emitted = emitted[:budget]
        hit = next((i for i, t in enumerate(emitted) if t in eos), None)
        ids += emitted[: hit + 1] if hit is not None else emitted
        if hit is not None:
            break
    gen.tokens = ids[T0:]
    gen.seconds = time.perf_counter() - start
    return gen
