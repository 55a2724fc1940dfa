"""Jacobi decoding and lookahead decoding: the target drafts for itself, no draft model, no training.

Derived in notebooks/07_ngram_and_lookahead.ipynb.

Jacobi decoding guesses N future tokens and refines all of them in one forward pass per iteration; the
fixed point is the greedy continuation, reached in at most N iterations. Lookahead decoding (Fu et al.,
2024) keeps the last N - 1 Jacobi iterates of a window of W tokens, reads n-grams off them into an
`NgramPool`, and verifies up to G pooled n-grams that start with the current token, all in ONE forward pass:

    input  = [pending token(s) | window: N-1 levels x W | guesses: G x (N-1)]
    mask   = `lookahead_layout(...)`: window tokens see level 0 up to their column and the earlier levels of
             their column; each guess sees its own earlier tokens; everyone sees the committed text.

    gen = lookahead_generate(target, ids, max_new_tokens=64, window=4, ngram=4, guesses=4)

Greedy only: every emitted token is the target's argmax after the committed text, so the output equals
greedy decoding token for token.

Why lookahead keeps a loop of its own instead of riding `decoding.generate` as a drafter: its window is a
tree of nodes no verified path may pass through, and its drafter needs the target's predictions AT those
nodes (the next Jacobi level) back from the same forward; and it verifies G n-grams by the longest match,
where the tree walk takes the first matching child. Through `generate` that would mean a second kind of
node, the target's logits handed to the drafter, and a trie of the guesses: a harder loop for every method.
So it shares every piece instead: the mask (`tree.tree_mask`: the pending tokens, window and guesses are one
tree), the length/EOS `cut`, the rollback `lm.keep` and the statistics (`Generation.record`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec_lab import checks, lm
from specdec_lab.decoding import Generation, checked_prompt, cut
from specdec_lab.masks import require_custom_masks
from specdec_lab.ngram import NgramPool
from specdec_lab.tree import tree_depths, tree_mask

__all__ = ["jacobi_iteration", "jacobi_decode", "JacobiResult", "lookahead_layout", "lookahead_generate"]


# ---- Jacobi decoding ----------------------------------------------------------------------------------


def jacobi_iteration(target, ids: Tensor, guess: Tensor) -> Tensor:
    """One Jacobi update without a cache: ids [1, T], guess [N] -> the target's argmax at each guess slot, [N].

    new[i] = argmax p(. | ids, guess[:i]): all N slots updated from the OLD guess, in one forward pass.
    """
    T, N = ids.shape[1], guess.shape[0]
    logits = lm.forward(target, torch.cat([ids, guess.reshape(1, N).to(ids)], 1))  # [1, T+N, V]
    return logits[0, T - 1:T - 1 + N].argmax(-1)  # [N]: row T-1 predicts slot 0, row T-1+i predicts slot i


@dataclass
class JacobiResult:
    """tokens: the fixed point (= greedy continuation); iterations: forward passes used (<= N);
    trajectory: the guess before each pass, then the final tokens."""

    tokens: list[int]
    iterations: int
    trajectory: list[list[int]] = field(default_factory=list)


@torch.inference_mode()
def jacobi_decode(target, input_ids, n: int, guess=None) -> JacobiResult:
    """Decode n tokens by Jacobi iteration from `guess` (default: the last prompt token, n times).

    Stops at a fixed point (the update changes nothing) or after n passes: after k passes the first k tokens
    are certainly right (slot i only depends on slots < i), so n passes always reach the greedy output.
    The prompt is cached once; each pass feeds [last prompt token, guess[:-1]] and crops the cache back.
    """
    n = checks.integer(n, "n", "tokens to decode in parallel")
    ids, _ = checked_prompt(target, input_ids, n)  # [1, T]
    T = ids.shape[1]
    y = ids[0, -1:].repeat(n) if guess is None else torch.as_tensor(guess, dtype=torch.long, device=ids.device)
    if y.shape != (n,):
        raise checks.ArgumentError(f"guess must hold n = {n} token ids, got shape {list(y.shape)}")
    cache = lm.new_cache(target)
    if T > 1:
        lm.forward(target, ids[:, :-1], cache, last=1)  # the prompt but its last token, once
    trajectory, iterations = [y.tolist()], 0
    while iterations < n:
        x = torch.cat([ids[:, -1:], y[None, :-1]], 1)  # [1, n]: last prompt token, then guesses 0..n-2
        new = lm.forward(target, x, cache, last=n)[0].argmax(-1)  # [n]
        lm.keep(cache, T - 1)
        iterations += 1
        if torch.equal(new, y):
            break  # a fixed point: y already was the greedy continuation
        y = new
        trajectory.append(y.tolist())
    return JacobiResult(y.tolist(), iterations, trajectory)


# ---- lookahead decoding -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def lookahead_layout(pending: int, window: int, levels: int, guesses: int, ngram: int) -> tuple[Tensor, Tensor]:
    """The mask and position offsets of one lookahead pass: (bool [n, n], long [n]).

    Input order: `pending` committed-but-unfed tokens (causal; the last is the current token at offset
    pending - 1 =: t), then `levels` rows of `window` tokens (level l, column j at offset t + 1 + l + j), then
    `guesses` n-grams of ngram - 1 tokens (token i at offset t + 1 + i). n = pending + levels*W + guesses*(N-1).
    Window token (l, j) sees level 0 columns 0..j and levels 1..l of column j: consecutive positions, one
    Jacobi trajectory. Guess token i sees its own n-gram's tokens 0..i. All see the pending tokens.
    Cached per shape: the tensors returned are shared, do not modify them in place.
    """
    P, W, L, G, m = pending, window, levels, guesses, ngram - 1
    # one tree: the pending tokens are a chain; level 0 of the window continues it column by column, level l
    # continues column j of level l - 1; each guess is a chain off the current token
    parents = list(range(-1, P - 1))
    for l in range(L):
        parents += [(P - 1 if j == 0 else P + j - 1) if l == 0 else P + (l - 1) * W + j for j in range(W)]
    for g in range(G):
        start = P + L * W + g * m
        parents += [P - 1] + list(range(start, start + m - 1))
    return tree_mask(parents), torch.tensor(tree_depths(parents), dtype=torch.long)  # [n, n], [n]


@torch.inference_mode()
def lookahead_generate(target, input_ids, max_new_tokens: int = 64, eos_token_id=None, window: int = 4,
                       ngram: int = 4, guesses: int = 4, seed: int = 0, prompt_ngrams: bool = False) -> Generation:
    """Greedy lookahead decoding: identical output to the target's greedy decoding, in fewer target passes.

    window W: Jacobi window width; ngram N: n-gram size (the window keeps N - 1 levels); guesses G: pooled
    n-grams verified per step. Level 0 starts as W prompt tokens drawn with `seed`; until N - 1 levels exist
    no n-gram is collected. prompt_ngrams: also fill the pool with the prompt's own n-grams at the start.
    Generation.accept_lengths: pooled tokens accepted per pass; draft_lengths: N - 1 when guesses were verified
    (else 0); draft_nodes: guess tokens verified per pass (the window's tokens ride along unverified).
    Context: nothing is read past the target's position table. In the last N - 2 positions the guesses are
    cut to what fits; in the last W + N - 3 the window is left out (the pass verifies guesses only).
    """
    start = time.perf_counter()
    W = checks.integer(window, "window", "Jacobi window width W")
    N = checks.integer(ngram, "ngram", "n-gram size N", 2, "a key token plus at least one drafted token")
    G = checks.integer(guesses, "guesses", "n-grams verified per step G")
    seed = checks.integer(seed, "seed", "seeds the first window", 0)
    ids, max_new_tokens = checked_prompt(target, input_ids, max_new_tokens)  # [1, T0]
    eos = checks.eos_ids(eos_token_id)
    require_custom_masks(target, "lookahead decoding")
    context = lm.context_length(target) or float("inf")
    committed = ids[0].tolist()
    T0 = len(committed)
    pool = NgramPool(N, G)
    if prompt_ngrams:
        pool.update(committed[i:i + N] for i in range(T0 - N + 1))
    pick = torch.randint(0, T0, (W,), generator=torch.Generator().manual_seed(seed))
    levels = [[committed[i] for i in pick.tolist()]]  # [1, W] to start; grows to [N-1, W]
    cache = lm.new_cache(target)
    gen = Generation(tokens=[], target_calls=0)
    while len(committed) - T0 < max_new_tokens:
        past = lm.cache_len(cache)  # = len(committed) - 1 after the first pass
        room = context - len(committed)  # positions left after the current token's
        P = len(committed) - past
        L = len(levels) if len(levels) + W - 1 <= room else 0  # the window reaches position T + L + W - 2
        m = min(N - 1, room)  # guess tokens per n-gram: they sit at positions T .. T + m - 1
        cands = [c[:m] for c in pool.get(committed[-1])[-G:]]  # the G most recently seen n-grams after it
        mask, offsets = lookahead_layout(P, W, L, len(cands), m + 1)
        x = committed[past:] + [t for row in levels[:L] for t in row] + [t for c in cands for t in c]
        best = lm.forward(target, torch.tensor([x], device=ids.device), cache,
                          positions=past + offsets.to(ids.device), mask=mask)[0].argmax(-1).tolist()  # [n]
        # verification: pred[i] = the target's token after the current one and guess tokens 0..i-1
        emitted, used = [best[P - 1]], []
        for g, cand in enumerate(cands):
            base = P + L * W + g * m
            pred = [best[P - 1]] + best[base:base + m]  # [m + 1]
            k = next((i for i in range(m) if cand[i] != pred[i]), m)
            if k + 1 > len(emitted):
                emitted, used = pred[:k + 1], list(range(base, base + k))  # input indices of accepted tokens
        accepted = len(emitted) - 1
        # the lookahead branch: read n-grams off the columns, shift in the newest level
        out = best[P + (L - 1) * W:P + L * W]  # [W] predictions after the last level
        if L == N - 1:
            pool.update([row[j] for row in levels] + [out[j]] for j in range(W))
            levels = levels[1:] + [out]
        elif L:
            levels.append(out)
        # commit, cut at the budget and at EOS, keep the KV of the committed tokens only
        emitted, done = cut(emitted, max_new_tokens - (len(committed) - T0), eos)
        lm.keep(cache, past + P, [i - P for i in used[:len(emitted) - 1]])  # input i sits at cache position past + i
        committed += emitted
        assert lm.cache_len(cache) == len(committed) - 1, f"cache {lm.cache_len(cache)}, text {len(committed)}"
        gen.record(accepted, m if cands else 0, len(cands) * m)  # the window's L*W tokens are computed, not verified
        if done:
            break
    gen.tokens = committed[T0:]
    gen.seconds = time.perf_counter() - start
    return gen
