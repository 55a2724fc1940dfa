"""Tests for batched speculative decoding (serving.py, chapter 09).

* Ragged: a batch of rows of different lengths, fed and rolled back row by row, gives every row the logits a fresh
  single-sequence forward over its own text gives (fp32, 1e-4).
* Greedy: every row's output EQUALS its own single-sequence greedy decoding, on random models with EOS, with per-row
  γ, a policy, and a stateless drafter whose rows accept both drafts, one or none. Each batchable row of
  lineup.METHODS does the same on the zoo pair in test_exactness.py.
* Sampling: rows of two prompts of different lengths, decoded in batches with per-row γ (each prompt drafted with
  γ = 0, 1, 2 and 3), follow the target's exact joint distribution of their first 3 tokens (chapter 03's
  chi-square test, helpers.follows_target); a biased verifier fails the same test.
* Bad input: test_misuse.py.
"""
import pytest
import torch
from helpers import SAMPLING_SETTINGS, exact_first_tokens, follows_target, noisy_copy, prompt_ids, settings_id, tiny_llama

from specdec_lab import DraftModelDrafter, generate, lm, sampling
from specdec_lab.drafters import Drafter
from specdec_lab.ragged import Ragged
from specdec_lab.sampling import Warp
from specdec_lab.serving import generate_batch, switch_off_policy
from specdec_lab.tree import DraftTree


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(layers=3, seed=0)
    return target, noisy_copy(target, 0.05, seed=1)


def test_ragged_rows_match_single_forwards(pair):
    target, _ = pair
    texts = [prompt_ids(s, n)[0].tolist() for s, n in ((0, 5), (1, 9), (2, 2), (3, 7))]
    cache = Ragged(lm.new_cache(target), len(texts))
    cache.forward(target, [t[:-1] for t in texts])  # the prefill: every committed token but the pending one
    for step, (extra, keep) in enumerate([([3, 4, 5], [1, 3, 0, 2]), ([7], [1, 1, 1, 1]), ([8, 9], [2, 0, 1, 2])]):
        rows = [t[len(t) - 1:] + extra[:1 + b] for b, t in enumerate(texts)]  # ragged: row b feeds 2 + b tokens
        rows = [r[: 1 + (b + step) % 4] for b, r in enumerate(rows)]
        held = cache.lengths()
        logits, _ = cache.forward(target, rows, last=max(map(len, rows)))
        for b, (t, r) in enumerate(zip(texts, rows)):
            single = lm.forward(target, torch.tensor([t[:held[b]] + r]))[0, -len(r):]  # [len(r), V]
            torch.testing.assert_close(logits[b, -len(r):], single, atol=1e-4, rtol=0,
                                       msg=f"step {step}, row {b}: batched logits differ from a single forward")
        texts = [t + r[1: 1 + keep[b]] for b, (t, r) in enumerate(zip(texts, rows))]  # commit keep[b] of the new
        alive = [b for b in range(len(texts)) if b != step]  # one row leaves each step
        cache.keep([len(texts[b]) - 1 for b in alive], alive)
        texts = [texts[b] for b in alive]
        assert cache.lengths() == [len(t) - 1 for t in texts]
        assert cache.valid.shape[1] == max(len(t) for t in texts) - 1, "packed: no wider than the longest row"


class Echo(Drafter):
    """A stateless drafter of the learner's kind (it writes only propose), batched by Drafter's default batch
    members. It drafts the target's own next two greedy tokens, spoiling the first (texts of length 3k + 2) or the
    second (3k + 1), so rows accept both drafts, one or none, at different steps."""

    gamma = 2

    def __init__(self, target):
        self.target = target

    def propose(self, ids, warp, limit):
        n = min(limit, 2)
        if n <= 0:
            return DraftTree.chain([])
        tokens = generate(self.target, ids, max_new_tokens=n).tokens  # the target's greedy continuation
        spoil = {0: None, 1: n - 1, 2: 0}[ids.shape[1] % 3]
        if spoil is not None:
            tokens[spoil] = (tokens[spoil] + 1) % self.target.config.vocab_size
        return DraftTree.chain(tokens)


@pytest.mark.parametrize("make", ["draft-gamma-list", "policy", "stateless"])
def test_random_models_greedy_identity_with_eos(pair, make):
    target, noisy = pair
    prompts = [prompt_ids(s, 3 + 2 * s)[0].tolist() for s in range(6)]
    refs = [generate(target, [p], max_new_tokens=30).tokens for p in prompts]
    eos = refs[2][7]  # a token some rows emit: they stop there, at different steps
    refs = [generate(target, [p], max_new_tokens=30, eos_token_id=eos).tokens for p in prompts]
    drafter, gamma = {"draft-gamma-list": (DraftModelDrafter(noisy, 4), [0, 1, 2, 3, 4, 6]),
                      "policy": (DraftModelDrafter(noisy, 3), switch_off_policy(max_batch=3)),
                      "stateless": (Echo(target), None)}[make]
    out = generate_batch(target, prompts, drafter, max_new_tokens=30, eos_token_id=eos, gamma=gamma)
    assert out.tokens == refs, f"{make}: a row differs from its own greedy decoding"
    assert any(len(r) < 30 for r in refs) and any(len(r) == 30 for r in refs), "some rows should stop at EOS"
    if make == "draft-gamma-list":
        assert out.rows[0].draft_lengths == [0] * out.rows[0].target_calls, "γ = 0: plain decoding for that row"
        assert max(out.rows[5].draft_lengths) == 6
    if make == "policy":  # speculation stays off while more than 3 rows are active, then comes on
        assert out.rows[0].draft_lengths[0] == 0 and max(max(g.draft_lengths) for g in out.rows) == 3
    if make == "stateless":  # every path of the commit: both drafts kept, one, none
        kept = [a for g in out.rows for a in g.accept_lengths]
        assert {0, 1, 2} <= set(kept), kept
    assert out.steps == max(g.target_calls for g in out.rows)


@pytest.mark.parametrize("settings", SAMPLING_SETTINGS, ids=settings_id)
def test_batched_sampling_matches_target_distribution(small_vocab_pair, settings):
    target, draft = small_vocab_pair
    short, long = [1, 5, 2], [3, 0, 6, 6, 1, 7, 4]
    # 100 rows: two lengths; rows 2k and 2k + 1 share a draft length, so each prompt's rows get γ = 2, 3, 0, 1
    prompts, gamma = [short, long] * 50, [(2, 3, 0, 1)[(b // 2) % 4] for b in range(100)]
    g, samples, accepted = torch.Generator().manual_seed(7), {0: [], 1: []}, []
    first = {0: set(), 1: set()}  # the draft lengths of each prompt's first passes
    for _ in range(3000 // 50):
        # 4 new tokens: a row drafts at most one fewer than it has left, so γ = 3 drafts in full at the first pass
        out = generate_batch(target, prompts, DraftModelDrafter(draft, 3), max_new_tokens=4, generator=g,
                             gamma=gamma, **settings)
        for b, (row, tokens) in enumerate(zip(out.rows, out.tokens)):
            samples[b % 2].append(tokens[:3])
            first[b % 2].add(row.draft_lengths[0])
        accepted += [a for row in out.rows for a in row.accept_lengths]
    assert first == {0: {0, 1, 2, 3}, 1: {0, 1, 2, 3}}, f"each prompt should draft γ = 0 to 3, drafted {first}"
    for which, ids in ((0, short), (1, long)):
        follows_target(samples[which], exact_first_tokens(target, torch.tensor([ids]), Warp(**settings)),
                       f"{settings}, prompt of {len(ids)} tokens")
    assert 0.1 < sum(accepted) / len(accepted) < 1.5, "the draft should be accepted sometimes, not always"


def test_batched_sampling_test_catches_a_biased_verifier(small_vocab_pair, monkeypatch):
    """The test has power here too: replacing rejected drafts from p instead of the residual fails it."""
    target, draft = small_vocab_pair
    monkeypatch.setattr(sampling, "_residual", lambda p, q: p)
    g, samples = torch.Generator().manual_seed(7), []
    for _ in range(30):
        samples += generate_batch(target, [[1, 5, 2]] * 100, DraftModelDrafter(draft, 2), max_new_tokens=3,
                                  temperature=1.0, generator=g).tokens
    with pytest.raises(AssertionError, match="do not follow the target"):
        follows_target(samples, exact_first_tokens(target, torch.tensor([[1, 5, 2]]), Warp(1.0)))


def test_timing_and_bookkeeping(pair):
    target, noisy = pair
    prompts = [prompt_ids(s, 4 + s)[0].tolist() for s in range(3)]
    out = generate_batch(target, prompts, DraftModelDrafter(noisy, 3), max_new_tokens=12)
    assert [len(t) for t in out.tokens] == [12, 12, 12] and out.new_tokens == 36
    assert all(0 < t <= g.seconds <= out.seconds for t, g in zip(out.first_token_seconds, out.rows))
    assert out.throughput == pytest.approx(36 / out.seconds)
    assert max(out.first_token_seconds) <= out.prefill_seconds <= out.seconds, "the prefill is the first step"
    assert out.prefill_tokens == sum(g.accept_lengths[0] + 1 for g in out.rows), "the first step's tokens"
    assert out.decode_throughput == pytest.approx((36 - out.prefill_tokens) / (out.seconds - out.prefill_seconds))
    assert all(g.tau > 1 for g in out.rows), "the noisy copy should be accepted"
    assert generate_batch(target, prompts, max_new_tokens=0).tokens == [[], [], []]
