"""Chapter 03's graders: they pass right answers and name the mistake in wrong ones."""
import torch
from helpers import grader_tests, stub_rows

from specdec_lab import grading, lm, measure
from specdec_lab.sampling import residual


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


def _sampled(replace="residual", bonus=True, warp_draft=True, crop=True, accept="ratio"):
    def speculative_step_sampled(target, draft, ids, target_cache, draft_cache, gamma, warp):
        T = ids.shape[1]
        x = ids[:, lm.cache_len(draft_cache):]
        drafts, qs = [], []
        for _ in range(gamma):
            logits = lm.forward(draft, x, draft_cache)[0, -1:]
            q = warp.probs(logits) if warp_draft else torch.softmax(logits, -1)
            x = warp.sample(q)
            drafts.append(int(x))
            qs.append(q[0])
        tail = torch.cat([ids[:, lm.cache_len(target_cache):], torch.tensor([drafts])], 1)
        p = warp.probs(lm.forward(target, tail, target_cache)[0, -(gamma + 1):])
        u = torch.rand(gamma, generator=warp.generator)
        out = []
        for i, d in enumerate(drafts):
            ok = {"ratio": u[i] * qs[i][d] < p[i, d], "inverse": u[i] * p[i, d] < qs[i][d],
                  "reversed": u[i] * qs[i][d] >= p[i, d]}[accept]
            if ok:
                out.append(d)
            else:
                r = {"residual": residual(p[i], qs[i]), "p": p[i], "q - p": residual(qs[i], p[i])}[replace]
                out.append(int(torch.multinomial(r, 1, generator=warp.generator)))
                break
        else:
            if bonus == "q":  # the draft's next distribution (its cache put back: that is not the mistake)
                out.append(int(warp.sample(warp.probs(lm.forward(draft, x, draft_cache)[0, -1:]))))
                lm.crop(draft_cache, lm.cache_len(draft_cache) - 1)
            elif bonus == "p_prev":
                out.append(int(warp.sample(p[gamma - 1:gamma])))
            elif bonus == "argmax":
                out.append(int(p[gamma].argmax()))
            elif bonus:
                out.append(int(warp.sample(p[gamma:])))
        if crop:
            lm.crop(target_cache, T + len(out) - 1)
            lm.crop(draft_cache, T + len(out) - 1)
        return out

    return speculative_step_sampled


def _is_exact(pool=True, first_only=False, runs_used=1.0, reverse=False, p_value=False):
    def is_exact(decode, p, runs, significance=1e-3):
        V, k = p.shape[0], p.dim()
        n = int(runs * runs_used)
        counts = torch.zeros(p.numel(), dtype=torch.float64)
        for _ in range(n):
            index = 0
            for t in decode()[:k]:
                index = index * V + t
            counts[index] += 1
        probs = p.flatten().double()
        if first_only:
            counts, probs = counts.view(V, -1).sum(1), probs.view(V, -1).sum(1)
        expected = n * probs
        if pool:
            small = expected < 5
            counts = torch.cat([counts[~small], counts[small].sum()[None]])
            expected = torch.cat([expected[~small], expected[small].sum()[None]])
        pvalue = grading.chi_square(counts, expected / expected.sum())[1]
        if p_value:
            return pvalue
        return pvalue < significance if reverse else pvalue >= significance

    return is_exact


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
    (grading.check_speculative_step_sampled, _sampled(replace="p"), "replaced from p itself"),
    (grading.check_speculative_step_sampled, _sampled(replace="q - p"), "residual of q minus p"),
    (grading.check_speculative_step_sampled, _sampled(accept="inverse"), "probability q/p"),
    (grading.check_speculative_step_sampled, _sampled(accept="reversed"), "accept when u·q(x) < p(x)"),
    (grading.check_speculative_step_sampled, _sampled(bonus=False), "gives a bonus token"),
    (grading.check_speculative_step_sampled, _sampled(bonus="q"), "it follows the draft's q"),
    (grading.check_speculative_step_sampled, _sampled(bonus="p_prev"), "the last draft's own position"),
    (grading.check_speculative_step_sampled, _sampled(bonus="argmax"), "it is the target's argmax"),
    (grading.check_speculative_step_sampled, _sampled(warp_draft=False), "the same `warp.probs`"),
    (grading.check_speculative_step_sampled, _sampled(crop=False), "was not rolled back"),
    (grading.check_is_exact, _is_exact(pool=False), "pool the cells whose expected count is below 5"),
    (grading.check_is_exact, _is_exact(first_only=True), "not the first token alone"),
    (grading.check_is_exact, _is_exact(runs_used=0.1), "only 2000 of the 20000 times allowed"),
    (grading.check_is_exact, _is_exact(reverse=True), "rejected an EXACT decoder"),
    (grading.check_is_exact, _is_exact(p_value=True), "compare the p-value with `significance`"),
    *stub_rows(grading.check_speculative_step_sampled, grading.check_is_exact),
]

RIGHT = [
    (grading.check_cache_lengths, _lengths()),
    (grading.check_speculative_step, _step()),
    (grading.check_greedy_mismatches, _mismatches()),
    (grading.check_speculative_step_sampled, _sampled()),
    (grading.check_is_exact, _is_exact()),
]


test_graders = grader_tests(WRONG, RIGHT)
