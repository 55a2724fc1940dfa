"""Chapter 07's graders (exercises/07_ngram_and_lookahead.ipynb): drafting without a drafter.

1. `check_ngram_draft`: a one-token prompt lookup (copy what followed the most recent earlier occurrence of
   the last token, the last token where nothing is left to copy) with one-hot q's for the chain verifier;
   the reference is `ngram.prompt_lookup`, hints for the first occurrence, the match on itself, a copy that
   starts at the match.
2. `check_jacobi_iteration`: one Jacobi update on a tiny random Llama, every slot from the old guess in one
   forward (`lookahead.jacobi_iteration`); hints for rows one off, greedy decoding, a forgotten prompt.
3. `check_pool_update`: lookahead's n-gram pool keeps the G most recently seen continuations per first token
   (`ngram.NgramPool`), checked after every update of a stream of 3-grams for G = 2, 3, 1.
4. `check_lookahead_mask`: the attention mask of one lookahead pass over [current token | window of N - 1
   levels x W columns | G guessed n-grams of N - 1 tokens], against `lookahead.lookahead_layout` with one
   pending token; the first wrong entry is named by the groups of its query and key (window tokens seeing
   other columns or later positions, guesses seeing the window or each other, guesses not causal).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec_lab import lookahead
from specdec_lab.grading._common import call, check, grader, one_thread, passed, seeded, tiny_pair
from specdec_lab.ngram import NgramPool, prompt_lookup


def _ngram_draft_reference(seq: list[int], gamma: int) -> list[int]:
    """Exercise 07.1's rule: the library's prompt lookup on the last token alone (`ngram.prompt_lookup` with
    max_ngram=1: what followed its most recent EARLIER occurrence), filled up with the last token where there
    is no match or the copy runs past the end of the text."""
    return (prompt_lookup(seq, gamma, max_ngram=1) + [seq[-1]] * gamma)[:gamma]


@grader
def check_ngram_draft(ngram_draft: Callable) -> None:
    """Exercise 07.1: ngram_draft(prefix_ids [1, T], gamma, vocab_size) -> (gamma token ids, gamma [1, V] one-hots)."""
    V = 23
    cases = [([3, 7, 1, 5, 7, 2, 9, 7], 3), ([4, 5, 6, 4, 8, 1, 4], 2), ([1, 2, 3, 1, 2, 3, 4, 2, 6, 2], 4),
             ([9, 8, 7], 2), ([5], 3), ([6, 1, 6], 4), ([2, 2, 2, 2], 1), ([0, 11, 22, 0, 5, 22], 5)]
    for seq, gamma in cases:
        case = f"ngram_draft(torch.tensor([{seq}]), gamma={gamma}, vocab_size={V})"
        out = call(ngram_draft, torch.tensor([seq]), gamma, V)
        check(isinstance(out, (tuple, list)) and len(out) == 2,
              f"{case} should return two lists (draft_tokens, draft_probs), got {out!r}")
        tokens, probs = out
        try:
            tokens = [int(t) for t in tokens]
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"{case}: draft_tokens should be a list of token ids (ints), got {tokens!r}") from None
        want = _ngram_draft_reference(seq, gamma)
        if tokens != want:
            check(len(tokens) == gamma, f"{case} returned {len(tokens)} tokens {tokens}: return exactly gamma = "
                  f"{gamma}, filling with the last token ({seq[-1]}) where there is nothing to copy")
            key, T = seq[-1], len(seq)
            earlier = [j for j in range(T - 1) if seq[j] == key]
            after_first = [seq[j] if j < T else key for j in range(earlier[0] + 1, earlier[0] + 1 + gamma)] if earlier else None
            if len(earlier) > 1 and tokens == after_first:
                check(False, f"{case} = {tokens} copies after the FIRST occurrence of {key}; use the most recent "
                      "earlier one (scan from the right)")
            if tokens == [key] * gamma and earlier:
                check(False, f"{case} = {tokens} found no match, but {key} occurs earlier at position {earlier[-1]}: "
                      "the last token always matches itself, so search positions T-2 down to 0 only")
            if earlier and tokens == [seq[j] if j < T else key for j in range(earlier[-1], earlier[-1] + gamma)]:
                check(False, f"{case} = {tokens} starts with the matched token itself; copy the tokens AFTER the "
                      f"match (positions {earlier[-1] + 1}, {earlier[-1] + 2}, ...)")
            check(False, f"{case} = {tokens}, expected {want}: find the most recent earlier position of the last "
                  "token, copy the gamma tokens after it, and propose the last token where the text runs out")
        check(isinstance(probs, (list, tuple)) and len(probs) == gamma,
              f"{case}: draft_probs should be a list of gamma = {gamma} distributions, got {type(probs).__name__}")
        for i, (t, q) in enumerate(zip(tokens, probs)):
            q = torch.as_tensor(q)
            check(tuple(q.shape) == (1, V), f"{case}: draft_probs[{i}] has shape {list(q.shape)}; each q is [1, "
                  f"vocab_size] = [1, {V}], like one row of a model's probabilities")
            check(q.is_floating_point(), f"{case}: draft_probs[{i}] is {q.dtype}; probabilities are floats")
            check(float(q[0, t]) == 1.0 and float(q.sum()) == 1.0, f"{case}: draft_probs[{i}] should be one-hot "
                  f"on the proposed token {t} (1 there, 0 elsewhere): a deterministic drafter proposes it with "
                  "probability 1")
    passed("exercise 1: ngram_draft copies after the most recent earlier match, falls back to the last token, "
           "and gives one-hot q's for the chain verifier")


@grader
def check_jacobi_iteration(jacobi_iteration: Callable) -> None:
    """Exercise 07.2: jacobi_iteration(target, ids [1, T], guess [N]) -> the updated guess [N]."""
    with one_thread(), torch.no_grad():
        target = tiny_pair(seed=5)[0]
        for T, N, seed in [(5, 4, 0), (1, 3, 1), (12, 6, 2), (7, 1, 3)]:
            g = seeded(90 + seed)
            ids, guess = torch.randint(0, 211, (1, T), generator=g), torch.randint(0, 211, (N,), generator=g)
            case = f"a {T}-token prompt and a guess of N = {N} tokens"
            out = call(jacobi_iteration, target, ids, guess.clone())
            out = torch.as_tensor(out)
            check(out.dim() >= 1 and out.shape[-1] == N and out.numel() == N and not out.is_floating_point(),
                  f"{case}: return N = {N} token ids (the argmax at each slot), got {out.dtype} {list(out.shape)}")
            got, want = out.reshape(-1).tolist(), lookahead.jacobi_iteration(target, ids, guess).tolist()
            if got == want:
                continue
            logits = target(torch.cat([ids, guess[None]], 1)).logits[0]  # [T+N, V]
            check(got != logits[T:T + N].argmax(-1).tolist(), f"{case}: you read rows T..T+N-1 of the logits; row "
                  "T-1 (the last prompt token) predicts slot 0, so slot i comes from row T-1+i")
            greedy, x = [], ids
            for _ in range(N):
                greedy.append(int(target(x).logits[0, -1].argmax()))
                x = torch.cat([x, torch.tensor([[greedy[-1]]])], 1)
            check(got != greedy, f"{case}: you decoded N tokens one after another (greedy decoding); a Jacobi "
                  "iteration updates all N slots at once, each from the OLD guess before it, in one forward pass")
            check(got != target(guess[None]).logits[0].argmax(-1).tolist(), f"{case}: the model must read the "
                  "prompt too: feed torch.cat([ids, guess]), not the guess alone")
            check(False, f"{case}: got {got}, expected {want}: slot i is the argmax after ids and guess[:i]")
    passed("exercise 2: one Jacobi iteration updates every slot in parallel from the previous guess")


@grader
def check_pool_update(pool_update: Callable) -> None:
    """Exercise 07.3: pool_update(pool, ngram, guesses) updates {first token: [continuations, oldest first]}."""
    stream = [(1, 2, 3), (4, 5, 6), (1, 7, 8), (1, 2, 3), (1, 9, 9), (4, 5, 6), (1, 7, 8), (1, 6, 6), (2, 1, 1)]
    for guesses in (2, 3, 1):
        pool, reference = {}, NgramPool(len(stream[0]), guesses)
        want = reference.table  # first token -> continuations, oldest first
        for step, ngram in enumerate(stream):
            before = {k: list(v) for k, v in pool.items()}
            out = call(pool_update, pool, ngram, guesses)
            pool = out if isinstance(out, dict) else pool
            reference.add(ngram)
            got = {k: [tuple(c) for c in v] for k, v in pool.items()}
            if got == want:
                continue
            case = f"guesses = {guesses}: pool {before}, then pool_update(pool, {ngram})"
            key, rest = ngram[0], tuple(ngram[1:])
            kept = got.get(key, [])
            check(key in got, f"{case}: nothing stored under the first token {key}")
            check(tuple(ngram) not in kept, f"{case} stored {tuple(ngram)} under {key}; store the continuation "
                  f"ngram[1:] = {rest}, the key is already its first token")
            check(kept.count(rest) <= 1, f"{case} gives {kept}: {rest} was already stored; move it to the most recent "
                  "end instead of storing it twice")
            check(len(kept) <= guesses, f"{case} gives {kept}: keep at most guesses = {guesses} continuations per "
                  "first token; drop the least recently seen")
            check(not kept or kept[-1] == rest, f"{case} gives {kept}: {rest} was just seen, so it is the most "
                  "recent and goes last (also when it was already stored: move it)")
            check(False, f"{case} gives {kept}, expected {want[key]}: when a key holds more than guesses = "
                  f"{guesses}, drop the LEAST recently seen one (the first in the list), not the newest")
    passed("exercise 3: the pool keeps the G most recently seen continuations per first token")


def _lookahead_slot(i: int, W: int, m: int) -> tuple:
    """What input i of a lookahead pass is: ("current",), ("window", level, column) or ("guess", n-gram, token)."""
    if i == 0:
        return ("current",)
    if i <= m * W:
        return ("window", (i - 1) // W, (i - 1) % W)
    return ("guess", (i - 1 - m * W) // m, (i - 1 - m * W) % m)


def _slot_name(s: tuple) -> str:
    return {"current": lambda: "the current token", "window": lambda: f"window level {s[1]}, column {s[2]}",
            "guess": lambda: f"guess {s[1]}, token {s[2]}"}[s[0]]()


def _lookahead_hint(q: tuple, k: tuple, sees: bool) -> str:
    """Why query q should (not) see key k, naming the usual mistake."""
    if q == k:
        return "every token sees itself: the diagonal is True"
    if k[0] == "current":
        return "every token sees the current token (column 0), like the rest of the committed text"
    if q[0] == "current":
        return "the current token sees only itself (and the cached text): it comes first"
    if q[0] == "window" and k[0] == "window":
        if sees and k[1] >= 1 and k[2] != q[2]:
            return ("window tokens see other columns: beyond level 0 a window token sees only its own column, "
                    "one Jacobi trajectory")
        if sees and k[1] == 0 and k[2] > q[2]:
            return "a window token sees level 0 only up to its own column: later columns sit at later positions"
        if sees:
            return "a window token sees the levels of its own column only up to its own level"
        return ("a window token misses part of its trajectory: level 0 up to its own column, then its column's "
                "levels up to its own")
    if q[0] == "window":
        return "window tokens see the guesses: the guesses are drafts, not part of the window's text"
    if k[0] == "window":
        return "guesses see the window: a guess continues the current token, not the window"
    if k[1] != q[1]:
        return "guesses see other n-grams: each guess is a separate branch, blind to the others"
    if sees:
        return "guesses are not causal within their own n-gram: token i sees its tokens 0..i only"
    return "a guess token sees every earlier token of its own n-gram (and itself)"


@grader
def check_lookahead_mask(lookahead_mask: Callable) -> None:
    """Exercise 07.4: lookahead_mask(window, ngram, guesses) -> bool [n, n], n = 1 + (W + G)(N - 1)."""
    for W, N, G in [(3, 3, 2), (4, 4, 2), (2, 5, 3), (5, 2, 1), (3, 4, 0), (1, 3, 4)]:
        m = N - 1
        n = 1 + (W + G) * m
        case = f"lookahead_mask(window={W}, ngram={N}, guesses={G})"
        got = call(lookahead_mask, W, N, G)
        check(isinstance(got, torch.Tensor), f"{case} should return a torch tensor, got {type(got).__name__}")
        check(tuple(got.shape) == (n, n), f"{case} has shape {list(got.shape)}: the pass holds 1 current token, "
              f"{m} levels x {W} columns and {G} n-grams of {m} tokens, n = {n}, so the mask is [{n}, {n}]")
        check(got.dtype == torch.bool, f"{case} is {got.dtype}: return a bool mask (True where attention is "
              "allowed)")
        want = lookahead.lookahead_layout(1, W, m, G, N)[0]
        if torch.equal(got, want):
            continue
        wrong = (got != want).nonzero().tolist()
        rank = {"current": 0, "window": 1, "guess": 2}  # report a wrong row of the earliest group first
        i, j = min(wrong, key=lambda ij: (rank[_lookahead_slot(ij[0], W, m)[0]], ij[0], ij[1]))
        q, k = _lookahead_slot(i, W, m), _lookahead_slot(j, W, m)
        sees = bool(got[i, j])
        check(False, f"{_lookahead_hint(q, k, sees)}. In {case}, row {i} ({_slot_name(q)}) "
              f"{'sees' if sees else 'does not see'} column {j} ({_slot_name(k)})")
    passed("exercise 4: the lookahead mask: one Jacobi trajectory per window column, each guess a causal branch "
           "off the current token")
