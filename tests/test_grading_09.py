"""Chapter 09's graders: they pass right answers and name the mistake in wrong ones; the commit grader's reference
is what serving.generate_batch does."""
import torch
from helpers import grader_tests, noisy_copy, prompt_ids, stub_rows, tiny_llama

from specdec_lab import grading, lm
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.economics import expected_tokens
from specdec_lab.grading import ch09
from specdec_lab.serving import generate_batch


def _commit(per_row=True, every_match=False, bonus=True, eos="first", budget=True, keep_offset=-1, keep_new=True,
            leave_at_eos=True, leave_at_budget=True, mutate=False):
    def commit_batch(texts, drafts, choices, budgets, eos_ids):
        counts = []
        for d, c in zip(drafts, choices):
            if every_match:
                counts.append(sum(x == y for x, y in zip(d, c)))
            else:
                a = 0
                while a < len(d) and d[a] == c[a]:
                    a += 1
                counts.append(a)
        if not per_row:
            counts = [min(counts)] * len(counts)
        emitted, alive, keep = [], [], []
        for b, (text, c, n, a) in enumerate(zip(texts, choices, budgets, counts)):
            out = list(c[:a + 1] if bonus else c[:a])
            if budget:
                out = out[:n]
            hit = False
            if eos == "first":
                for j, t in enumerate(out):
                    if t in eos_ids:
                        out, hit = out[:j + 1], True
                        break
            elif eos == "last":
                hit = bool(out) and out[-1] in eos_ids
            emitted.append(out)
            if mutate:
                text += out
            stays = not (hit and leave_at_eos) and not (budget and leave_at_budget and len(out) >= n)
            if stays:
                alive.append(b)
                keep.append((len(text) + (len(out) if keep_new else 0)) + keep_offset)
        return emitted, alive, keep

    return commit_batch


def _choose(v_batch=None, c_batch=None, shift=1, draft=True, bonus=True, plain=True, tokens_only=False, ties="small"):
    def choose_gamma(batch, alpha, verify_cost, draft_cost, gammas=range(0, 8)):
        best, best_s = None, None
        for g in gammas:
            if g == 0:
                if not plain:
                    continue
                s = 1.0
            elif tokens_only:
                s = expected_tokens(alpha, g)
            else:
                e = expected_tokens(alpha, g) - (0 if bonus else 1)
                v = verify_cost[(v_batch or batch, g + shift)]
                s = e / (v + (g * draft_cost[c_batch or batch] if draft else 0))
            if tokens_only and g == 0:
                s = 1.0
            if best is None or s > best_s or (ties == "large" and s == best_s):
                best, best_s = g, s
        return best

    return choose_gamma


def _v_of_gamma(batch, alpha, verify_cost, draft_cost, gammas=range(0, 8)):
    """choose_gamma reading v(B, γ), so for γ = 0 too: a key the costs do not have."""
    return max(gammas, key=lambda g: expected_tokens(alpha, g) / (verify_cost[(batch, g)] + g * draft_cost[batch]))


def _closed_form(batch, alpha, verify_cost, draft_cost, gammas=range(0, 8)):
    """choose_gamma with E[tokens] in closed form, which divides by zero at α = 1."""
    def s(g):
        e = (1 - alpha ** (g + 1)) / (1 - alpha)
        return 1.0 if g == 0 else e / (verify_cost[(batch, g + 1)] + g * draft_cost[batch])
    return max(gammas, key=s)


WRONG = [
    (grading.check_commit_batch, _commit(per_row=False), "the batch's fewest"),
    (grading.check_commit_batch, _commit(every_match=True), "after a mismatch too"),
    (grading.check_commit_batch, _commit(bonus=False), "forgets the target's own token"),
    (grading.check_commit_batch, _commit(eos="last"), "checks EOS only at the last token"),
    (grading.check_commit_batch, _commit(eos=None), "ignores EOS"),
    (grading.check_commit_batch, _commit(budget=False), "ignores the budget"),
    (grading.check_commit_batch, _commit(keep_offset=0), "keeps the whole committed text in the cache"),
    (grading.check_commit_batch, _commit(keep_new=False), "forgets this step's tokens"),
    (grading.check_commit_batch, _commit(leave_at_eos=False, leave_at_budget=False), "must leave the batch"),
    (grading.check_commit_batch, _commit(leave_at_eos=False), "must leave the batch: it committed EOS"),
    (grading.check_commit_batch, _commit(leave_at_budget=False), "tokens, its whole budget"),
    (grading.check_commit_batch, _commit(mutate=True), "changed `texts` in place"),
    (grading.check_choose_gamma, _choose(v_batch=1), "reads the verify cost of batch 1 at every batch"),
    (grading.check_choose_gamma, _choose(v_batch=1, c_batch=1), "reads the costs of batch 1 at every batch"),
    (grading.check_choose_gamma, _choose(draft=False), "leaves the draft's cost out"),
    (grading.check_choose_gamma, _choose(shift=0, plain=True), "charges a γ-token pass"),
    (grading.check_choose_gamma, _choose(plain=False), "returns the best γ >= 1 even when it is slower"),
    (grading.check_choose_gamma, _choose(tokens_only=True), "maximises the tokens per pass alone"),
    (grading.check_choose_gamma, _choose(bonus=False), "forgets the target's own token"),
    (grading.check_choose_gamma, _choose(ties="large"), "breaks a tie toward the larger γ"),
    (grading.check_choose_gamma, _v_of_gamma, "γ + 1 tokens per row, verify_cost[(B, γ + 1)]"),
    (grading.check_choose_gamma, _closed_form, "divided by zero"),
    *stub_rows(grading.check_commit_batch, grading.check_choose_gamma),
]

RIGHT = [
    (grading.check_commit_batch, _commit()),
    (grading.check_choose_gamma, _choose()),
]


test_graders = grader_tests(WRONG, RIGHT)


def test_choose_gamma_cases_have_no_near_ties():
    """Apart from the deliberate tie (every γ gives S = 1), the best γ leads clearly: rounding cannot flip it."""
    ch09._assert_no_near_ties()


def test_every_commit_mistake_changes_an_answer():
    cases = ch09._commit_cases()
    for mistake in list(ch09._EMITTED_HINTS) + list(ch09._KEEP_HINTS):
        assert any(ch09._commit_mistake(*c, mistake) != ch09._commit_reference(*c) for c in cases), mistake


def _greedy_chain(model, text: list[int], n: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(int(lm.forward(model, torch.tensor([text + out]))[0, -1].argmax()))
    return out


@torch.inference_mode()
def test_commit_reference_is_what_generate_batch_does():
    """The grader's reference, driving a batch step by step (drafts and the target's choices from plain forwards,
    γ capped by the budget as generate_batch caps it), ends with generate_batch's tokens, passes and per-row
    acceptances."""
    target = tiny_llama(layers=2, seed=0)
    draft = noisy_copy(target, 0.05, seed=1)
    prompts = [prompt_ids(s, 2 + 3 * s)[0].tolist() for s in range(4)]
    gammas, max_new = [0, 2, 3, 5], 14
    eos = generate_batch(target, prompts[:1], max_new_tokens=max_new).tokens[0][4]  # a token row 0 emits
    out = generate_batch(target, prompts, DraftModelDrafter(draft, 5), max_new_tokens=max_new, eos_token_id=eos,
                         gamma=gammas)
    texts, active, steps, accepted = [list(p) for p in prompts], [0, 1, 2, 3], 0, [[] for _ in prompts]
    while active:
        live = [texts[i] for i in active]
        budgets = [max_new - len(texts[i]) + len(prompts[i]) for i in active]
        drafts = [_greedy_chain(draft, t, max(min(gammas[i], n - 1), 0)) for t, i, n in zip(live, active, budgets)]
        choices = [lm.forward(target, torch.tensor([t + d]))[0, -len(d) - 1:].argmax(-1).tolist()
                   for t, d in zip(live, drafts)]
        emitted, alive, keep = ch09._commit_reference(live, drafts, choices, budgets, {eos})
        for b, i in enumerate(active):
            texts[i] = texts[i] + emitted[b]
            accepted[i].append(ch09._accepted(drafts[b], choices[b]))
        assert keep == [len(texts[active[b]]) - 1 for b in alive]
        active = [active[b] for b in alive]
        steps += 1
    assert [t[len(p):] for t, p in zip(texts, prompts)] == out.tokens
    assert steps == out.steps
    assert accepted == [g.accept_lengths for g in out.rows]
