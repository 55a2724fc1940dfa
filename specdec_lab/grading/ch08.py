"""Chapter 08's graders (exercises/08_showdown.ipynb): reading a benchmark, and when speculation pays.

1. `check_summarize`: a benchmark's per-prompt records summed up per (method, category) and per (method,
   "all"): τ and tokens/s as ratios of sums (`bench.Row`), the speedup against the baseline's tokens/s in the
   same category; records of two seeded synthetic benchmarks, hints for the mean of ratios, τ for time, an
   upside-down ratio, the overall baseline.
2. `check_switch_off`: the smallest batch where S = E[tokens] / (v + γ·c) < 1 (`economics.speedup`), or None,
   on 7 cases (most on chapter 02's roofline of Qwen2.5-7B on an H100); `_switch_mistake` gives the answers of
   four typical mistakes, so the hint can name the one that explains the learner's.
3. `check_sglang_flags`: the course's EagleDrafter(dynamic=True, topk, depth, budget) as SGLang's three flags
   (the root token counted), and a ValueError for settings no tree can hold.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from specdec_lab import bench
from specdec_lab.economics import QWEN25_7B_ON_H100, expected_tokens, speedup
from specdec_lab.grading._common import call, check, grader, passed


def _showdown_records(seed: int, baseline: str) -> list[dict]:
    """A benchmark's per-prompt records: every method on every prompt, prompts of uneven length, categories
    whose prompts differ in speed (long edit contexts make every step slower), in a shuffled order."""
    rng = random.Random(seed)
    step = {"code": 0.011, "edit": 0.019, "doc": 0.014}  # seconds per plain decoding step, per category
    methods = {baseline: 1.0, "draft model γ=4": 2.6, "prompt lookup": 2.1, "EAGLE-2": 3.3}  # typical τ
    overhead = {baseline: 0.0, "draft model γ=4": 0.45, "prompt lookup": 0.02, "EAGLE-2": 0.2}  # draft cost
    records = []
    for category, t in step.items():
        for _ in range(rng.randint(2, 4)):
            length = rng.choice([12, 40, 96, 160, 256])  # new tokens of this prompt
            for method, tau in methods.items():
                tau_here = 1.0 if tau == 1.0 else max(1.05, tau * rng.uniform(0.5, 1.5))
                if category == "edit" and method == "prompt lookup":
                    tau_here *= 1.6  # edits copy from the prompt
                calls = length if tau == 1.0 else math.ceil(length / tau_here)
                seconds = calls * t * (1 + overhead[method]) * rng.uniform(0.85, 1.2)
                records.append({"method": method, "category": category, "tokens": length,
                                "target_calls": calls, "seconds": round(seconds, 5)})
    rng.shuffle(records)
    return records


def _groups(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(method, category) -> its records, and (method, "all") -> all of the method's records."""
    groups: dict = {}
    for r in records:
        for cat in (r["category"], "all"):
            groups.setdefault((r["method"], cat), []).append(r)
    return groups


def _summary_reference(records: list[dict], baseline: str) -> dict:
    """{(method, category or "all"): {"tau", "tokens_per_s", "speedup"}}: the library's totals (`bench.Row`,
    whose τ and tokens/s are ratios of sums), speedup over the baseline's tokens/s in the same category."""
    rows = {}
    for key, rs in _groups(records).items():
        row = rows[key] = bench.Row(key[0])
        for r in rs:
            row.tokens += r["tokens"]
            row.target_calls += r["target_calls"]
            row.seconds += r["seconds"]
    return {(method, cat): {"tau": row.tau, "tokens_per_s": row.tokens_per_second,
                            "speedup": row.tokens_per_second / rows[(baseline, cat)].tokens_per_second}
            for (method, cat), row in rows.items()}


def _mean_of_ratios(records: list[dict]) -> dict:
    """The mistake: τ and tokens/s as the mean of per-prompt ratios, {(method, category): {"tau", "tokens_per_s"}}."""
    return {key: {"tau": sum(r["tokens"] / r["target_calls"] for r in rs) / len(rs),
                  "tokens_per_s": sum(r["tokens"] / r["seconds"] for r in rs) / len(rs)}
            for key, rs in _groups(records).items()}


def _near(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


@grader
def check_summarize(summarize: Callable) -> None:
    """Exercise 08.1: summarize(records, baseline) -> {(method, category): {"tau", "tokens_per_s", "speedup"}},
    ratios of sums, "all" included, speedup = tokens/s over the baseline's tokens/s in the same category."""
    for seed, baseline in [(0, "target only"), (1, "plain decoding")]:
        records = _showdown_records(seed, baseline)
        shown = [dict(r) for r in records]  # the learner's function may not change the grader's copy
        how = "summarize(records)" if baseline == "target only" else f"summarize(records, baseline={baseline!r})"
        try:
            got = call(summarize, *((shown,) if baseline == "target only" else (shown, baseline)))
        except KeyError as e:
            if baseline != "target only":
                raise AssertionError(f"{how} raised KeyError({e}): use the `baseline` argument to find the "
                                     "baseline's rows, not the name 'target only'") from None
            raise
        want = _summary_reference(records, baseline)
        mean = _mean_of_ratios(records)
        check(isinstance(got, dict), f"{how} should return a dict keyed by (method, category), got "
              f"{type(got).__name__}")
        keys = set(got)
        methods = sorted({m for m, _ in want})
        if keys == {k for k in want if k[1] != "all"}:
            check(False, f"{how} has no category \"all\": add a (method, \"all\") entry for every method, from "
                  "all of its records together")
        check(keys == set(want), f"{how}: the keys should be (method, category) for the methods {methods} and "
              f"the categories {sorted({c for _, c in want})} (\"all\" included); got {sorted(keys, key=str)}")
        for key in sorted(want):
            row = got[key]
            check(isinstance(row, dict) and {"tau", "tokens_per_s", "speedup"} <= set(row),
                  f"{how}[{key}] should be a dict with \"tau\", \"tokens_per_s\" and \"speedup\", got {row!r}")
        for field, what, total in [("tau", "τ", "sum(tokens) / sum(target_calls)"),
                                   ("tokens_per_s", "tokens/s", "sum(tokens) / sum(seconds)")]:
            for key in sorted(want):
                g, w = float(got[key][field]), want[key][field]
                if _near(g, w):
                    continue
                check(not _near(g, mean[key][field]), f"{how}[{key}][{field!r}] = {g:.4g} is the mean of per-prompt "
                      f"ratios; a benchmark's {what} is the ratio of sums, {total} = {w:.4g}, so a 256-token "
                      "prompt weighs more than a 12-token one")
                check(False, f"{how}[{key}][{field!r}] = {g:.4g}, expected {total} = {w:.4g} over that method's "
                      "records in that category (all of its records for \"all\")")
        for key in sorted(want):
            method, cat = key
            g, w = float(got[key]["speedup"]), want[key]["speedup"]
            if _near(g, w):
                continue
            base_tau = want[(baseline, cat)]["tau"]
            check(not _near(g, want[key]["tau"] / base_tau), f"{how}[{key}]['speedup'] = {g:.4g} compares τ, not "
                  f"time: τ ignores what drafting costs; divide tokens/s by the baseline's tokens/s = {w:.4g}")
            check(not _near(g, 1 / w), f"{how}[{key}]['speedup'] = {g:.4g} is upside down: speedup = this "
                  f"method's tokens/s / the baseline's tokens/s = {w:.4g} (above 1 when the method is faster)")
            check(not _near(g, want[key]["tokens_per_s"] / want[(baseline, "all")]["tokens_per_s"]),
                  f"{how}[{key}]['speedup'] = {g:.4g} divides by the baseline's overall (\"all\") tokens/s; "
                  f"compare within the category: {cat} prompts run at their own pace, so use the baseline's "
                  f"({baseline!r}, {cat!r}) tokens/s, giving {w:.4g}")
            check(False, f"{how}[{key}]['speedup'] = {g:.4g}, expected {w:.4g} = tokens/s of {method!r} / "
                  f"tokens/s of {baseline!r}, both in {cat!r}")
    passed("exercise 1: summarize gives τ and tokens/s as ratios of sums and each speedup against the baseline "
           "in the same category, \"all\" included")


# (alpha, gamma, batches, v = verify cost per batch, c = draft cost per batch): v from the roofline of
# Qwen2.5-7B on an H100 (economics.QWEN25_7B_ON_H100, chapter 02), c rising a little with the batch (the draft's
# own steps stop being free too).
def _switch_off_cases() -> list[tuple]:
    m = QWEN25_7B_ON_H100
    wide = [1, 4, 16, 32, 48, 64, 96, 128, 256, 512]
    small = [1, 2, 4, 8, 16]

    def v(gamma, batches):
        return [round(m.verify_cost(gamma, b), 4) for b in batches]

    return [
        (0.8, 4, wide, v(4, wide), [0.05] * len(wide)),
        (0.8, 4, small, v(4, small), [0.05] * len(small)),  # pays at every batch: None
        (0.7, 3, wide, v(3, wide), [round(0.04 + 0.0004 * b, 4) for b in wide]),
        (1.0, 5, wide, v(5, wide), [0.03] * len(wide)),  # α = 1: γ + 1 tokens per pass
        (0.25, 2, wide, v(2, wide), [0.3] * len(wide)),  # off from the first batch
        (0.6, 6, [2, 8, 24, 40, 56, 80, 100, 160], v(6, [2, 8, 24, 40, 56, 80, 100, 160]), [0.12] * 8),
        (0.9, 2, [1, 2, 3, 5, 7, 9], [1.0, 1.1, 1.3, 1.6, 2.0, 2.5], [0.2, 0.2, 0.3, 0.4, 0.5, 0.6]),
        (0.7, 3, [1, 8, 32, 64, 128], [1.0, 1.0, 1.2, 1.9, 3.1], [0.1, 0.1, 0.1, 0.12, 0.15]),  # the exercise's example
    ]


def _switch_reference(batches, vs, cs, alpha, gamma):
    """The first batch where the library's predicted speedup S = E[tokens] / (v + γ·c) is below 1, or None."""
    return next((b for b, v, c in zip(batches, vs, cs) if speedup(alpha, gamma, c, v) < 1), None)


def _switch_mistake(batches, vs, cs, alpha, gamma, tokens=None, draft=True, last_paying=False, index=False):
    """The wrong answers the hints name: another count of tokens, no draft cost, the last paying batch, an index."""
    e = expected_tokens(alpha, gamma) if tokens is None else tokens
    pays = [e / (v + (gamma * c if draft else 0)) >= 1 for v, c in zip(vs, cs)]
    first = next((i for i, p in enumerate(pays) if not p), None)
    if last_paying:
        last = [i for i, p in enumerate(pays) if p]
        return batches[last[-1]] if last else None
    if index:
        return first
    return None if first is None else batches[first]


@grader
def check_switch_off(switch_off_batch: Callable) -> None:
    """Exercise 08.2: the smallest batch where S = E[tokens] / (v + γ·c) < 1, or None when speculation pays
    at every batch."""
    cases = _switch_off_cases()
    got, want = [], []
    for alpha, gamma, batches, vs, cs in cases:
        case = f"switch_off_batch({batches}, verify_cost={vs}, draft_cost={cs}, alpha={alpha}, gamma={gamma})"
        try:
            out = call(switch_off_batch, list(batches), list(vs), list(cs), alpha, gamma)
        except ZeroDivisionError:
            raise AssertionError(f"{case} divided by zero: at α = 1 every draft is accepted, so a pass yields "
                                 "γ + 1 tokens; the closed form (1 - α^(γ+1)) / (1 - α) is 0/0 there") from None
        check(out is None or (isinstance(out, int) and not isinstance(out, bool))
              or (hasattr(out, "__index__") and not isinstance(out, bool)),
              f"{case} should return a batch size (an int) or None, got {out!r}")
        got.append(None if out is None else int(out))
        want.append(_switch_reference(batches, vs, cs, alpha, gamma))
        assert all(abs(speedup(alpha, gamma, c, v) - 1) > 1e-6 for v, c in zip(vs, cs)), "a grader case has a tie"
    if got == want:
        passed(f"exercise 2: switch_off_batch finds where speculation stops paying on {len(cases)} hidden cases; "
               f"for Qwen2.5-7B on an H100 with α = 0.8, γ = 4, c = 0.05 that is batch {want[0]}")
        return
    wrong = [i for i in range(len(cases)) if got[i] != want[i]]
    variants = [
        ({"index": True}, "returned the index into batches; return the batch size itself, batches[i]"),
        ({"last_paying": True}, "is the LAST batch where speculation still pays; return the FIRST batch where "
         "S < 1, from which on it should be switched off"),
        ({"draft": False}, "forgets the draft's cost: a round costs v + γ·c target steps, not v"),
        ("bonus", "forgets the bonus token: a pass yields 1 + α + ... + α^γ tokens, (1 - α^(γ+1)) / (1 - α), "
         "the 1 being the token the target emits itself"),
    ]

    def answers(change):
        out = []
        for alpha, gamma, batches, vs, cs in cases:
            if change == "bonus":
                out.append(_switch_mistake(batches, vs, cs, alpha, gamma, tokens=expected_tokens(alpha, gamma) - 1))
            else:
                out.append(_switch_mistake(batches, vs, cs, alpha, gamma, **change))
        return out

    i = wrong[0]
    alpha, gamma, batches, vs, cs = cases[i]
    case = f"switch_off_batch({batches}, verify_cost={vs}, draft_cost={cs}, alpha={alpha}, gamma={gamma})"
    for change, hint in variants:  # first: the mistake that explains every answer, then this case alone
        if answers(change) == got:
            check(False, f"{case} = {got[i]}, expected {want[i]}: it {hint}")
    for change, hint in variants:
        if answers(change)[i] == got[i]:
            check(False, f"{case} = {got[i]}, expected {want[i]}: it {hint}")
    s = [round(speedup(alpha, gamma, c, v), 3) for v, c in zip(vs, cs)]
    check(False, f"{case} = {got[i]}, expected {want[i]}: the predicted speedups are {s}, S = E[tokens] / "
          "(v + γ·c); return the first batch with S < 1, or None")


def _max_eagle_nodes(topk: int, depth: int) -> int:
    """Nodes an EAGLE-2 pool can offer: topk at the first level, topk·topk at each later one."""
    return topk + (depth - 1) * topk * topk


@grader
def check_sglang_flags(sglang_flags: Callable) -> None:
    """Exercise 08.3: the course's EagleDrafter(dynamic=True, topk, depth, budget) as SGLang's three flags."""
    keys = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    valid = [(1, 3, 3), (4, 8, 24), (8, 5, 31), (2, 3, 10), (3, 1, 3), (1, 1, 1), (4, 6, 3), (2, 7, 13)]
    for topk, depth, budget in valid:
        case = f"sglang_flags(topk={topk}, depth={depth}, budget={budget})"
        try:
            got = call(sglang_flags, topk, depth, budget)
        except ValueError as e:
            raise AssertionError(f"{case} raised ValueError({e}), but that setting is possible: the pool holds "
                                 f"up to {topk} + ({depth} - 1)·{topk}·{topk} = {_max_eagle_nodes(topk, depth)} "
                                 "nodes" + (", and a chain of depth d has exactly d" if topk == 1 else "")) from None
        want = {keys[0]: depth, keys[1]: topk, keys[2]: budget + 1}
        check(isinstance(got, dict) and set(got) == set(keys), f"{case} should return a dict with exactly the "
              f"keys {list(keys)}, got {got!r}")
        check(all(isinstance(v, int) and not isinstance(v, bool) for v in got.values()),
              f"{case}: the flag values are ints, got {got!r}")
        if got == want:
            continue
        if got[keys[0]] == topk and got[keys[1]] == depth and topk != depth:
            check(False, f"{case} = {got}: steps and topk are swapped; --speculative-num-steps is the depth "
                  "(draft forwards, one per level), --speculative-eagle-topk the children kept per node")
        check(got[keys[0]] == depth and got[keys[1]] == topk, f"{case} = {got}, expected {want}: "
              "--speculative-num-steps = depth, --speculative-eagle-topk = topk")
        check(got[keys[2]] != budget, f"{case} = {got}: SGLang's --speculative-num-draft-tokens counts the root "
              f"(the pending token the target verifies too), so it is budget + 1 = {budget + 1}")
        check(False, f"{case} = {got}, expected {want}: --speculative-num-draft-tokens = budget + 1")
    impossible = [
        ((0, 3, 3), "topk = 0 drafts nothing; every value must be >= 1"),
        ((2, 0, 1), "depth = 0 drafts nothing; every value must be >= 1"),
        ((2, 3, 0), "budget = 0 verifies nothing; every value must be >= 1"),
        ((-1, 2, 2), "a negative topk is meaningless; every value must be >= 1"),
        ((1, 4, 3), "with topk = 1 the tree is a chain of depth 4, so the budget must be 4"),
        ((1, 3, 5), "with topk = 1 the tree is a chain of depth 3, so the budget must be 3"),
        ((2, 3, 11), f"a top-2 tree of depth 3 offers at most 2 + 2·2·2 = {_max_eagle_nodes(2, 3)} nodes"),
        ((4, 1, 5), f"one level of top-4 offers at most {_max_eagle_nodes(4, 1)} nodes"),
    ]
    for (topk, depth, budget), reason in impossible:
        case = f"sglang_flags(topk={topk}, depth={depth}, budget={budget})"
        try:
            got = call(sglang_flags, topk, depth, budget)
        except ValueError as e:
            check(str(e).strip() != "", f"{case} raised ValueError with no message: say which setting is "
                  f"impossible and why, e.g. raise ValueError(\"...\") ({reason})")
            continue
        except Exception as e:  # noqa: BLE001 (any other error is the wrong kind)
            raise AssertionError(f"{case} raised {type(e).__name__}({e}); raise ValueError for an impossible "
                                 f"setting: {reason}") from None
        check(False, f"{case} returned {got!r}; it should raise ValueError: {reason}")
    passed("exercise 3: sglang_flags maps (topk, depth, budget) to SGLang's flags, root token counted, and "
           "refuses settings no tree can hold")
