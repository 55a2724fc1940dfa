"""A draft vocabulary: let a draft score only the target's most frequent tokens (Li et al. 2025, EAGLE-3; Zhao et
al. 2025, FR-Spec).

On a small model with a large vocabulary the LM head is most of a draft's cost: SmolLM2-135M's is 49152 x 576,
more multiply-adds than an EAGLE draft's whole decoder layer. A draft that scores only the Vd tokens the target
picks most often (`d2t`: draft index -> token id) reads Vd rows of the target's head instead. Its logits go back
over the full vocabulary, -inf elsewhere (`scatter`), so every drafted token is a target token and verification
does not change: greedy outputs and sampled distributions stay the target's. Training scores only the positions
whose label is in the draft vocabulary (`to_draft` gives -100, which cross-entropy ignores, for the rest).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["frequent_tokens", "scatter", "to_draft"]


def frequent_tokens(labels: Tensor, size: int, always: Sequence[int] = ()) -> Tensor:
    """The `size` tokens the target picks most often in `labels` (its own greedy choices), with `always` (e.g. the
    end-of-turn token) among them: [size] token ids, ascending."""
    counts = torch.bincount(labels.reshape(-1), minlength=int(labels.max()) + 1).float()  # [V']
    counts[list(always)] = float("inf")
    return counts.topk(min(size, len(counts))).indices.sort().values


def scatter(small: Tensor, d2t: Tensor, vocab: int) -> Tensor:
    """Draft-vocabulary logits [.., Vd] -> full logits [.., V], -inf outside the draft vocabulary."""
    full = small.new_full((*small.shape[:-1], vocab), float("-inf"))  # [.., V]
    return full.index_copy_(-1, d2t.to(small.device), small)


def to_draft(labels: Tensor, d2t: Tensor, vocab: int) -> Tensor:
    """Token ids [..] -> draft indices [..]; -100 for tokens outside the draft vocabulary (and for -100, unscored)."""
    t2d = torch.full((vocab,), -100, dtype=torch.long, device=labels.device)  # [V]
    t2d[d2t.to(labels.device)] = torch.arange(len(d2t), device=labels.device)
    return t2d[labels.clamp(min=0)].masked_fill(labels < 0, -100)
