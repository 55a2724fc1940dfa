"""Chapter 03's graders (exercises/03_draft_target.ipynb): a draft model and its target, greedy.

1. `check_cache_lengths`: how many positions each KV cache keeps after `accepted` of `gamma` drafts pass: the
   target committed - 1 (the new last token stays pending), the draft one fewer when every draft passed.
2. `check_speculative_step`: one greedy speculative step on tiny random Llamas (a noisy copy of the target,
   the target itself, an unrelated model as draft; γ = 1, 3, 5; three prompts): every run must equal the
   target's greedy decoding (`measure.hf_generate`), emit as many tokens as drafts match plus one, and leave
   both caches at the right length after every step.
3. `check_greedy_mismatches`: the learner's comparison with greedy decoding finds nothing for the library's
   `generate` and the first wrong position for a decoder with a wrong token, one too few and one too many.

The library keeps the cache lengths inside `generate` and `DraftModelDrafter` (no function returns them), so
the grader states them itself, and `_greedy_accepted` counts a step's matching drafts with plain forwards.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specdec_lab import lm, measure
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.grading._common import call, check, grader, one_thread, passed, seeded, tiny_pair


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
                  f"({committed} + {accepted} accepted + 1 from the target)")
        if draft_keeps != want_draft:
            if accepted == gamma:
                check(False, f"{case}: draft_keeps = {draft_keeps}, but with every draft accepted the draft model "
                      f"has only computed KV for {committed + gamma - 1} positions: it never fed its own last "
                      "draft, so its cache lags one token behind the target's")
            check(draft_keeps != committed + gamma - 1, f"{case}: draft_keeps = {draft_keeps} keeps the KV of "
                  "drafts that were rejected; crop it to the committed length minus 1")
            check(False, f"{case}: draft_keeps = {draft_keeps}, expected {want_draft}")
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
