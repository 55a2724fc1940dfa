"""Drafting without a drafter: copy the continuation of an earlier occurrence of the text's last tokens.

Derived in notebooks/07_ngram_and_lookahead.ipynb.

    gen = generate(target, ids, PromptLookupDrafter(num_tokens=10, max_ngram=3), max_new_tokens=64)

Three small tables of the same idea:
  * `prompt_lookup`: search the text itself for its last n tokens (n = max_ngram .. 1) and propose what
    followed the most recent earlier match (prompt lookup decoding, Saxena 2023);
  * `ngram_table`: a dictionary from one token to the N tokens that followed its first occurrence, built once
    from the prompt: this course's own simplification (one-token key, first occurrence wins) of the table-style
    n-gram drafters of serving engines, such as TensorRT-LLM's NGram drafter (notebook 07, section 2);
  * `NgramPool`: lookahead decoding's pool, first token -> the G most recently seen (N-1)-token continuations.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from torch import Tensor

from specdec_lab import checks
from specdec_lab.drafters import Drafter
from specdec_lab.sampling import Warp
from specdec_lab.tree import DraftTree

__all__ = ["prompt_lookup", "PromptLookupDrafter", "ngram_table", "NgramPool"]


def _token_list(ids) -> list[int]:
    """Tokens given as a list (ids, or words in the notebook's examples), a [T] or a [1, T] tensor -> a list."""
    if isinstance(ids, Tensor):
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1:
            raise checks.ArgumentError(f"ids must be [T] or [1, T] token ids, got shape {list(ids.shape)}")
        return ids.tolist()
    return list(ids)


def prompt_lookup(ids, num_tokens: int, max_ngram: int = 3) -> list[int]:
    """Up to num_tokens tokens that followed the most recent earlier occurrence of the text's last n tokens.

    ids: the committed text (a list, [T] or [1, T]). Tries n = max_ngram, max_ngram - 1, ..., 1 and stops at
    the first n whose suffix occurs earlier; [] when even the last token never occurred before.
    """
    num_tokens = checks.integer(num_tokens, "num_tokens", "tokens to propose")
    max_ngram = checks.integer(max_ngram, "max_ngram", "longest suffix to look up")
    seq = _token_list(ids)
    T = len(seq)
    for n in range(min(max_ngram, T - 1), 0, -1):
        key, last = seq[T - n:], seq[-1]
        for start in range(T - n - 1, -1, -1):  # most recent first; the suffix itself (start = T - n) excluded
            if seq[start + n - 1] == last and seq[start:start + n] == key:
                return seq[start + n:start + n + num_tokens]  # at least one token: start + n <= T - 1
    return []


class PromptLookupDrafter(Drafter):
    """Drafts by `prompt_lookup` on the committed text: no model, no state, no training.

    A deterministic drafter (tree.q is None): the verifier treats each draft as one-hot, which is exact at any
    temperature (chapter 01: only the acceptance rate depends on q). Proposes nothing when nothing matches,
    and then the step is a plain decoding step.
    """

    def __init__(self, num_tokens: int = 10, max_ngram: int = 3):
        self.num_tokens = checks.integer(num_tokens, "num_tokens", "tokens drafted per step")
        self.max_ngram = checks.integer(max_ngram, "max_ngram", "longest suffix to look up")

    @property
    def gamma(self) -> int:
        """A row's chain in generate_batch (which batches this drafter through `Drafter`'s stateless defaults)."""
        return self.num_tokens

    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        n = min(self.num_tokens, limit)
        return DraftTree.chain(prompt_lookup(ids, n, self.max_ngram) if n > 0 else [])

    def __repr__(self) -> str:
        return f"PromptLookupDrafter(num_tokens={self.num_tokens}, max_ngram={self.max_ngram})"


def ngram_table(tokens: Sequence[Hashable], n: int = 4) -> dict:
    """An n-gram dictionary: each token -> the n tokens that followed its FIRST occurrence.

    The course's simplified form of an engine's n-gram table (engines key on longer patterns and keep the table
    up to date as text arrives); prompt lookup (Saxena 2023) searches the text instead.

    Built once from the prompt; a token enters only where n tokens follow it. Looking up the last generated
    token gives the draft: `table.get(token, ())`, nothing for a token never seen (or seen too late).
    """
    n = checks.integer(n, "n", "tokens stored after each key")
    tokens = list(tokens)
    table = {}
    for i in range(len(tokens) - n):
        table.setdefault(tokens[i], tuple(tokens[i + 1:i + 1 + n]))  # first occurrence wins
    return table


class NgramPool:
    """Lookahead decoding's n-gram pool: first token -> up to G continuations of N - 1 tokens each.

    `add(ngram)` stores ngram[1:] under ngram[0]; one already stored becomes the most recently seen, and a key
    holding more than G drops its least recently seen one. `get(token)` lists the continuations, oldest first.
    """

    def __init__(self, n: int, guesses: int):
        self.n = checks.integer(n, "n", "n-gram size", 2, "a first token and at least one more")
        self.guesses = checks.integer(guesses, "guesses", "continuations kept per first token")
        self.table: dict[int, list[tuple[int, ...]]] = {}

    def add(self, ngram: Sequence[int]) -> None:
        if len(ngram) != self.n:
            raise checks.ArgumentError(f"the pool stores {self.n}-grams, got {len(ngram)} tokens: {list(ngram)}")
        first, rest = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        kept = self.table.setdefault(first, [])
        if rest in kept:
            kept.remove(rest)  # seen again: it moves to the most recent end
        kept.append(rest)
        if len(kept) > self.guesses:
            del kept[0]  # the least recently seen goes

    def update(self, ngrams: Iterable[Sequence[int]]) -> None:
        for ngram in ngrams:
            self.add(ngram)

    def get(self, token: int) -> list[tuple[int, ...]]:
        return list(self.table.get(int(token), []))

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())

