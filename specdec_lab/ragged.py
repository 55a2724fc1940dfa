"""A Hugging Face KV cache for a batch of texts of different lengths: the serving loop's cache (chapter 09).

    cache = Ragged(lm.new_cache(model), B)
    logits, _ = cache.forward(model, rows)        # each row's new tokens, right-aligned, in ONE forward
    cache.keep(lengths, alive)                    # each row keeps its first lengths[b] tokens; rows that left go

Each model's cache [B, heads, L, d] comes with a mask valid [B, L] of the slots that hold the row's text, in
order. Everything a row feeds is right-aligned (left padding), so a row's last token is in the last column; pads
are hidden by the mask, and positions are counted per row from the mask, so a pad never moves a token's rotary
position. `keep` is the one rollback, a gather per layer that also packs the rows to the right again. Both the
batched loop (serving) and the drafters' batched forms (a draft model's chain, EAGLE's) keep their caches in one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from specdec_lab import lm

__all__ = ["Ragged"]


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
