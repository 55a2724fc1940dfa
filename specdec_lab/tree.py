"""Draft trees: what every drafter proposes and the verifier checks.

A drafter returns a `DraftTree`: node i holds a token, the index of its parent node (-1 for a child of the
last committed token) and, for drafters that sample, the distribution q_i the token was drawn from.
Parents always come before their children. A chain (one child per node) is the case of chapter 03.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class DraftTree:
    """Drafted tokens arranged as a tree over the last committed token.

    tokens: n token ids. parents: n parent indices, -1 for a child of the last committed token, otherwise
    an earlier node. q: [n, V] the distribution each node's token was sampled from, or None when the
    drafter is deterministic (greedy, prompt lookup): the verifier then treats each node as one-hot.
    """

    tokens: list[int]
    parents: list[int]
    q: Tensor | None = field(default=None, repr=False)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a tree needs one parent per token, got {len(self.tokens)} tokens and "
                             f"{len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must be -1 or an earlier node")
        if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != len(self.tokens)):
            raise ValueError(f"q must be [n, V] with n = {len(self.tokens)} nodes, got {list(self.q.shape)}")

    @classmethod
    def chain(cls, tokens: Sequence[int], q: Tensor | None = None) -> DraftTree:
        """γ tokens in a row: node i is the child of node i - 1 (node 0 of the committed text)."""
        tokens = [int(t) for t in tokens]
        return cls(tokens, list(range(-1, len(tokens) - 1)), q)

    @property
    def is_chain(self) -> bool:
        """True when every node is the only child of the node before it (an empty tree is a chain too)."""
        return self.parents == list(range(-1, len(self.parents) - 1))

    def __len__(self) -> int:
        return len(self.tokens)
