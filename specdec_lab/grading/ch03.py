"""Chapter 03's graders (exercises/03_draft_target.ipynb): a draft model and its target, greedy.

1. `check_cache_lengths`: how many positions each KV cache keeps after `accepted` of `gamma` drafts pass: the
   target committed - 1 (the new last token stays pending), the draft one fewer when every draft passed.
2. `check_speculative_step`: one greedy speculative step on tiny random Llamas (a noisy copy of the target,
   the target itself, an unrelated model as draft; γ = 1, 3, 5; three prompts): every run must equal the
   target's greedy decoding (`measure.hf_generate`), emit as many tokens as drafts match plus one, and leave
   both caches at the right length after every step.
3. `check_greedy_mismatches`: the learner's comparison with greedy decoding finds nothing for the library's
   `generate` and the first wrong position for a decoder with a wrong token, one too few and one too many.
4. `check_speculative_step_sampled`: one SAMPLED speculative step on tiny random Llamas with an 8-token vocabulary:
   with the target as its own draft every draft must pass (γ + 1 tokens a step, else the warps differ or the
   bonus is missing); with an unrelated draft, over many seeded runs, the first token and the first two tokens
   must follow the target's exact distribution (chi-square; the exact distributions of typical wrong rules name
   the mistake), and both caches must be rolled back after every step; in the γ = 1 steps where the draft
   passed, the bonus token must follow the target's next row (a bonus from q, from p[γ-1] or by argmax fails).
5. `check_is_exact`: the learner's own exactness test must accept three exact decoders (speculative sampling with
   different drafts and γ, and plain sampling) and reject two subtly biased ones (the replacement drawn from p,
   the bonus token drawn from q) on a long-tailed 16-token Markov target, at significance 1e-3, with the runs
   allowed; the decoders are plain Python with seeded generators, so the verdicts are fixed.

The library keeps the cache lengths inside `generate` and `DraftModelDrafter` (no function returns them), so
the grader states them itself, and `_greedy_accepted` counts a step's matching drafts with plain forwards.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import accumulate

import torch
from torch import Tensor

from specdec_lab import lm, measure
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.grading._common import (P_VALUE_MIN, call, check, chi_square, fmt, grader, one_thread, passed,
                                         seeded, tiny_llama, tiny_pair)
from specdec_lab.sampling import Warp
from specdec_lab.sampling import residual as _residual


@grader
def check_cache_lengths(cache_lengths_after: Callable[[int, int, int], tuple]) -> None:
    """Exercise 03.1: positions each cache keeps after `accepted` of `gamma` drafts pass.

    Before the step the text has `committed` tokens; the target's cache holds committed - 1 of them.
    """
    fn = cache_lengths_after
    for committed, gamma, accepted in [(10, 4, 0), (10, 4, 2), (10, 4, 3), (10, 4, 4), (7, 1, 0), (7, 1, 1),
                                       (25, 6, 6), (25, 6, 5), (3, 8, 1)]:
        got = call(fn, committed, gamma, accepted)
        case = f"cache_lengths_after(committed={committed}, gamma={gamma}, accepted={accepted})"
        check(isinstance(got, (tuple, list)) and len(got) == 2,
              f"{case} should return two ints (target_keeps, draft_keeps), got {got!r}")
        target_keeps, draft_keeps = (int(v) for v in got)
        new_len = committed + accepted + 1  # accepted drafts + one token of the target's own
        want_target, want_draft = new_len - 1, min(new_len - 1, committed + gamma - 1)
        if target_keeps != want_target:
            check(target_keeps != new_len, f"{case}: target_keeps = {target_keeps} counts the new last token; it "
                  "stays pending (fed first in the next step), so the cache holds the committed length minus 1")
            check(target_keeps != committed + gamma, f"{case}: target_keeps = {target_keeps} is everything the "
                  "verify pass wrote: the KV of rejected drafts must be dropped")
            check(False, f"{case}: target_keeps = {target_keeps}; the text now has {new_len} tokens "
                  f"({committed} + {accepted} accepted + 1 from the target); notebook 03, section 2, derives what "
                  "the cache keeps")
        if draft_keeps != want_draft:
            if accepted == gamma:
                check(False, f"{case}: draft_keeps = {draft_keeps}, but with every draft accepted the draft model "
                      f"has only computed KV for {committed + gamma - 1} positions: it never fed its own last "
                      "draft, so its cache lags one token behind the target's")
            check(draft_keeps != committed + gamma - 1, f"{case}: draft_keeps = {draft_keeps} keeps the KV of "
                  "drafts that were rejected; crop it to the committed length minus 1")
            check(False, f"{case}: draft_keeps = {draft_keeps}, expected {want_draft}: count what the draft model "
                  "has fed itself, and which of it the new text keeps (notebook 03, section 2)")
    passed("exercise 1: the target keeps committed - 1 positions; the draft the same, or one fewer when "
           "every draft was accepted")


def _greedy_accepted(draft, ids: Tensor, want: list[int], gamma: int) -> int:
    """How many of the draft's greedy proposals after ids [1, T] equal the target's greedy tokens `want`."""
    seq = ids
    with torch.no_grad():
        for i in range(min(gamma, len(want))):
            x = lm.forward(draft, seq)[:, -1:].argmax(-1)  # [1, 1]
            if int(x) != want[i]:
                return i
            seq = torch.cat([seq, x], 1)
    return min(gamma, len(want))


@grader
def check_speculative_step(speculative_step: Callable) -> None:
    """Exercise 03.2: speculative_step(target, draft, ids, target_cache, draft_cache, gamma) -> emitted tokens."""
    with one_thread():
        _check_speculative_step(speculative_step)


def _check_speculative_step(speculative_step: Callable) -> None:
    target, noisy, unrelated = tiny_pair()
    prompts = [torch.randint(0, 211, (1, n), generator=seeded(50 + n)) for n in (1, 6, 13)]
    summary = []
    for name, draft in [("a noisy copy of the target", noisy), ("the target itself", target),
                        ("an unrelated model", unrelated)]:
        for gamma in (1, 3, 5):
            for ids0 in prompts:
                want = measure.hf_generate(target, ids0, 24 + gamma + 1).tolist()  # a last step may run past 24
                ids, tc, dc = ids0.clone(), lm.new_cache(target), lm.new_cache(draft)
                steps = 0
                case = f"draft = {name}, gamma = {gamma}, a {ids0.shape[1]}-token prompt"
                while ids.shape[1] - ids0.shape[1] < 24:
                    T = ids.shape[1]
                    with torch.no_grad():
                        out = call(speculative_step, target, draft, ids, tc, dc, gamma)
                    check(isinstance(out, (list, tuple)) and all(isinstance(t, int) for t in out),
                          f"{case}: speculative_step should return a list of ints, got {out!r}")
                    check(1 <= len(out) <= gamma + 1, f"{case}, step {steps}: {len(out)} tokens returned; a step "
                          f"emits the accepted drafts plus exactly one token of the target's own (1 to γ+1)")
                    check(ids.shape[1] == T, f"{case}: speculative_step changed `ids` in place; return the new "
                          "tokens and leave ids alone")
                    got = ids[0, ids0.shape[1]:].tolist() + list(out)
                    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                    if first is not None:
                        check(steps > 0 or first > 0, f"{case}: the very first token differs from greedy decoding: "
                              "on the first step the target cache is empty, so feed the whole prompt plus the "
                              "drafts and read the LAST γ+1 rows of the logits")
                        check(False, f"{case}: step {steps} emitted {list(out)}; token {first} differs from greedy "
                              f"decoding ({got[first]} instead of {want[first]}). Accept drafts while they equal the "
                              "target's argmax, then append the target's argmax at the first mismatch (or the bonus)")
                    ids = torch.cat([ids, torch.tensor([list(out)])], 1)
                    T, accepted = ids.shape[1], len(out) - 1
                    want_len = _greedy_accepted(draft, ids[:, :T - len(out)], want[T - len(out) - ids0.shape[1]:],
                                                gamma) + 1
                    if len(out) != want_len:
                        check(not (len(out) == gamma == want_len - 1), f"{case}, step {steps}: all {gamma} drafts "
                              f"equal the target's argmax, but the step returned only {gamma} tokens: the target's "
                              "last row of logits gives a free bonus token; append it (a step emits 1 to γ+1 tokens)")
                        check(False, f"{case}, step {steps}: {want_len - 1} drafts equal the target's argmax, so the "
                              f"step should emit {want_len} tokens, not {len(out)}: accept drafts while they equal "
                              "the target's argmax, then add the target's own token")
                    check(lm.cache_len(tc) == T - 1, f"{case}, step {steps}: the target cache holds "
                          f"{lm.cache_len(tc)} positions for a {T}-token text; crop it to {T - 1} (every committed "
                          "token but the last, which is fed first in the next step)")
                    want_draft = T - 2 if accepted == gamma else T - 1
                    check(lm.cache_len(dc) == want_draft, f"{case}, step {steps}: {accepted} of {gamma} drafts "
                          f"accepted, the draft cache holds {lm.cache_len(dc)} positions, expected {want_draft}"
                          + (" (it never fed its own last draft)" if accepted == gamma else
                             ": crop it back to the committed length minus 1"))
                    steps += 1
                summary.append(steps)
    passed(f"exercise 2: 27 runs equal greedy decoding, caches right after every one of {sum(summary)} steps")


@grader
def check_greedy_mismatches(greedy_mismatches: Callable) -> None:
    """Exercise 03.3: greedy_mismatches(target, decode, prompts, max_new_tokens) -> {prompt index: position}."""
    with one_thread():
        _check_greedy_mismatches(greedy_mismatches)


def _check_greedy_mismatches(greedy_mismatches: Callable) -> None:
    target, noisy, _ = tiny_pair(seed=3)
    prompts = [torch.randint(0, 211, (1, n), generator=seeded(70 + n)) for n in (3, 8, 5, 11)]
    n = 16

    def correct(ids, max_new_tokens):
        return generate(target, ids, DraftModelDrafter(noisy, 3), max_new_tokens=max_new_tokens).tokens

    def buggy(ids, max_new_tokens):
        tokens = correct(ids, max_new_tokens)
        which = next(i for i, p in enumerate(prompts) if p is ids or torch.equal(p, ids))
        if which == 1:
            tokens[5] = (tokens[5] + 1) % 211  # a wrong token in the middle
        if which == 2:
            tokens = tokens[:-1]  # one token short
        if which == 3:
            tokens = tokens + [0]  # one token too many (ran past the budget)
        return tokens

    got = call(greedy_mismatches, target, correct, prompts, n)
    check(isinstance(got, dict), f"greedy_mismatches should return a dict {{prompt index: position}}, got {got!r}")
    check(got == {}, f"a correct decoder got {got}: compare with the target's own greedy decoding, "
          "measure.hf_generate(target, ids, max_new_tokens), and report only prompts that differ")
    got = call(greedy_mismatches, target, buggy, prompts, n)
    want = {1: 5, 2: n - 1, 3: n}
    if got != want:
        check(1 in got, f"got {got}: prompt 1's output has a wrong token at position 5 that you did not report")
        check(got.get(1) == 5, f"got {got}: prompt 1's first wrong token is at position 5 (0-based, counted "
              f"in the new tokens), you reported {got.get(1)}")
        check(got.get(2) == n - 1, f"got {got}: prompt 2's output is one token short; report the length of the "
              f"shorter list ({n - 1}) when one is a prefix of the other")
        check(got.get(3) == n, f"got {got}: prompt 3's output has an extra token; report position {n}, where "
              "the reference ends")
        check(0 not in got, f"got {got}: prompt 0 matches, leave it out")
    passed(f"exercise 3: greedy_mismatches finds a wrong token, a short and a long output ({want})")


# ---- exercise 4: the sampled step ---------------------------------------------------------------------------

SAMPLED_VOCAB = 8  # small enough to enumerate the target's distribution of two tokens exactly


def _pooled_p_value(counts: Tensor, probs: Tensor, min_expected: float = 5.0) -> float:
    """Pearson's chi-square p-value, cells with expected count < min_expected pooled into one."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = counts.sum() * probs
    small = expected < min_expected
    c = torch.cat([counts[~small], counts[small].sum()[None]])
    e = torch.cat([expected[~small], expected[small].sum()[None]])
    return chi_square(c, e / e.sum())[1]


def _first_token_outcomes(p: Tensor, q: Tensor) -> dict[str, Tensor]:
    """Exact distributions of a step's first token under typical wrong rules (the right rule's is p): x ~ q is
    accepted with probability a(x), else replaced from r."""
    res = _residual(p, q)

    def emit(a: Tensor, r: Tensor) -> Tensor:
        kept = q * a
        return kept + (1 - kept.sum()) * r

    ratio = torch.where(q > 0, p / q.clamp_min(1e-30), torch.ones_like(p)).clamp(max=1)  # min(1, p/q)
    inverse = torch.where(p > 0, q / p.clamp_min(1e-30), torch.ones_like(p)).clamp(max=1)  # min(1, q/p)
    return {
        "replace from p": emit(ratio, p),
        "replace from residual(q, p)": emit(ratio, _residual(q, p)),
        "accept with q/p": emit(inverse, res),
        "reversed test": emit(1 - ratio, res),
        "accept with p(x)": emit(p, res),
    }


_SAMPLED_HINTS = {
    "replace from p": "a rejected draft is replaced from p itself; it must come from the residual of p and q (what "
                      "the accepted drafts leave missing of p: notebook 01, section 2), or the tokens p favours "
                      "are emitted too often",
    "replace from residual(q, p)": "the replacement comes from the residual of q minus p; it is p minus q",
    "accept with q/p": "drafts are accepted with probability q/p; the ratio is p over q (u·q(x) < p(x))",
    "reversed test": "the accept test is reversed: a draft is accepted when u·q(x) >= p(x), i.e. with "
                     "probability 1 - p/q; accept when u·q(x) < p(x)",
    "accept with p(x)": "drafts are accepted with probability p(x); it is p(x)/q(x) (u·q(x) < p(x)), capped at 1",
}


@grader
def check_speculative_step_sampled(speculative_step_sampled: Callable) -> None:
    """Exercise 03.4: speculative_step_sampled(target, draft, ids, target_cache, draft_cache, gamma, warp) ->
    emitted tokens, distributed as the target's own sampling."""
    with one_thread(), torch.random.fork_rng():
        torch.manual_seed(0)  # a learner who draws from the global generator still gets a fixed run
        _check_speculative_step_sampled(speculative_step_sampled)


def _sampled_step(fn: Callable, target, draft, ids: Tensor, tc, dc, gamma: int, warp: Warp, case: str) -> list[int]:
    """One call of the learner's step, its output and both caches checked."""
    T = ids.shape[1]
    with torch.no_grad():
        out = call(fn, target, draft, ids, tc, dc, gamma, warp)
    check(isinstance(out, (list, tuple)) and all(isinstance(t, int) for t in out),
          f"{case}: speculative_step_sampled should return a list of ints, got {out!r}")
    check(1 <= len(out) <= gamma + 1, f"{case}: {len(out)} tokens returned; a step emits the accepted drafts plus "
          "exactly one token of the target's own (1 to γ+1)")
    check(ids.shape[1] == T, f"{case}: speculative_step_sampled changed `ids` in place; return the new tokens")
    check(all(0 <= t < SAMPLED_VOCAB for t in out), f"{case}: returned {list(out)}, outside the vocabulary")
    new_T, accepted = T + len(out), len(out) - 1
    check(lm.cache_len(tc) <= new_T - 1, f"{case}: the target cache holds {lm.cache_len(tc)} positions after a step "
          f"that left a {new_T}-token text: the cache was not rolled back; crop it to {new_T - 1} (the KV of "
          "rejected drafts must go, and the new last token stays pending)")
    check(lm.cache_len(tc) == new_T - 1, f"{case}: the target cache holds {lm.cache_len(tc)} positions for a "
          f"{new_T}-token text, expected {new_T - 1} (exercise 1)")
    want_draft = new_T - 2 if accepted == gamma else new_T - 1
    check(lm.cache_len(dc) == want_draft, f"{case}: {accepted} of {gamma} drafts accepted, the draft cache holds "
          f"{lm.cache_len(dc)} positions, expected {want_draft}"
          + (" (it never fed its own last draft)" if accepted == gamma else
             ": roll it back to the committed length minus 1, as exercise 1 computed"))
    return list(out)


@torch.no_grad()
def _check_speculative_step_sampled(fn: Callable) -> None:
    V = SAMPLED_VOCAB
    target = tiny_llama(V, hidden=32, layers=2, seed=31)
    other = tiny_llama(V, hidden=32, layers=1, seed=37)
    # 1. the target as its own draft, one warp for both: p == q at every position, so every draft passes
    for gamma, n, n_steps in [(3, 5, 4), (1, 3, 3)]:
        warp = Warp(0.7, top_k=5, generator=seeded(300 + gamma))
        ids = torch.randint(0, V, (1, n), generator=seeded(310 + n))
        tc, dc, lengths = lm.new_cache(target), lm.new_cache(target), []
        for step in range(n_steps):
            case = f"draft = the target itself, gamma = {gamma}, warp = (T 0.7, top-k 5), step {step}"
            out = _sampled_step(fn, target, target, ids, tc, dc, gamma, warp, case)
            lengths.append(len(out))
            ids = torch.cat([ids, torch.tensor([out])], 1)
        if any(k != gamma + 1 for k in lengths):
            case = f"draft = the target itself, gamma = {gamma}, warp = (T 0.7, top-k 5)"
            check(any(k != gamma for k in lengths), f"{case}: every step emitted only {gamma} tokens; the draft is "
                  "the target (p == q), so all drafts pass, and then the target's last row gives a bonus token: "
                  "draw it from p at that row (a step emits 1 to γ+1 tokens)")
            check(False, f"{case}: the steps emitted {lengths} tokens, though the draft is the target itself: "
                  f"p == q, so all {gamma} drafts must pass and every step emit {gamma + 1}. Warp both models' "
                  "logits with the same `warp.probs` (temperature, top-k) and accept when u·q(x) < p(x)")
    # 2. an unrelated draft: the first token and the first two follow the target's exact distribution
    warp = Warp(1.0, generator=seeded(320))
    gamma, runs = 2, 400
    ids0 = torch.randint(0, V, (1, 4), generator=seeded(321))
    p1 = warp.probs(lm.forward(target, ids0)[0, -1]).double()  # [V]
    q1 = warp.probs(lm.forward(other, ids0)[0, -1]).double()  # [V]
    two = torch.cat([ids0.expand(V, -1), torch.arange(V)[:, None]], 1)  # [V, 5]
    joint = p1[:, None] * warp.probs(lm.forward(target, two)[:, -1]).double()  # [V, V] P(t1, t2)
    firsts, pairs, steps = torch.zeros(V), torch.zeros(V * V), 0
    for run in range(runs):
        ids, tc, dc, got = ids0.clone(), lm.new_cache(target), lm.new_cache(other), []
        while len(got) < 2:
            case = f"draft = an unrelated model, gamma = {gamma}, warp = (T 1.0), run {run}, step {steps}"
            out = _sampled_step(fn, target, other, ids, tc, dc, gamma, warp, case)
            got += out
            ids = torch.cat([ids, torch.tensor([out])], 1)
            steps += 1
        firsts[got[0]] += 1
        pairs[got[0] * V + got[1]] += 1
    pv = _pooled_p_value(firsts, p1)
    if pv < P_VALUE_MIN:
        shown = f"over {runs} runs the first token has frequencies {fmt((firsts / runs).tolist(), 2)}, the target's " \
                f"p = {fmt(p1.tolist(), 2)} (chi-square p-value {pv:.2g})"
        for name, dist in _first_token_outcomes(p1, q1).items():
            if _pooled_p_value(firsts, dist) > 1e-3:
                check(False, f"{shown}: {_SAMPLED_HINTS[name]}")
        check(False, f"{shown}: the first emitted token must follow p whatever the draft: sample each draft from q "
              "(the draft's warped distribution), accept when u·q(x) < p(x), else draw from the residual")
    pv2 = _pooled_p_value(pairs, joint)
    check(pv2 >= P_VALUE_MIN, f"over {runs} runs the first token follows p, but the first TWO tokens do not follow "
          f"the target's joint distribution (chi-square p-value {pv2:.2g}): check the token after an accepted "
          "draft (the next row of p, with the accepted draft in the context), the bonus token (drawn from p at "
          "the last row) and what the next step reads from the rolled-back caches")
    # 3. the bonus token decides: γ = 1 with the unrelated draft, the steps where the draft passed; the token
    # after it must follow the target's row after that draft, p(· | ids, x1), summed over the observed x1
    bonus_runs, rows = 2000, {"the draft's q": warp.probs(lm.forward(other, two)[:, -1]).double()}  # [V, V]
    counts, want = torch.zeros(V), torch.zeros(V, dtype=torch.float64)
    wrong = {"the draft's q": torch.zeros(V, dtype=torch.float64), "p_prev": torch.zeros(V, dtype=torch.float64),
             "argmax": torch.zeros(V, dtype=torch.float64)}
    bonus_warp = Warp(1.0, generator=seeded(330))
    for run in range(bonus_runs):
        out = _sampled_step(fn, target, other, ids0, lm.new_cache(target), lm.new_cache(other), 1, bonus_warp,
                            f"draft = an unrelated model, gamma = 1, warp = (T 1.0), run {run}")
        if len(out) == 2:
            x1, bonus = out
            counts[bonus] += 1
            want += joint[x1] / p1[x1]  # p(· | ids, x1)
            wrong["the draft's q"] += rows["the draft's q"][x1]
            wrong["p_prev"] += p1
            wrong["argmax"][int(joint[x1].argmax())] += 1
    n = int(counts.sum())
    pv3 = _pooled_p_value(counts, want / n)
    if pv3 < P_VALUE_MIN:
        shown = (f"in the {n} of {bonus_runs} steps (γ = 1) where the draft passed, the bonus token does not follow "
                 f"the target's next row (chi-square p-value {pv3:.2g})")
        hints = {"the draft's q": "it follows the draft's q: the bonus comes from the TARGET's last row of the "
                                  "verification pass, p at the position after the last draft",
                 "p_prev": "it follows p at the last draft's own position (the row that draft was tested "
                           "against); the bonus comes from the next row, p[γ], after every draft",
                 "argmax": "it is the target's argmax; under sampling the bonus token is drawn from p[γ] "
                           "(warp.sample), not picked greedily"}
        for name, dist in wrong.items():
            if _pooled_p_value(counts, dist / n) > 1e-3:
                check(False, f"{shown}: {hints[name]}")
        check(False, f"{shown}: after all γ drafts pass, draw one more token from the target's last row, p[γ]")
    passed(f"exercise 4: every draft passes when the draft is the target; over {runs} runs with an unrelated "
           f"draft the first token and the first two follow the target's distribution, and in {n} steps where the "
           "draft passed, the bonus token follows the target's next row (chi-square); caches rolled back after "
           "every step")


# ---- exercise 5: an exactness test of one's own ---------------------------------------------------------------

EXACT_VOCAB, EXACT_TOKENS, EXACT_RUNS, EXACT_SIGNIFICANCE = 16, 3, 20_000, 1e-3


def _markov_pair(seed: int, shift: float) -> tuple[list[list[float]], list[list[float]]]:
    """A long-tailed Markov target P[prev][next] (two common tokens, fourteen rare ones) and a draft Q that moves
    `shift` of the probability between the two common tokens (Q differs from P by TV = shift)."""
    g = seeded(seed)
    P, Q = [], []
    for _ in range(EXACT_VOCAB):
        rare = 0.02 * torch.rand(EXACT_VOCAB - 2, generator=g, dtype=torch.float64)
        rare = rare / rare.sum() * 0.02  # the tail: 2% of the mass over 14 tokens
        a = 0.45 + 0.2 * float(torch.rand((), generator=g, dtype=torch.float64))
        row = [a * 0.98, (1 - a) * 0.98] + rare.tolist()
        P.append(row)
        Q.append([row[0] - shift, row[1] + shift] + row[2:])
    return P, Q


def _markov_joint(P: list[list[float]], start: int = 0) -> Tensor:
    """The target's exact probability of its first EXACT_TOKENS tokens after `start`: [V, V, V] float64."""
    T = torch.tensor(P, dtype=torch.float64)  # [V, V]
    return T[start][:, None, None] * T[:, :, None] * T[None, :, :]


def _markov_decoder(P, Q, gamma: int, seed: int, mistake: str | None = None) -> Callable[[], list[int]]:
    """decode() -> the first EXACT_TOKENS tokens of one run of speculative sampling of the Markov target P with
    the draft Q and `gamma` drafts a step (0: plain sampling from P); `mistake` biases it."""
    rng, V = random.Random(seed), range(EXACT_VOCAB)
    cum = {"P": [list(accumulate(r)) for r in P], "Q": [list(accumulate(r)) for r in Q]}
    res = []
    for p_row, q_row in zip(P, Q):
        pos = [max(a - b, 0.0) for a, b in zip(p_row, q_row)]
        res.append(list(accumulate(x / sum(pos) for x in pos)) if sum(pos) > 0 else cum["P"][len(res)])

    def draw(table, ctx):
        return rng.choices(V, cum_weights=table[ctx])[0]

    def decode() -> list[int]:
        prev, out = 0, []
        while len(out) < EXACT_TOKENS:
            if gamma == 0:
                out.append(draw(cum["P"], prev))
                prev = out[-1]
                continue
            drafts, ctx = [], prev
            for _ in range(gamma):
                drafts.append(draw(cum["Q"], ctx))
                ctx = drafts[-1]
            ctx = prev
            for x in drafts:
                if rng.random() * Q[ctx][x] < P[ctx][x]:
                    out.append(x)
                    ctx = x
                else:
                    out.append(draw(cum["P"] if mistake == "replace from p" else res, ctx))
                    break
            else:
                out.append(draw(cum["Q"] if mistake == "bonus from q" else cum["P"], ctx))
            prev = out[-1]
        return out[:EXACT_TOKENS]

    return decode


_EXACT_CASES = [  # (what the decoder is, draft shift, gamma, seed, mistake)
    ("speculative sampling with a close draft (TV 0.05), γ = 3", 0.05, 3, 501, None),
    ("speculative sampling with a far draft (TV 0.3), γ = 2", 0.3, 2, 502, None),
    ("plain sampling from the target", 0.0, 0, 503, None),
    ("speculative sampling whose rejected drafts are replaced from p instead of the residual "
     "(draft TV 0.055, γ = 2)", 0.055, 2, 506, "replace from p"),
    ("speculative sampling whose bonus token is drawn from the draft's q instead of p (draft TV 0.05, γ = 1): "
     "its first token is exact, the second is not", 0.05, 1, 505, "bonus from q"),
]


@grader
def check_is_exact(is_exact: Callable) -> None:
    """Exercise 03.5: is_exact(decode, p, runs, significance) -> True when decode's output follows p."""
    P, _ = _markov_pair(500, 0.0)
    joint = _markov_joint(P)
    verdicts = []
    for what, shift, gamma, seed, mistake in _EXACT_CASES:
        _, Q = _markov_pair(500, shift)
        decode, calls = _markov_decoder(P, Q, gamma, seed, mistake), [0]

        def counted():
            calls[0] += 1
            return decode()

        got = call(is_exact, counted, joint.clone(), EXACT_RUNS, EXACT_SIGNIFICANCE)
        check(isinstance(got, bool) or (isinstance(got, Tensor) and got.numel() == 1 and got.dtype == torch.bool),
              f"is_exact should return True or False, got {got!r}" + (": compare the p-value with `significance`"
                                                                      if isinstance(got, float) else ""))
        got, want = bool(got), mistake is None
        check(calls[0] <= EXACT_RUNS, f"is_exact called decode {calls[0]} times; `runs` = {EXACT_RUNS} allows no more")
        if got != want:
            verdict = "rejected an EXACT" if want else "accepted a biased"
            check(calls[0] == EXACT_RUNS, f"is_exact {verdict} decoder ({what}) after calling decode only "
                  f"{calls[0]} of the {EXACT_RUNS} times allowed: with fewer runs a small bias hides in the noise; "
                  "use every run")
            if want:
                check(False, f"is_exact rejected an EXACT decoder ({what}) at significance {EXACT_SIGNIFICANCE}: a "
                      "false alarm. Reject only when the p-value is BELOW significance, compare with runs · p over "
                      "every cell (a sequence p gives probability 0 is the only certain rejection), and pool the "
                      "cells whose expected count is below 5 into one (notebook 03, section 3)")
            if mistake == "bonus from q":
                check(False, f"is_exact accepted a biased decoder ({what}). Test the joint distribution of all "
                      f"{EXACT_TOKENS} tokens each run returns (p has one dimension per token), not the first token "
                      "alone")
            check(False, f"is_exact accepted a biased decoder ({what}): its bias is small but detectable with "
                  f"{EXACT_RUNS} runs. Compare the counts of every returned sequence with runs · p by Pearson's "
                  f"chi-square, and pool the cells whose expected count is below 5 into one: over {joint.numel()} "
                  "cells that mostly expect far less than one count, an unpooled statistic says little (notebook "
                  "03, section 3). Reject when the p-value is below significance.")
        verdicts.append(got)
    passed(f"exercise 5: is_exact accepts the {sum(verdicts)} exact decoders and rejects the "
           f"{len(verdicts) - sum(verdicts)} biased ones ({EXACT_RUNS} runs each, significance {EXACT_SIGNIFICANCE})")
