"""What a benchmark prints and saves: fixed-width tables of `bench.run`'s rows and of the showdowns' results, the
Markdown leaderboards of the README and docs/leaderboards.md (tools/tables.py writes them there from the saved
results), and the JSON and CSV files the command line writes.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from specdec_lab.bench import CATEGORIES, Row

__all__ = ["format_table", "format_showdown", "format_batch_showdown", "leaderboard_markdown", "summary_markdown",
           "batch_markdown", "save_results"]


def format_table(rows: list[Row]) -> str:
    """The rows as a fixed-width table; speedup relative to the first row."""
    base = rows[0].tokens_per_second
    width = max(len(r.method) for r in rows)
    lines = [f"{'method':<{width}} | {'τ':>5} | {'target calls':>12} | {'tokens/s':>8} | {'speedup':>7} | same output",
             "-" * (width + 58)]
    for r in rows:
        lines.append(f"{r.method:<{width}} | {r.tau:5.2f} | {r.target_calls:12d} | {r.tokens_per_second:8.1f} | "
                     f"{r.tokens_per_second / base:6.2f}x | "
                     + _identical(dict(identical=r.same, prompts=r.prompts, ties=r.ties, bugs=r.bugs)))
    return "\n".join(lines)


def format_showdown(results: list[dict], temperature: float) -> str:
    """One temperature's results as two fixed-width tables: all prompts, then the speedup by category."""
    rows = [r for r in results if r["temperature"] == temperature]
    every = [r for r in rows if r["category"] == "all"]
    width = max(len(r["method"]) for r in every)
    greedy = temperature == 0
    head = (f"{'method':<{width}} |     τ | target calls | tokens/s | speedup |  limit | eff. | "
            + ("identical" if greedy else ""))
    lines = [f"temperature {temperature:g}" + (" (greedy)" if greedy else " (sampling)"), head, "-" * len(head)]
    for r in every:
        if r["skipped"]:
            lines.append(f"{r['method']:<{width}} | n/a: {r['skipped']}")
            continue
        same = _identical(r) if greedy else ""
        limit = f"{r['limit']:5.2f}x | {r['efficiency']:4.2f}" if r.get("limit") else "    -- |   --"
        lines.append(f"{r['method']:<{width}} | {r['tau']:5.2f} | {r['target_calls']:12d} | {r['tokens_per_s']:8.1f} | "
                     f"{r['speedup']:6.2f}x | {limit} | {same}")
    cats = [c for c in CATEGORIES if any(r["category"] == c for r in rows)]
    lines += ["", f"{'speedup by category':<{width}} | " + " | ".join(f"{c:>6}" for c in cats + ["all"])]
    for r in every:
        if not r["skipped"]:
            by = {x["category"]: x["speedup"] for x in rows if x["method"] == r["method"]}
            lines.append(f"{r['method']:<{width}} | " + " | ".join(f"{by[c]:5.2f}x" for c in cats + ["all"]))
    return "\n".join(lines)


def leaderboard_markdown(results: list[dict]) -> str:
    """The leaderboard of a showdown as a Markdown table (docs/leaderboards.md): τ, speedup per category and over
    all prompts, the limit the method's own forwards allow, identity with greedy decoding, and, where the run also
    sampled, τ and speedup at that temperature. Greedy rows come from temperature 0; a run may hold one more."""
    temps = sorted({r["temperature"] for r in results})
    if temps[0] != 0 or len(temps) > 2:
        raise ValueError(f"the leaderboard wants a greedy run and at most one sampled temperature, got {temps}")
    T = temps[1] if len(temps) == 2 else None
    get = {(r["temperature"], r["method"], r["category"]): r for r in results}
    cats = [c for c in CATEGORIES if any(r["category"] == c for r in results)]
    sampled_head = f" τ at T = {T:g} | speedup at T = {T:g} |" if T is not None else ""
    lines = [f"| method | τ | speedup: {' | '.join(cats)} | all | limit | identical to greedy |{sampled_head}",
             "|---" * (len(cats) + 5 + 2 * (T is not None)) + "|"]
    for r in _greedy(results):
        m = r["method"]
        by = " | ".join(f"{get[0, m, c]['speedup']:.2f}x" for c in cats)
        limit = f"{r['limit']:.2f}x" if r.get("limit") else "--"
        line = f"| {m} | {r['tau']:.2f} | {by} | {r['speedup']:.2f}x | {limit} | {_identical(r)} |"
        if T is not None:
            s = get[T, m, "all"]
            line += " greedy only | greedy only |" if s["skipped"] else f" {s['tau']:.2f} | {s['speedup']:.2f}x |"
        lines.append(line)
    return "\n".join(lines)


def summary_markdown(results: list[dict]) -> str:
    """The short leaderboard of the README: each method's τ, speedup and identity with greedy decoding (greedy)."""
    lines = ["| method | τ | speedup | identical to greedy |", "|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['tau']:.2f} | {r['speedup']:.2f}x | {_identical(r)} |" for r in _greedy(results)]
    return "\n".join(lines)


def batch_markdown(results: list[dict]) -> str:
    """A batched showdown (`specdec-lab bench --batch B`) as a Markdown table: speedup over batched plain decoding."""
    lines = ["| method | batch | τ | batched passes | tokens/s | speedup | identical to its own greedy |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['batch']} | {r['tau']:.2f} | {r['steps']} | {r['tokens_per_s']:.1f} | "
              f"{r['speedup']:.2f}x | {r['identical']}/{r['prompts']} |"
              for r in results if r["temperature"] == 0 and not r["skipped"]]
    return "\n".join(lines)


def _greedy(results: list[dict]) -> list[dict]:
    """The greedy rows over all prompts of a showdown that ran, in the run's order."""
    return [r for r in results if r["temperature"] == 0 and r["category"] == "all" and not r["skipped"]]


def _identical(r: dict) -> str:
    """'52/52', or with the mismatches named: '51/52 (1 tie)', '50/52 (1 tie, 1 BUG)'."""
    ties, bugs = r.get("ties") or 0, r.get("bugs") or 0
    notes = [f"{ties} {'tie' if ties == 1 else 'ties'}"] if ties else []
    notes += [f"{bugs} BUG{'S' * (bugs > 1)}"] if bugs else []
    return f"{r['identical']}/{r['prompts']}" + (f" ({', '.join(notes)})" if notes else "")


def save_results(results: list[dict], meta: dict, json_path=None, csv_path=None) -> None:
    """Write the showdown's results: JSON ({"meta": ..., "results": [...]}) and/or CSV (one line per result)."""
    for path in (json_path, csv_path):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if json_path:
        Path(json_path).write_text(json.dumps({"meta": meta, "results": results}, indent=1, ensure_ascii=False) + "\n")
    if csv_path:
        with open(csv_path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(results[0]))
            writer.writeheader()
            writer.writerows(results)


def format_batch_showdown(results: list[dict], temperature: float) -> str:
    """One temperature's batched results as a fixed-width table."""
    rows = [r for r in results if r["temperature"] == temperature]
    width = max(len(r["method"]) for r in rows)
    greedy = temperature == 0
    head = (f"{'method':<{width}} | batch |     τ | batched passes | tokens/s | speedup | "
            + ("identical to its own greedy" if greedy else ""))
    lines = [f"temperature {temperature:g}" + (" (greedy)" if greedy else " (sampling)") + ": speedup over batched "
             "plain decoding (target only) in the same run", head, "-" * len(head)]
    for r in rows:
        if r["skipped"]:
            lines.append(f"{r['method']:<{width}} | n/a: {r['skipped']}")
            continue
        same = f"{r['identical']}/{r['prompts']}" if greedy else ""
        lines.append(f"{r['method']:<{width}} | {r['batch']:5d} | {r['tau']:5.2f} | {r['steps']:14d} | "
                     f"{r['tokens_per_s']:8.1f} | {r['speedup']:6.2f}x | {same}")
    return "\n".join(lines)
