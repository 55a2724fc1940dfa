"""Chapter 08's graders: they pass right answers and name the mistake in wrong ones."""
from helpers import grader_tests, stub_rows

from specdec_lab import grading
from specdec_lab.economics import expected_tokens


def _summarize(ratio="sums", speedup="time", against="category", all_=True, inverted=False):
    def summarize(records, baseline="target only"):
        groups = {}
        for r in records:
            for cat in [r["category"]] + (["all"] if all_ else []):
                groups.setdefault((r["method"], cat), []).append(r)
        out = {}
        for key, rs in groups.items():
            if ratio == "sums":
                tau = sum(r["tokens"] for r in rs) / sum(r["target_calls"] for r in rs)
                tps = sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
            else:  # the mean of per-prompt ratios, for τ or for tokens/s
                tau = sum(r["tokens"] / r["target_calls"] for r in rs) / len(rs)
                tps = sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
                if ratio == "mean tps":
                    tau = sum(r["tokens"] for r in rs) / sum(r["target_calls"] for r in rs)
                    tps = sum(r["tokens"] / r["seconds"] for r in rs) / len(rs)
            out[key] = {"tau": tau, "tokens_per_s": tps}
        for (method, cat), row in out.items():
            field = "tokens_per_s" if speedup == "time" else "tau"
            base = out[(baseline, cat if against == "category" else "all")][field]
            row["speedup"] = base / row[field] if inverted else row[field] / base
        return out

    return summarize


def _switch(strict=True, index=False, draft=True, bonus=True, last_paying=False):
    def switch_off_batch(batches, verify_cost, draft_cost, alpha, gamma):
        tokens = expected_tokens(alpha, gamma) - (0 if bonus else 1)
        pays = [tokens / (v + (gamma * c if draft else 0)) >= (1 if strict else 1 + 1e-12)
                for v, c in zip(verify_cost, draft_cost)]
        if last_paying:
            kept = [b for b, p in zip(batches, pays) if p]
            return kept[-1] if kept else None
        for i, (b, p) in enumerate(zip(batches, pays)):
            if not p:
                return i if index else b
        return None

    return switch_off_batch


def _flags(plus_one=True, swap=False, bound="pool", chain_check=True, message=True, error=ValueError):
    def sglang_flags(topk, depth, budget):
        def fail(why):
            raise error(why if message else "")

        if min(topk, depth, budget) < 1:
            fail(f"topk, depth and budget must be >= 1, got {topk}, {depth}, {budget}")
        if chain_check and topk == 1 and budget != depth:
            fail(f"a chain of depth {depth} has {depth} nodes, not {budget}")
        most = topk + (depth - 1) * topk * topk if bound == "pool" else None
        if most is not None and budget > most:
            fail(f"a top-{topk} tree of depth {depth} offers at most {most} nodes, not {budget}")
        steps, k = (topk, depth) if swap else (depth, topk)
        return {"--speculative-num-steps": steps, "--speculative-eagle-topk": k,
                "--speculative-num-draft-tokens": budget + 1 if plus_one else budget}

    return sglang_flags


def _too_tight(topk, depth, budget):
    """sglang_flags with a budget bound that is too tight: topk · depth nodes at most."""
    if budget > topk * depth:
        raise ValueError("too many nodes")
    return _flags(bound=None)(topk, depth, budget)


WRONG = [
    (grading.check_summarize, _summarize(ratio="mean tau"), "mean of per-prompt ratios"),
    (grading.check_summarize, _summarize(ratio="mean tps"), "mean of per-prompt ratios"),
    (grading.check_summarize, _summarize(speedup="tau"), "compares τ, not time"),
    (grading.check_summarize, _summarize(against="all"), "baseline's overall (\"all\") tokens/s"),
    (grading.check_summarize, _summarize(all_=False), "has no category \"all\""),
    (grading.check_summarize, _summarize(inverted=True), "upside down"),
    (grading.check_summarize, lambda records, baseline="target only": _summarize()(records), "the `baseline` arg"),
    (grading.check_switch_off, _switch(index=True), "returned the index into batches"),
    (grading.check_switch_off, _switch(draft=False), "forgets the draft's cost"),
    (grading.check_switch_off, _switch(bonus=False), "forgets the bonus token"),
    (grading.check_switch_off, _switch(last_paying=True), "LAST batch where speculation still pays"),
    (grading.check_sglang_flags, _flags(plus_one=False), "counts the root"),
    (grading.check_sglang_flags, _flags(swap=True), "steps and topk are swapped"),
    (grading.check_sglang_flags, _flags(bound=None), "it should raise ValueError: a top-2 tree"),
    (grading.check_sglang_flags, _flags(chain_check=False), "so the budget must be 4"),
    (grading.check_sglang_flags, _flags(message=False), "ValueError with no message"),
    (grading.check_sglang_flags, _flags(error=AssertionError), "raise ValueError for an impossible setting"),
    (grading.check_sglang_flags, _too_tight, "but that setting is possible"),
    *stub_rows(grading.check_summarize, grading.check_switch_off, grading.check_sglang_flags),
]

RIGHT = [
    (grading.check_summarize, _summarize()),
    (grading.check_switch_off, _switch()),
    (grading.check_switch_off, _switch(strict=False)),  # every case is clear of S = 1: S <= 1 and S < 1 agree
    (grading.check_sglang_flags, _flags()),
]


test_graders = grader_tests(WRONG, RIGHT)
