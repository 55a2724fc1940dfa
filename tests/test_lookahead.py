"""Jacobi decoding and lookahead decoding (chapter 07): exact greedy output over its settings, the mask, bad settings.
The lookahead row (greedy with EOS and budget): test_exactness.py."""
import pytest
import torch

import specdec_lab
from specdec_lab import lm, measure
from specdec_lab.lookahead import jacobi_decode, jacobi_iteration, lookahead_generate, lookahead_layout
from specdec_lab.prompts import load_prompts


@pytest.mark.parametrize("pending, window, levels, guesses, ngram", [(1, 4, 3, 2, 4), (5, 3, 1, 1, 4), (1, 5, 6, 7, 7),
                                                                       (2, 1, 1, 0, 2)])
def test_every_row_sees_one_gapless_text(pending, window, levels, guesses, ngram):
    """Each token must see exactly the positions before it, once each: a consistent text to predict from."""
    mask, offsets = lookahead_layout(pending, window, levels, guesses, ngram)
    n = pending + levels * window + guesses * (ngram - 1)
    assert mask.shape == (n, n) and offsets.shape == (n,)
    for r in range(n):
        seen = sorted(offsets[mask[r]].tolist())
        assert seen == list(range(int(offsets[r]) + 1)), f"row {r} sees offsets {seen}"
    assert mask[pending:, :pending].all(), "every window and guess token sees all pending tokens"


def test_jacobi_reaches_greedy_in_at_most_n_iterations(pair):
    target, _, tok = pair
    for p in load_prompts()[::13]:
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        want = measure.hf_generate(target, ids, 8).tolist()
        for guess in (None, torch.randint(0, 4096, (8,), generator=torch.Generator().manual_seed(1)), want):
            res = jacobi_decode(target, ids, 8, guess=guess)
            assert res.tokens == want and res.iterations <= 8
            assert all(t[:k] == want[:k] for k, t in enumerate(res.trajectory)), "k passes fix the first k tokens"
        assert jacobi_decode(target, ids, 8, guess=want).iterations == 1  # the greedy output is a fixed point


def test_jacobi_iteration_updates_every_slot_from_the_old_guess(pair):
    target, _, tok = pair
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    guess = torch.tensor([5, 6, 7, 8])
    new = jacobi_iteration(target, ids, guess)
    for i in range(4):  # slot i: the argmax after the prompt and the OLD guesses 0..i-1
        x = torch.cat([ids, guess[None, :i]], 1)
        assert int(new[i]) == int(lm.forward(target, x)[0, -1].argmax())


def test_lookahead_needs_fewer_passes_than_tokens(pair):
    """τ on every fourth suite prompt (notebook 07 checks every second)."""
    target, _, tok = pair
    assert specdec_lab.lookahead_generate is lookahead_generate
    calls = tokens = 0
    for p in load_prompts()[::4]:
        gen = lookahead_generate(target, tok(p["prompt"], return_tensors="pt").input_ids, 40,
                                 eos_token_id=tok.eos_token_id)
        calls, tokens = calls + gen.target_calls, tokens + len(gen.tokens)
    assert tokens / calls > 1.2, f"lookahead should need fewer passes than tokens, got τ = {tokens / calls:.2f}"


@pytest.mark.parametrize("window, ngram, guesses, prompt_ngrams", [(1, 2, 1, False), (5, 7, 7, True), (3, 3, 8, False)])
def test_lookahead_settings_stay_exact(pair, window, ngram, guesses, prompt_ngrams):
    target, _, tok = pair
    for p in load_prompts()[5::17]:
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        want = measure.hf_generate(target, ids, 30).tolist()
        gen = lookahead_generate(target, ids, 30, window=window, ngram=ngram, guesses=guesses,
                                 prompt_ngrams=prompt_ngrams)
        assert gen.tokens == want, (p["id"], window, ngram, guesses)
        assert len(gen.accept_lengths) == len(gen.draft_nodes) == gen.target_calls
        assert all(n <= guesses * (ngram - 1) for n in gen.draft_nodes)


def test_lookahead_budgets_of_0_and_1_and_a_one_token_prompt(pair):
    target, _, tok = pair
    ids = tok(load_prompts("edit")[2]["prompt"], return_tensors="pt").input_ids
    assert lookahead_generate(target, ids, 0).tokens == []
    assert lookahead_generate(target, ids, 1).tokens == measure.hf_generate(target, ids, 1).tolist()
    one = lookahead_generate(target, ids[:, -1:], 12)  # a one-token prompt works
    assert one.tokens == measure.hf_generate(target, ids[:, -1:], 12).tolist()


@pytest.mark.parametrize("kwargs, words", [(dict(window=0), "window"), (dict(ngram=1), "ngram"),
                                           (dict(guesses=0), "guesses"), (dict(window=2.5), "window")])
def test_bad_settings_say_what_to_fix(pair, kwargs, words):
    target, _, tok = pair
    with pytest.raises(ValueError, match=words):
        lookahead_generate(target, tok("x = 1", return_tensors="pt").input_ids, 4, **kwargs)


def test_empty_prompt_is_refused(pair):
    target, _, _ = pair
    with pytest.raises(ValueError, match="prompt is empty"):
        lookahead_generate(target, torch.zeros(1, 0, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="prompt is empty"):
        jacobi_decode(target, torch.zeros(1, 0, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="n .*>= 1"):
        jacobi_decode(target, torch.tensor([[1, 2]]), 0)
