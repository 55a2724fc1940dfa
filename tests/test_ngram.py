"""Prompt lookup (Saxena 2023), the n-gram dictionary of notebook 07 and lookahead's n-gram pool (chapter 07).
The prompt-lookup row's exactness (greedy with EOS and budget, sampling, batching): test_exactness.py."""
import random

import pytest
import torch

import specdec_lab
from specdec_lab import decoding, measure
from specdec_lab.sampling import Warp
from specdec_lab.drafters import Drafter
from specdec_lab.ngram import NgramPool, PromptLookupDrafter, ngram_table, prompt_lookup
from specdec_lab.prompts import load_prompts


def reference_lookup(seq, num_tokens, max_ngram):
    """Straight from the definition: longest suffix first, latest earlier start first."""
    for n in range(max_ngram, 0, -1):
        starts = [s for s in range(len(seq) - n) if seq[s:s + n] == seq[len(seq) - n:]]
        if n < len(seq) and starts:
            s = max(starts)
            return seq[s + n:s + n + num_tokens]
    return []


def test_prompt_lookup_by_hand():
    seq = [5, 1, 2, 3, 9, 1, 2, 7, 4, 1, 2]
    assert prompt_lookup(seq, 3, max_ngram=2) == [7, 4, 1]  # (1, 2) last seen at 5: what follows it
    assert prompt_lookup(seq, 3, max_ngram=1) == [7, 4, 1]  # (2) last seen at 6
    assert prompt_lookup([1, 2, 3, 1, 2, 9, 2, 3], 2, max_ngram=3) == [1, 2]  # (9, 2, 3) never seen; (2, 3) at 1
    assert prompt_lookup([4, 5, 6, 5, 7, 4, 5], 5, max_ngram=2) == [6, 5, 7, 4, 5]  # (4, 5) at 0 wins over (5) at 3
    assert prompt_lookup([1, 2, 3], 4) == []  # the last token never occurred before
    assert prompt_lookup([8], 4) == [] and prompt_lookup([], 4) == []
    assert prompt_lookup([3, 3, 3], 5) == [3]  # overlapping match: (3, 3) at 0, one token follows before the end
    assert prompt_lookup(torch.tensor([[1, 2, 1]]), 2) == [2, 1] == prompt_lookup(torch.tensor([1, 2, 1]), 2)


def test_prompt_lookup_matches_its_definition_on_random_text():
    rng = random.Random(0)
    for _ in range(400):
        seq = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        k, m = rng.randrange(1, 8), rng.randrange(1, 5)
        assert prompt_lookup(seq, k, m) == reference_lookup(seq, k, m), (seq, k, m)


@pytest.mark.parametrize("kwargs, words", [(dict(num_tokens=0), "num_tokens"), (dict(num_tokens=3, max_ngram=0), "max_ngram"),
                                           (dict(num_tokens=2.5), "num_tokens"), (dict(num_tokens=True), "num_tokens")])
def test_bad_settings_say_what_to_fix(kwargs, words):
    with pytest.raises(ValueError, match=f"{words}.*>= 1"):
        prompt_lookup([1, 2, 1], **kwargs)
    with pytest.raises(ValueError, match=f"{words}.*>= 1"):
        PromptLookupDrafter(**kwargs)


def test_drafter_is_a_deterministic_chain_within_the_limit():
    assert specdec_lab.PromptLookupDrafter is PromptLookupDrafter and issubclass(PromptLookupDrafter, Drafter)
    d = PromptLookupDrafter(num_tokens=4, max_ngram=2)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 1, 2]])
    tree = d.propose(ids, Warp(), limit=10)
    assert tree.tokens == [3, 4, 5, 6] and tree.is_chain and tree.q is None
    assert d.propose(ids, Warp(), limit=2).tokens == [3, 4]
    assert len(d.propose(ids, Warp(), limit=0)) == 0
    assert len(d.propose(torch.tensor([[1, 2, 3]]), Warp(), limit=5)) == 0


def test_seed_002_dictionary():
    tokens = "for ( int i = 0 ; i < n ; i ++ ) { total += values [ i ] ; }".split()
    assert len(tokens) == 23
    table = ngram_table(tokens, n=4)
    assert len(table) == 16
    assert table["for"] == ("(", "int", "i", "=")
    assert table["total"] == ("+=", "values", "[", "i")
    assert table["i"] == ("=", "0", ";", "i")  # the first occurrence wins
    assert table.get("j", ()) == () and table.get("while", ()) == ()
    assert "]" not in table  # fewer than 4 tokens follow it
    with pytest.raises(ValueError, match="n .*>= 1"):
        ngram_table(tokens, n=0)


def test_pool_keeps_the_g_most_recently_seen():
    pool = NgramPool(n=3, guesses=2)
    pool.update([(1, 2, 3), (1, 4, 5), (2, 2, 2)])
    assert pool.get(1) == [(2, 3), (4, 5)] and pool.get(2) == [(2, 2)] and pool.get(9) == []
    pool.add((1, 2, 3))  # seen again: now the most recent
    assert pool.get(1) == [(4, 5), (2, 3)]
    pool.add((1, 6, 7))  # a third continuation: the least recently seen (4, 5) goes
    assert pool.get(1) == [(2, 3), (6, 7)] and len(pool) == 3
    with pytest.raises(ValueError, match="3-grams"):
        pool.add((1, 2))
    with pytest.raises(ValueError, match="n-gram size"):
        NgramPool(n=1, guesses=2)
    with pytest.raises(ValueError, match="guesses"):
        NgramPool(n=3, guesses=0)


def test_prompt_lookup_helps_on_copy_heavy_prompts(pair):
    """τ on every fourth suite prompt (notebook 07 checks every second)."""
    target, _, tok = pair
    taus = {}
    for p in load_prompts()[::4]:
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        gen = decoding.generate(target, ids, PromptLookupDrafter(), max_new_tokens=40, eos_token_id=tok.eos_token_id)
        taus.setdefault(p["category"], []).append(gen.tau)
    assert sum(taus["edit"]) / len(taus["edit"]) > 1.5, "copy-heavy prompts should accept many copied tokens"


def test_hf_prompt_lookup_is_exact_too(pair):
    target, _, tok = pair
    ids = tok(load_prompts("edit")[0]["prompt"], return_tensors="pt").input_ids
    want = decoding.generate(target, ids, None, max_new_tokens=30).tokens
    assert measure.hf_generate(target, ids, 30, prompt_lookup_num_tokens=10).tolist() == want


def test_prompt_lookup_samples_within_the_budget(pair):
    target, _, tok = pair
    ids = tok(load_prompts("edit")[1]["prompt"], return_tensors="pt").input_ids
    gen = decoding.generate(target, ids, PromptLookupDrafter(), max_new_tokens=25, temperature=0.8,
                            generator=torch.Generator().manual_seed(0))
    assert len(gen.tokens) == 25 and all(n <= d for n, d in zip(gen.accept_lengths, gen.draft_lengths))
