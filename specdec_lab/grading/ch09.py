"""Chapter 09's graders (exercises/09_serving.ipynb): speculation in a serving engine.

1. `check_commit_batch`: one greedy step's bookkeeping over a ragged batch, row by row as `serving.generate_batch`
   does it: each row accepts its own leading drafts that equal the target's choice, adds the target's own token,
   is cut by `decoding.cut` (budget, first EOS included), leaves at EOS or when its budget is spent, and keeps its
   committed length - 1 positions of KV cache (the new last token stays pending). 8 fixed edge cases and 60 seeded
   random batches; `_commit_mistake` gives the answers of typical wrong versions, so the hint can name the one the
   learner made.
2. `check_choose_gamma`: the γ with the largest predicted speedup S = E[tokens] / (v(B, γ+1) + γ·c(B))
   (`economics.speedup`), S = 1 for γ = 0 (plain decoding), ties to the smaller γ; on a CPU-like table of measured
   costs and on the roofline of Qwen2.5-7B with a 0.5B draft on an H100 (chapters 02 and 08), at several batches
   and α. `_gamma_mistake` gives the answers of the typical wrong versions.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable

from specdec_lab.decoding import cut
from specdec_lab.economics import QWEN25_7B_ON_H100, Roofline, expected_tokens, speedup
from specdec_lab.grading._common import call, check, fmt, grader, passed

# ---- exercise 1: commit_batch ----------------------------------------------------------------------------------


def _accepted(draft: list[int], choice: list[int]) -> int:
    """How many leading drafts equal the target's choice at their position."""
    return next((j for j in range(len(draft)) if draft[j] != choice[j]), len(draft))


def _commit_reference(texts, drafts, choices, budgets, eos):
    """generate_batch's greedy verify-and-commit, row by row (serving.py's loop body): (emitted, alive, keep)."""
    emitted, alive, keep = [], [], []
    for b, (text, draft, choice, budget) in enumerate(zip(texts, drafts, choices, budgets)):
        a = _accepted(draft, choice)
        out, done = cut(choice[:a + 1], budget, eos)  # the accepted drafts, then the target's own token
        emitted.append(out)
        if not done and len(out) < budget:
            alive.append(b)
            keep.append(len(text) + len(out) - 1)  # committed text but the pending token
    return emitted, alive, keep


def _commit_mistake(texts, drafts, choices, budgets, eos, mistake: str):
    """The answer of one typical wrong version: one flag changed in the reference."""
    counts = [_accepted(d, c) for d, c in zip(drafts, choices)]
    if mistake == "batch minimum":
        counts = [min(counts)] * len(counts)
    if mistake == "every match":  # counts matching drafts after the first mismatch too
        counts = [sum(1 for j in range(len(d)) if d[j] == c[j]) for d, c in zip(drafts, choices)]
    emitted, alive, keep = [], [], []
    for b, (text, choice, budget, a) in enumerate(zip(texts, choices, budgets, counts)):
        out = choice[:a] if mistake == "no target token" else choice[:a + 1]
        if mistake != "no budget":
            out = out[:budget]
        if mistake == "eos at the end only":
            done = bool(out) and out[-1] in eos
        elif mistake == "no eos":
            done = False
        else:
            out, done = cut(out, budget if mistake != "no budget" else len(out), eos)
        emitted.append(out)
        if not done and (mistake == "no budget" or len(out) < budget):
            alive.append(b)
            new = len(text) + len(out)
            keep.append({"keep committed": new, "keep old": len(text) - 1}.get(mistake, new - 1))
    return emitted, alive, keep


_EMITTED_HINTS = {
    "batch minimum": "accepts the same number of drafts in every row (the batch's fewest): each row accepts its "
                     "own leading drafts that equal the target's choice, however many the other rows accept",
    "every match": "counts drafts that equal the target's choice after a mismatch too: a draft after the first "
                   "rejected one was drafted after a wrong token, so acceptance stops at the first mismatch",
    "no target token": "forgets the target's own token: after the accepted drafts a row also commits the target's "
                       "choice at the first mismatch (or the bonus token when every draft passed), so a step "
                       "emits at least one token per row",
    "eos at the end only": "checks EOS only at the last token: a row ends at the FIRST EOS it commits, even one "
                           "inside its accepted drafts, and commits nothing after it",
    "no eos": "ignores EOS: a row ends at the first EOS it commits (the EOS included), even one inside its "
              "accepted drafts",
    "no budget": "ignores the budget: a row commits at most `budget` tokens this step, even when more drafts "
                 "passed",
}
_KEEP_HINTS = {
    "keep committed": "keeps the whole committed text in the cache: the new last token is pending (the next step "
                      "feeds it first and writes its K/V then), so a row's cache keeps its committed length - 1",
    "keep old": "forgets this step's tokens: a row's cache keeps its committed length after the step (its text "
                "plus what it emitted) - 1",
}


def _commit_cases() -> list[tuple]:
    """(texts, drafts, choices, budgets, eos): edge cases first, then seeded random ragged batches."""
    cases = [
        # one row, two drafts accepted, bonus token
        ([[5, 6, 7]], [[8, 9]], [[8, 9, 10]], [10], {2}),
        # plain decoding in one row (γ = 0), a rejection at the first draft in the other
        ([[3, 4], [11, 12, 13, 14]], [[], [20, 21, 22]], [[15], [23, 24, 25, 26]], [6, 6], {2}),
        # an EOS inside the accepted drafts: the row stops there; the other row goes on
        ([[9, 9], [4]], [[5, 2, 7], [6, 8]], [[5, 2, 7, 30], [6, 31, 32]], [8, 8], {2}),
        # a rejected EOS (a draft after the mismatch, a choice after it): nothing stops
        ([[7, 1], [3, 3, 3]], [[5, 2], [2, 4]], [[5, 6, 2], [8, 2, 4]], [9, 9], {2}),
        # the budget cuts inside the accepted drafts; a row that spends its budget exactly leaves; the third stays
        ([[1], [1, 4], [6, 6, 6]], [[5, 6, 7, 8], [9, 10], [11]], [[5, 6, 7, 8, 9], [9, 10, 12], [13, 14]],
         [2, 3, 3], {0}),
        # EOS as the target's own token (corrected), and as the bonus token; no row survives
        ([[4, 5], [6]], [[7, 8], [9]], [[7, 1, 5], [9, 1]], [5, 5], {1}),
        # no EOS ids; rows accept 3, 0 and 1 of their drafts
        ([[10] * 6, [11], [12, 13]], [[1, 2, 3], [4, 5, 6, 7], [8, 9]], [[1, 2, 3, 14], [15, 5, 6, 7, 8],
         [8, 16, 17]], [20, 20, 20], set()),
        # two EOS ids, one inside the drafts, one as the corrected token
        ([[30, 31], [32]], [[40, 3], [41, 42]], [[40, 3, 43], [41, 4, 44]], [7, 7], {3, 4}),
    ]
    for seed in range(60):
        rng = random.Random(900 + seed)
        eos = set(rng.sample(range(8), rng.choice([0, 1, 1, 2])))
        tokens = [t for t in range(40) if t not in eos]
        rows = rng.randint(1, 8)
        texts, drafts, choices, budgets = [], [], [], []
        for _ in range(rows):
            gamma = rng.choice([0, 1, 2, 3, 4, 4, 5, 6])
            accepted = rng.choice([gamma, gamma, rng.randint(0, gamma)])
            draft = [rng.choice(tokens) for _ in range(gamma)]
            choice = draft[:accepted] + [rng.choice(tokens) for _ in range(gamma + 1 - accepted)]
            if accepted < gamma:  # the first rejected draft differs from the target's choice
                while choice[accepted] == draft[accepted]:
                    choice[accepted] = rng.choice(tokens)
                if rng.random() < 0.3 and accepted + 1 < gamma:  # a later draft matches by chance
                    choice[accepted + 1] = draft[accepted + 1]
            if eos and rng.random() < 0.25:  # an EOS somewhere in the chain, accepted or not
                j = rng.randint(0, gamma)
                e = rng.choice(sorted(eos))
                choice[j] = e
                if j < gamma and (j < accepted or rng.random() < 0.5):
                    draft[j] = e
            texts.append([rng.choice(tokens) for _ in range(rng.randint(1, 12))])
            drafts.append(draft)
            choices.append(choice)
            budgets.append(rng.choice([1, 2, 3, gamma + 1, gamma + 1, 8, 16, 30]))
        cases.append((texts, drafts, choices, budgets, eos))
    return cases


def _as_int_lists(x) -> list[list[int]] | None:
    try:
        out = [[int(t) for t in row] for row in x]
    except (TypeError, ValueError):
        return None
    return out if all(not isinstance(t, bool) for row in x for t in row) else None


def _as_ints(x) -> list[int] | None:
    try:
        return [int(t) for t in x]
    except (TypeError, ValueError):
        return None


def _row(case, b: int) -> str:
    texts, drafts, choices, budgets, eos = case
    return (f"row {b} (a {len(texts[b])}-token text, drafts {drafts[b]}, choices {choices[b]}, budget "
            f"{budgets[b]}, eos {sorted(eos)})")


@grader
def check_commit_batch(commit_batch: Callable) -> None:
    """Exercise 09.1: commit_batch(texts, drafts, choices, budgets, eos) -> (emitted, alive, keep) of one greedy
    step over a ragged batch."""
    cases = _commit_cases()
    results = []
    for case in cases:
        shown = copy.deepcopy(case)  # the learner's function may not change the grader's copy
        out = call(commit_batch, *shown)
        check(shown[0] == case[0], "commit_batch changed `texts` in place: return what each row commits and "
              "leave texts alone (the engine appends it itself)")
        check(isinstance(out, (tuple, list)) and len(out) == 3, "commit_batch should return three lists "
              f"(emitted, alive, keep), got {out!r}")
        emitted, alive, keep = _as_int_lists(out[0]), _as_ints(out[1]), _as_ints(out[2])
        check(emitted is not None and len(emitted) == len(case[0]), f"emitted should be one list of token ids per "
              f"row ({len(case[0])} rows), got {out[0]!r}")
        check(alive is not None and keep is not None, f"alive and keep should be lists of ints, got {out[1]!r} and "
              f"{out[2]!r}")
        results.append((emitted, alive, keep))
    wants = [_commit_reference(*case) for case in cases]
    if results == wants:
        passed(f"exercise 1: commit_batch accepts, cuts, retires and rolls back every row on its own in "
               f"{len(cases)} hidden batches ({sum(len(c[0]) for c in cases)} rows)")
        return

    def matches(mistake: str, part: int, i: int, everywhere: bool, whole: bool) -> bool:
        """Whether the learner's answers equal the mistake's, in every batch or in batch i alone, the whole answer
        or only its part `part`."""
        def same(r, c):
            m = _commit_mistake(*c, mistake)
            return r == m if whole else r[part] == m[part]
        return all(same(r, c) for r, c in zip(results, cases)) if everywhere else same(results[i], cases[i])

    i = next(i for i, (r, w) in enumerate(zip(results, wants)) if r != w)
    case, (emitted, alive, keep), (want_e, want_a, want_k) = cases[i], results[i], wants[i]
    if emitted != want_e:
        b = next(b for b in range(len(want_e)) if emitted[b] != want_e[b])
        where = f"{_row(case, b)}: emitted {emitted[b]}, expected {want_e[b]}"
        if len(case[0]) > 1:
            where = f"in a batch of {len(case[0])} rows, " + where
        # first: the mistake that explains every answer, then this batch, then this batch's emitted tokens
        for everywhere, whole in ((True, True), (False, True), (False, False)):
            for mistake, hint in _EMITTED_HINTS.items():
                if matches(mistake, 0, i, everywhere, whole):
                    check(False, f"{where}: it {hint}")
        check(False, f"{where}: commit the leading drafts that equal the target's choice, then the target's own "
              "token, at most `budget` tokens, ending at the first EOS (included)")
    if alive != want_a:
        extra = [b for b in alive if b not in want_a]
        missing = [b for b in want_a if b not in alive]
        if extra:
            b = extra[0]
            why = (f"it committed EOS {[t for t in emitted[b] if t in case[4]][0]}" if any(t in case[4] for t in
                   emitted[b]) else f"it committed {len(emitted[b])} tokens, its whole budget")
            check(False, f"alive = {alive}, expected {want_a}: {_row(case, b)} must leave the batch: {why}")
        if missing:
            b = missing[0]
            check(False, f"alive = {alive}, expected {want_a}: {_row(case, b)} committed {emitted[b]}, no EOS and "
                  f"fewer tokens than its budget {case[3][b]}, so it stays")
        check(False, f"alive = {alive}, expected {want_a}: the indices of the rows that stay, in increasing order")
    check(len(keep) == len(want_a), f"keep = {keep} has {len(keep)} entries for {len(want_a)} rows that stay "
          f"(alive = {want_a}): one per row that stays, in the order of alive")
    k = next(k for k in range(len(want_k)) if keep[k] != want_k[k])
    b = want_a[k]
    where = (f"keep = {keep}, expected {want_k}: row {b} had {len(case[0][b])} committed tokens and committed "
             f"{len(emitted[b])} more, so its cache keeps {want_k[k]}, not {keep[k]}")
    for everywhere, whole in ((True, True), (False, True), (False, False)):
        for mistake, hint in _KEEP_HINTS.items():
            if matches(mistake, 2, i, everywhere, whole):
                check(False, f"{where}: it {hint}")
    check(False, f"{where}: a row's cache holds its committed text but the pending token")


# ---- exercise 2: choose_gamma ----------------------------------------------------------------------------------


def _cpu_table() -> tuple[str, dict, dict]:
    """Costs as measured on a 2-core CPU (the zoo pair's kind of numbers): a pass over n tokens costs more as the
    batch grows (v(1, 4) ≈ 1.3, v(32, 4) ≈ 2.2), a draft step about 0.3 of a target step; a little noise."""
    rng = random.Random(909)
    batches = [1, 2, 4, 8, 16, 32]
    slope = {1: 0.1, 2: 0.13, 4: 0.18, 8: 0.25, 16: 0.32, 32: 0.4}  # extra cost per extra token, per batch
    verify, draft = {}, {}
    for B in batches:
        for n in range(1, 13):
            verify[(B, n)] = 1.0 if n == 1 else round(1 + (n - 1) * slope[B] * rng.uniform(0.93, 1.07), 3)
        draft[B] = round(0.3 * rng.uniform(0.9, 1.1), 3)
    return "a CPU-like table of measured costs", verify, draft


def _gpu_table() -> tuple[str, dict, dict]:
    """The roofline of Qwen2.5-7B on an H100 (chapter 02) with a Qwen2.5-0.5B draft (chapter 08)."""
    big = QWEN25_7B_ON_H100
    small = Roofline(params=0.49e9, bandwidth=big.bandwidth, peak_flops=big.peak_flops, kv_bytes_per_token=12288,
                     context=1024)
    batches = [1, 8, 32, 64, 128, 256, 512]
    verify = {(B, n): round(big.verify_cost(n - 1, B), 4) for B in batches for n in range(1, 13)}
    draft = {B: round(small.step_time(B) / big.step_time(B), 4) for B in batches}
    return "the roofline of Qwen2.5-7B with a 0.5B draft on an H100", verify, draft


def _flat_table() -> tuple[str, dict, dict]:
    """Free verification and free drafts: at α = 0 every γ ties with plain decoding (S = 1)."""
    return "a table where every pass costs 1 and drafts are free", {(B, n): 1.0 for B in (1, 4) for n in
                                                                    range(1, 10)}, {1: 0.0, 4: 0.0}


def _choose_cases() -> list[tuple]:
    """(name, verify_cost, draft_cost, batch, alpha, gammas or None for the default range(0, 8))."""
    cpu, gpu, flat = _cpu_table(), _gpu_table(), _flat_table()
    cases = []
    for batch, alpha in [(1, 0.9), (32, 0.9), (4, 0.8), (16, 0.75), (1, 0.6), (32, 0.6), (8, 0.5), (2, 0.3),
                         (32, 0.97)]:
        cases.append((*cpu, batch, alpha, None))
    for batch, alpha in [(1, 0.8), (64, 0.8), (256, 0.8), (512, 0.8), (1, 0.95), (128, 0.6), (256, 0.6),
                         (512, 0.4), (8, 1.0), (512, 1.0)]:
        cases.append((*gpu, batch, alpha, None))
    cases += [(*cpu, 1, 0.95, range(0, 12)), (*gpu, 32, 0.9, range(0, 4)), (*gpu, 256, 0.85, [0, 2, 4, 6, 8, 10]),
              (*flat, 4, 0.0, None)]
    return cases


def _scores(verify, draft, batch, alpha, gammas, vbatch=None, cbatch=None, vshift=1, draft_on=True,
            tokens=None, plain=True) -> dict[int, float]:
    """γ -> the score a version maximises: the reference's S, or one with a typical mistake."""
    vb, cb = batch if vbatch is None else vbatch, batch if cbatch is None else cbatch
    out = {}
    for g in gammas:
        if g == 0:
            if plain:
                out[g] = 1.0
            continue
        e = expected_tokens(alpha, g) if tokens is None else tokens(alpha, g)
        out[g] = e / (verify[(vb, g + vshift)] + (g * draft[cb] if draft_on else 0.0))
    return out


def _best(scores: dict[int, float], largest_on_ties=False) -> int:
    top = max(scores.values())
    tied = [g for g, s in scores.items() if s == top]
    return max(tied) if largest_on_ties else min(tied)


def _choose_reference(verify, draft, batch, alpha, gammas) -> int:
    """The γ in gammas with the largest predicted speedup (the library's `speedup`; 1 for γ = 0), ties to the
    smaller γ."""
    s = {g: 1.0 if g == 0 else speedup(alpha, g, draft[batch], verify[(batch, g + 1)]) for g in gammas}
    return _best(s)


_GAMMA_MISTAKES = [
    ({"vbatch": 1}, "reads the verify cost of batch 1 at every batch: at batch B a pass costs "
     "verify_cost[(B, n)], which grows with B"),
    ({"vbatch": 1, "cbatch": 1}, "reads the costs of batch 1 at every batch: at batch B use verify_cost[(B, n)] "
     "and draft_cost[B]"),
    ({"draft_on": False}, "leaves the draft's cost out: a round also runs γ draft steps, each costing "
     "draft_cost[B] target steps"),
    ({"vshift": 0}, "charges a γ-token pass: the target reads each row's pending token and its γ drafts, γ + 1 "
     "tokens per row"),
    ({"plain": False}, "returns the best γ >= 1 even when it is slower than plain decoding: γ = 0 (S = 1) is a "
     "candidate too, and wins when no draft length pays"),
    ({"tokens": lambda a, g: expected_tokens(a, g) - 1}, "forgets the target's own token in E[tokens]: a pass "
     "yields 1 + α + ... + α^γ tokens, (1 - α^(γ+1)) / (1 - α)"),
    ("tokens only", "maximises the tokens per pass alone: the longest draft always yields the most tokens, but it "
     "also costs the most; maximise the predicted speedup, tokens per pass over the pass's cost"),
    ("largest on ties", "breaks a tie toward the larger γ: when two draft lengths predict the same speedup, take "
     "the smaller (here every γ gives S = 1, so γ = 0: do not speculate)"),
]


def _gamma_mistake(verify, draft, batch, alpha, gammas, change) -> int:
    if change == "tokens only":
        return _best({g: expected_tokens(alpha, g) for g in gammas})
    if change == "largest on ties":
        return _best(_scores(verify, draft, batch, alpha, gammas), largest_on_ties=True)
    return _best(_scores(verify, draft, batch, alpha, gammas, **change))


@grader
def check_choose_gamma(choose_gamma: Callable) -> None:
    """Exercise 09.2: choose_gamma(batch, alpha, verify_cost, draft_cost, gammas=range(0, 8)) -> the γ with the
    largest predicted speedup at this batch, 0 when no γ beats plain decoding, ties to the smaller γ."""
    cases = _choose_cases()
    got, want = [], []
    for name, verify, draft, batch, alpha, gammas in cases:
        shown = ((batch, alpha, dict(verify), dict(draft)) if gammas is None
                 else (batch, alpha, dict(verify), dict(draft), gammas))
        how = f"choose_gamma(batch={batch}, alpha={alpha}, <{name}>" + (")" if gammas is None else f", {gammas})")
        try:
            out = call(choose_gamma, *shown)
        except ZeroDivisionError:
            raise AssertionError(f"{how} divided by zero: at α = 1 every draft passes and a pass yields γ + 1 "
                                 "tokens; (1 - α^(γ+1)) / (1 - α) is 0/0 there (economics.expected_tokens handles "
                                 "it)") from None
        except KeyError as e:
            key = e.args[0] if e.args else None
            if isinstance(key, tuple) and len(key) == 2 and key[1] == 0:
                raise AssertionError(f"{how} looked up verify_cost[{key}], which does not exist: γ = 0 is plain "
                                     "decoding (S = 1, nothing to verify), and a round with γ drafts reads γ + 1 "
                                     "tokens per row, verify_cost[(B, γ + 1)]") from None
            raise AssertionError(f"{how} looked up {key!r}, which is not in the tables: verify_cost is keyed by "
                                 "(batch, tokens per row), draft_cost by batch") from None
        if isinstance(out, float) and not out.is_integer():
            check(False, f"{how} returned {out:.4g}: return the draft length γ (an int), not its speedup")
        check(not isinstance(out, bool) and (isinstance(out, int) or hasattr(out, "__index__")
                                             or (isinstance(out, float) and out.is_integer())),
              f"{how} should return a draft length γ (an int), got {out!r}")
        out = int(out)
        check(out in list(range(0, 8) if gammas is None else gammas), f"{how} = {out}, which is not one of gammas")
        got.append(out)
        want.append(_choose_reference(verify, draft, batch, alpha, range(0, 8) if gammas is None else gammas))
    if got == want:
        gpu = [w for (name, *_, gammas), w in zip(cases, want) if "H100" in name and gammas is None]
        passed(f"exercise 2: choose_gamma picks the fastest γ at every batch on {len(cases)} hidden cases; for "
               f"Qwen2.5-7B with a 0.5B draft on an H100 at α = 0.8 that is γ = {gpu[0]} at batch 1, {gpu[1]} at "
               f"64, {gpu[2]} at 256 and {gpu[3]} at 512")
        return
    answers = {i: [_gamma_mistake(v, d, b, a, range(0, 8) if g is None else g, change)
                   for _, v, d, b, a, g in cases] for i, (change, _) in enumerate(_GAMMA_MISTAKES)}
    i = next(i for i in range(len(cases)) if got[i] != want[i])
    name, verify, draft, batch, alpha, gammas = cases[i]
    how = f"choose_gamma(batch={batch}, alpha={alpha}, <{name}>" + (")" if gammas is None else f", {gammas})")
    where = f"{how} = {got[i]}, expected {want[i]}"
    for k, (_, hint) in enumerate(_GAMMA_MISTAKES):  # first: the mistake that explains every answer
        if answers[k] == got:
            check(False, f"{where}: it {hint}")
    for k, (_, hint) in enumerate(_GAMMA_MISTAKES):  # then: one that explains this case
        if answers[k][i] == got[i]:
            check(False, f"{where}: it {hint}")
    s = _scores(verify, draft, batch, alpha, range(0, 8) if gammas is None else gammas)
    check(False, f"{where}: the predicted speedups are {fmt([round(v, 3) for v in s.values()])} for γ = "
          f"{list(s)}; return the γ with the largest")


def _assert_no_near_ties() -> None:
    """Grader self-check (tests): apart from the flat table's deliberate tie, the best γ of every case leads the
    runner-up by a clear margin, so a learner's rounding cannot flip it."""
    for name, verify, draft, batch, alpha, gammas in _choose_cases():
        if "every pass costs 1" in name:
            continue
        s = sorted(_scores(verify, draft, batch, alpha, range(0, 8) if gammas is None else gammas).values())
        assert s[-1] - s[-2] > 1e-4 * s[-1], (name, batch, alpha, s[-2:])
        assert math.isfinite(s[-1])
