"""Drafters: the protocol the loop talks to, and the draft model, the first drafter of the course.

Derived in notebooks/03_draft_target.ipynb.

`decoding.generate` asks a drafter for four things and nothing else (`Drafter` declares them, with types):

    drafter.start(target, prompt_ids)            once, before the first step (check the pair, reset state)
    tree = drafter.propose(ids, warp, limit)     every step: a DraftTree at most `limit` tokens deep after ids
    drafter.commit(ids, accepted, path, hidden)  after verification: ids = the committed text now
    drafter.needs_hidden                         True: commit() gets the target's hidden states (Medusa, EAGLE)

How the target verifies is the loop's business, not the drafter's: Medusa's lossy typical acceptance is
`generate(..., typical=(threshold, alpha))`, with any drafter.

A stateless drafter (prompt lookup, say) only writes `propose`. A drafter that samples its tokens sets
`tree.q` to the warped distributions it sampled from (`warp.probs`, `warp.sample`); a deterministic one
leaves it None. Drafts made from the target itself (early exit, int4) are in `draft_models`.

`serving.generate_batch` (chapter 09) asks the same drafter for chains over B rows at once, through three more
members that mirror the first three (a stateless drafter gets them from `Drafter`; a drafter with state per
sequence writes its own, as the draft model's chain here and EAGLE's chain do):

    drafter.start_batch(target, texts)                     once: B prompts, token-id lists
    drafts = drafter.propose_batch(texts, gammas, warp)    every step: per row (tokens, q [g, V] or None)
    drafter.commit_batch(texts, alive, hidden)             after verification: the rows that stay, their new states
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_lab import checks, lm
from specdec_lab.masks import require_custom_masks
from specdec_lab.ragged import Ragged
from specdec_lab.sampling import Warp
from specdec_lab.tree import DraftTree, TreeBuilder

__all__ = ["Drafter", "DraftModelDrafter", "CHAINS_ONLY"]


class Drafter:
    """The drafter protocol, as a base class: override `propose`; the rest defaults to a stateless drafter.

    An object that does not subclass it is accepted too if it has all four members (checks.drafter).
    """

    needs_hidden: bool = False  # True: generate() passes commit() the target's hidden states (Medusa, EAGLE)

    def start(self, target, ids: Tensor) -> None:
        """A new sequence begins with prompt ids [1, T]; check compatibility with `target`, reset state."""

    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        """Draft a tree at most `limit` tokens deep to follow the committed ids [1, T]."""
        raise NotImplementedError

    def commit(self, ids: Tensor, accepted: int, path: list[int], hidden: tuple[Tensor, ...] | None) -> None:
        """The verifier kept `accepted` drafts plus one token of its own; ids [1, T'] is the committed text.

        path: the proposed tree's nodes whose tokens were committed, root first (a chain's: 0 .. accepted - 1;
        fewer when EOS or the length budget cut the step short).
        hidden (only when needs_hidden, else None): HF's tuple of per-layer states, each [m, H], at the m
        committed tokens the target read this pass (the uncached committed ones, then the committed nodes);
        the last row is the state whose LM head gave this pass's final token.
        """

    # ---- the batch members (serving.generate_batch): a chain per row, B rows at once ----

    gamma: int = 0  # a row's chain when generate_batch is given no γ

    def start_batch(self, target, texts: list[list[int]]) -> None:
        """B prompts begin. This default serves a stateless drafter (one that writes only `propose`)."""
        if type(self).start is not Drafter.start or type(self).commit is not Drafter.commit:
            raise checks.ArgumentError(f"{type(self).__name__} keeps state per sequence and has no batched form. "
                                       + CHAINS_ONLY)

    def propose_batch(self, texts: list[list[int]], gammas: list[int], warp: Warp
                      ) -> list[tuple[list[int], Tensor | None]]:
        """Each row's chain after its committed text: (tokens, q [g, V] or None), g at most gammas[b]."""
        out = []
        for text, gamma in zip(texts, gammas):
            tree = self.propose(torch.tensor([text]), warp, gamma) if gamma > 0 else DraftTree.chain([])
            if not tree.is_chain:
                raise checks.ArgumentError(f"{type(self).__name__} proposed a tree. " + CHAINS_ONLY)
            out.append((tree.tokens, tree.q))
        return out

    def commit_batch(self, texts: list[list[int]], alive: list[int], hidden: list | None) -> None:
        """The verifier committed each row's tokens: texts[b] is row b's committed text now; `alive` are the rows
        that stay (batch indices, in order: row alive[i] becomes row i); hidden (needs_hidden only, else None):
        per row b, the target's states at the committed tokens it read this pass (as `commit`'s, [m_b, H] each)."""


CHAINS_ONLY = ("generate_batch drafts chains only (as vLLM and SGLang batch them): pass DraftModelDrafter(draft, "
               "gamma=3), EagleDrafter.from_zoo(target) (a chain), PromptLookupDrafter() or any drafter that writes "
               "only propose, or decode the tree one prompt at a time with generate()")



def _vocab(model) -> int:
    return model.config.get_text_config().vocab_size


class DraftModelDrafter(Drafter):
    """A small model with the target's vocabulary drafts a chain of γ tokens, or a tree.

    Chain (gamma=γ, chapter 03): one cached forward per token. The draft keeps its own KV cache under the
    same invariant as the target's: it holds the committed text except the last token, which `propose`
    feeds first. After a rejection `commit` crops the cache back to len(committed) - 1. When all γ drafts
    are accepted the cache lags one more token (the draft never fed its own last draft), so the next
    `propose` feeds two tokens, that draft and the target's bonus token.

    Tree (branching=[b0, b1, ...], chapter 04): level l gives every frontier node b_l children, the top-b_l
    tokens (greedy) or b_l i.i.d. draws from q (sampling), and each level is ONE draft forward over the
    whole frontier with a tree mask. `commit` keeps the accepted path's K/V by gather. branching=[1] * γ is
    the chain of gamma=γ.

    The chain or tree tuned for this pair on this device (chapter 08): `tune.auto_draft_model(target, draft)`.

    Context: the draft never reads past its own position table. A draft with a shorter context than the
    target's drafts fewer levels near its end, then none (plain decoding finishes the text); a prompt longer
    than the draft's context is refused in `start`.
    """

    def __init__(self, draft, gamma: int | None = None, branching: list[int] | None = None):
        checks.model(draft, "draft", "DraftModelDrafter takes the draft model itself, e.g. "
                     "AutoModelForCausalLM.from_pretrained(name) or zoo.load_pair('tiny')[1]")
        if isinstance(gamma, str) or isinstance(branching, str):  # "auto" was a setting once
            raise checks.ArgumentError(f"gamma={gamma!r}, branching={branching!r}: give numbers; the tuner picks them "
                                       "for this device: drafter, pick = tune.auto_draft_model(target, draft, "
                                       "chain=True) (chain=False: a tree)")
        if branching is not None:
            branching = checks.branching(branching)
            if gamma is not None and gamma != len(branching):
                raise checks.ArgumentError(f"gamma={gamma} and branching={branching} disagree: pass one of them "
                                           "(a chain of γ tokens is branching=[1] * γ)")
        else:
            # γ = 3: near the peak of chapter 03's measured curve for the zoo pair (flat there; fastest γ varies)
            gamma = 3 if gamma is None else gamma
            gamma = checks.integer(gamma, "gamma", "tokens drafted per step", 1, "for plain decoding pass drafter=None")
            branching = [1] * gamma
        self.model, self.branching, self.gamma, self.cache = draft, branching, len(branching), None
        self.context = lm.context_length(draft) or float("inf")  # the draft's position table
        self.base, self.fed = 0, 0  # the committed length the last tree was drafted after, its nodes in the cache

    def start(self, target, ids: Tensor) -> None:
        vt, vd = _vocab(target), _vocab(self.model)
        if vt != vd:
            raise checks.ArgumentError(f"target and draft have different vocabularies ({vt} vs {vd} token ids), so "
                                       "their token ids cannot be compared: use a draft trained with the target's "
                                       "tokenizer (zoo.load_pair returns matching pairs; zoo.check_pair explains a "
                                       "mismatch)")
        if ids.shape[1] > self.context:
            raise checks.ArgumentError(f"the prompt has {ids.shape[1]} tokens, more than the draft's context of "
                                       f"{self.context}: shorten it to {self.context} tokens or fewer")
        if any(b > 1 for b in self.branching):  # a tree: both models read it through a custom mask
            require_custom_masks(target, "tree drafts")
            require_custom_masks(self.model, "tree drafts")
        self.cache = lm.new_cache(self.model)

    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        # a pass emits at most depth + 1 tokens; drafting depth d reads the draft at positions up to T + d - 2,
        # so near the end of a shorter draft context the tree loses its last levels (then drafting stops)
        branching = self.branching[: max(min(limit, self.context - ids.shape[1] + 1), 0)]
        self.base, self.fed = ids.shape[1], 0  # the committed length drafted after; drafted nodes in the cache
        if not branching:
            return DraftTree.chain([])  # nothing drafted: commit only crops
        past = lm.cache_len(self.cache)
        assert ids.shape[1] - 2 <= past <= ids.shape[1] - 1 or past == 0, f"draft cache {past}, text {ids.shape[1]}"
        if all(b == 1 for b in branching):
            return self._chain(ids[:, past:], warp, len(branching))
        return self._tree(ids[:, past:], warp, branching)

    def _chain(self, x: Tensor, warp: Warp, n: int) -> DraftTree:
        # x: [1, 1] the pending token; [1, 2] after an all-accepted step; the prompt at first
        tokens, qs = [], []
        for _ in range(n):
            logits = lm.forward(self.model, x, self.cache, last=1)[:, -1]  # [1, V]
            if warp.greedy:
                x = logits.argmax(-1, keepdim=True)  # [1, 1]
            else:
                q = warp.probs(logits)  # [1, V] the same warping as the target's
                x = warp.sample(q)  # [1, 1]
                qs.append(q)
            tokens.append(x)
        self.fed = n - 1  # the cache now holds base + n - 1 positions: the last draft was never fed
        return DraftTree.chain(torch.cat(tokens, 1)[0].tolist(), torch.cat(qs) if qs else None)  # q: [n, V]

    def _tree(self, x: Tensor, warp: Warp, branching: list[int]) -> DraftTree:
        logits = lm.forward(self.model, x, self.cache, last=1)[0]  # [1, V] after the last committed token
        grower, qs = TreeBuilder(self.base), []
        for level, b in enumerate(branching):
            if level:  # feed the frontier: one forward, each node sees the text, its ancestors and itself
                tokens, positions, mask = grower.feed()  # [m], [m], [m, base + fed + m]
                frontier_ids = torch.tensor([tokens], device=x.device)  # [1, m]
                logits = lm.forward(self.model, frontier_ids, self.cache, positions, mask)[0]  # [m, V]
            if warp.greedy:
                kids = logits.topk(b, -1).indices  # [m, b] distinct picks
            else:
                q = warp.probs(logits)  # [m, V]
                kids = torch.multinomial(q, b, replacement=True, generator=warp.generator)  # [m, b] i.i.d.
                qs.append(q.repeat_interleave(b, 0))  # [m*b, V] each child's proposal row
            grower.grow_each(kids.tolist())
        self.fed = len(grower.fed)  # the nodes above the last level, in index order: the last level never was
        return grower.tree(torch.cat(qs) if qs else None)

    def commit(self, ids: Tensor, accepted: int, path: list[int], hidden=None) -> None:
        # keep the committed text's K/V (the last committed token stays pending): the accepted nodes that were
        # fed; after a fully accepted step the last draft never was, and the cache lags one token
        lm.keep(self.cache, self.base, [j for j in path[: ids.shape[1] - 1 - self.base] if j < self.fed])

    # ---- batched (chapter 09): every row's chain, one forward per level, the cache a `Ragged` over the rows ----

    def start_batch(self, target, texts: list[list[int]]) -> None:
        if any(b > 1 for b in self.branching):
            raise checks.ArgumentError(f"DraftModelDrafter(branching={self.branching}) drafts a tree. " + CHAINS_ONLY)
        self.start(target, torch.tensor([max(texts, key=len)]))  # the vocabulary and context checks
        self.rows, self.matched = Ragged(lm.new_cache(self.model), len(texts)), None  # rows: a prefix of each text

    def propose_batch(self, texts: list[list[int]], gammas: list[int], warp: Warp
                      ) -> list[tuple[list[int], Tensor | None]]:
        # the deepest draft is read at position T + γ - 2: a row near the end of the draft's context drafts fewer
        gammas = [max(min(g, self.context - len(t) + 1), 0) for t, g in zip(texts, gammas)]
        n, held = max(gammas), self.rows.lengths()
        self.matched = held  # the held slots that are the committed text's, whatever is accepted
        if n == 0:
            return [([], None)] * len(texts)
        x, tokens, qs = [t[h:] for t, h in zip(texts, held)], [], []  # [B] ragged: what each row's cache lacks
        for level in range(n):
            logits = self.rows.forward(self.model, x)[0][:, -1]  # [B, V] after each row's last token
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

    def commit_batch(self, texts: list[list[int]], alive: list[int], hidden=None) -> None:
        # keep what matches the committed text (the fed accepted drafts), at most all of it but the pending token
        self.rows.keep([min(len(texts[b]) - 1, self.matched[b]) for b in alive], alive)
