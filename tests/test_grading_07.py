"""Chapter 07's graders: they pass right answers and name the mistake in wrong ones."""
import torch
from helpers import grader_tests, stub_rows

from specdec_lab import grading, lm
from specdec_lab.lookahead import lookahead_layout as lm_layout


def _ngram(first=False, search_from_end=False, include_match=False, pad=True, q_shape="row"):
    def ngram_draft(prefix_ids, gamma, vocab_size):
        seq = prefix_ids[0].tolist()
        T, key = len(seq), seq[-1]
        order = range(T) if first else range(T - 1 if search_from_end else T - 2, -1, -1)
        match = next((j for j in order if seq[j] == key and (search_from_end or j < T - 1)), -1)
        start = match if include_match else match + 1
        tokens = [seq[start + k] if match != -1 and start + k < T else key for k in range(gamma)]
        if not pad:
            tokens = [t for k, t in enumerate(tokens) if match != -1 and start + k < T]
        probs = []
        for t in tokens:
            q = torch.zeros(vocab_size) if q_shape == "flat" else torch.zeros(1, vocab_size)
            q[..., t] = 1.0
            probs.append(q)
        return tokens, probs

    return ngram_draft


def _jacobi(rows="right", mode="parallel"):
    def jacobi_iteration(target, ids, guess):
        T, N = ids.shape[1], len(guess)
        if mode == "sequential":
            out, x = [], ids
            for _ in range(N):
                out.append(int(lm.forward(target, x)[0, -1].argmax()))
                x = torch.cat([x, torch.tensor([[out[-1]]])], 1)
            return torch.tensor(out)
        if mode == "no prompt":
            return lm.forward(target, guess[None])[0].argmax(-1)
        logits = lm.forward(target, torch.cat([ids, guess[None]], 1))[0]
        start = T - 1 if rows == "right" else T
        out = logits[start:start + N]
        return out if mode == "logits" else out.argmax(-1)

    return jacobi_iteration


def _pool(refresh=True, dedupe=True, evict="oldest", store="rest", cap=True):
    def pool_update(pool, ngram, guesses):
        kept = pool.setdefault(ngram[0], [])
        value = tuple(ngram[1:]) if store == "rest" else tuple(ngram)
        if value in kept and dedupe:
            if not refresh:
                return
            kept.remove(value)
        kept.append(value)
        if cap and len(kept) > guesses:
            kept.pop(0 if evict == "oldest" else -2)

    return pool_update


def _mask(window_columns="own", guess_sees_window=False, guess_causal=True, guess_others=False, current=True,
          dtype=torch.bool):
    def lookahead_mask(W, N, G):
        m = N - 1
        n = 1 + (W + G) * m
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[:, 0] = current
        mask[0, 0] = True
        for l in range(m):
            for j in range(W):
                q = 1 + l * W + j
                mask[q, 1:2 + j] = True
                for level in range(1, l + 1):
                    if window_columns == "own":
                        mask[q, 1 + level * W + j] = True
                    else:  # every column up to its own at each level
                        mask[q, 1 + level * W:2 + level * W + j] = True
        for g in range(G):
            start = 1 + m * W + g * m
            for i in range(m):
                q = start + i
                mask[q, (1 + m * W if guess_others else start):(q + 1 if guess_causal else start + m)] = True
                if guess_sees_window:
                    mask[q, 1:1 + m * W] = True
        return mask.to(dtype)

    return lookahead_mask


WRONG = [
    (grading.check_lookahead_mask, _mask(window_columns="all"), "window tokens see other columns"),
    (grading.check_lookahead_mask, _mask(guess_sees_window=True), "guesses see the window"),
    (grading.check_lookahead_mask, _mask(guess_causal=False), "not causal within their own n-gram"),
    (grading.check_lookahead_mask, _mask(guess_others=True), "guesses see other n-grams"),
    (grading.check_lookahead_mask, _mask(current=False), "every token sees the current token"),
    (grading.check_lookahead_mask, _mask(dtype=torch.long), "return a bool mask"),
    (grading.check_lookahead_mask,
     lambda W, N, G: torch.ones(1 + (W + G) * (N - 1), 1 + (W + G) * (N - 1)).tril().bool(),
     "level 0 only up to its own column"),
    (grading.check_ngram_draft, _ngram(first=True), "FIRST occurrence"),
    (grading.check_ngram_draft, _ngram(search_from_end=True), "always matches itself"),
    (grading.check_ngram_draft, _ngram(include_match=True), "starts with the matched token itself"),
    (grading.check_ngram_draft, _ngram(pad=False), "return exactly gamma"),
    (grading.check_ngram_draft, _ngram(q_shape="flat"), "[1, vocab_size]"),
    (grading.check_ngram_draft, lambda ids, g, v: (_ngram()(ids, g, v)[0], [torch.ones(1, v) / v] * g), "one-hot"),
    (grading.check_jacobi_iteration, _jacobi(rows="shifted"), "row T-1 (the last prompt token) predicts slot 0"),
    (grading.check_jacobi_iteration, _jacobi(mode="sequential"), "one after another"),
    (grading.check_jacobi_iteration, _jacobi(mode="no prompt"), "read the prompt too"),
    (grading.check_jacobi_iteration, _jacobi(mode="logits"), "return N = "),
    (grading.check_pool_update, _pool(dedupe=False), "instead of storing it twice"),
    (grading.check_pool_update, _pool(refresh=False), "was just seen"),
    (grading.check_pool_update, _pool(evict="newest"), "LEAST recently seen"),
    (grading.check_pool_update, _pool(store="whole"), "store the continuation"),
    (grading.check_pool_update, _pool(cap=False), "at most guesses"),
    *stub_rows(grading.check_ngram_draft, grading.check_jacobi_iteration, grading.check_pool_update,
              grading.check_lookahead_mask),
]

RIGHT = [
    (grading.check_ngram_draft, _ngram()),
    (grading.check_jacobi_iteration, _jacobi()),
    (grading.check_pool_update, _pool()),
    (grading.check_lookahead_mask, _mask()),
    (grading.check_lookahead_mask, lambda W, N, G: lm_layout(1, W, N - 1, G, N)[0].clone()),
]


test_graders = grader_tests(WRONG, RIGHT)
