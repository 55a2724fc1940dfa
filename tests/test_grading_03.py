"""Chapter 03's graders: they pass right answers and name the mistake in wrong ones."""
import re

import pytest
import torch

from specdec_lab import grading, lm, measure


def _lengths(target_offset=0, lag=True):
    def cache_lengths_after(committed, gamma, accepted):
        keep = committed + accepted + target_offset
        return keep, min(keep, committed + gamma - 1) if lag else keep

    return cache_lengths_after


def _step(crop_target=True, crop_draft=True, bonus=True, slice_last=True):
    def speculative_step(target, draft, ids, target_cache, draft_cache, gamma):
        T = ids.shape[1]
        x = ids[:, lm.cache_len(draft_cache):]
        drafts = []
        for _ in range(gamma):
            x = lm.forward(draft, x, draft_cache)[:, -1:].argmax(-1)
            drafts.append(x)
        drafts = torch.cat(drafts, 1)
        logits = lm.forward(target, torch.cat([ids[:, lm.cache_len(target_cache):], drafts], 1), target_cache)[0]
        best = (logits[-(gamma + 1):] if slice_last else logits[: gamma + 1]).argmax(-1)
        n = 0
        while n < gamma and int(drafts[0, n]) == int(best[n]):
            n += 1
        if crop_target:
            lm.crop(target_cache, T + n)
        if crop_draft:
            lm.crop(draft_cache, T + n)
        return best[: n + 1].tolist() if bonus or n < gamma else best[:n].tolist()

    return speculative_step


def _mismatches(length_counts=True, offset=0):
    def greedy_mismatches(target, decode, prompts, max_new_tokens):
        out = {}
        for i, ids in enumerate(prompts):
            want = measure.hf_generate(target, ids, max_new_tokens).tolist()
            got = decode(ids, max_new_tokens)
            first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
            if first is None and len(got) != len(want) and length_counts:
                first = min(len(got), len(want))
            if first is not None:
                out[i] = first + offset
        return out

    return greedy_mismatches


WRONG = [
    (grading.check_cache_lengths, _lengths(target_offset=1), "counts the new last token"),
    (grading.check_cache_lengths, _lengths(lag=False), "never fed its own last draft"),
    (grading.check_cache_lengths, lambda c, g, a: (c + a, c + g - 1), "keeps the KV of drafts that were rejected"),
    (grading.check_speculative_step, _step(crop_target=False), "crop it to"),
    (grading.check_speculative_step, _step(crop_draft=False), "crop it back to the committed length minus 1"),
    (grading.check_speculative_step, _step(bonus=False), "free bonus token"),
    (grading.check_speculative_step, _step(slice_last=False), "read the LAST γ+1 rows"),
    (grading.check_greedy_mismatches, _mismatches(length_counts=False), "one token short"),
    (grading.check_greedy_mismatches, _mismatches(offset=1), "position 5 (0-based"),
    (grading.check_greedy_mismatches, lambda t, d, p, n: {}, "did not report"),
]


@pytest.mark.parametrize("check, answer, hint", WRONG, ids=[f"{c.__name__}-{h[:20]}" for c, _, h in WRONG])
def test_graders_name_the_mistake(check, answer, hint):
    with pytest.raises(AssertionError, match=re.escape(hint)):
        check(answer)


@pytest.mark.parametrize("check, answer", [(grading.check_cache_lengths, _lengths()),
                                           (grading.check_speculative_step, _step()),
                                           (grading.check_greedy_mismatches, _mismatches())],
                         ids=lambda x: getattr(x, "__name__", ""))
def test_graders_pass_right_answers(check, answer, capsys):
    check(answer)
    assert capsys.readouterr().out.startswith("PASS")
