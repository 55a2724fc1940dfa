"""The generated tables of README.md and docs/*.md, written from the committed results and the notebooks.

    python tools/tables.py           rewrite every generated block in place
    python tools/tables.py --check   list the stale blocks; exit status 1 if there are any

A generated block sits between two HTML comments, invisible when rendered:

    <!-- generated: KIND [FILE] -->
    ...
    <!-- /generated -->

KIND says what is drawn, FILE which committed results it is drawn from:
- summary FILE      a showdown's short leaderboard: τ, speedup, identity with greedy decoding (the README's)
- leaderboard FILE  a showdown's full leaderboard (specdec_lab.report.leaderboard_markdown)
- batch FILE        a batched showdown (`specdec-lab bench --batch B`)
- roofline FILE     a CPU's v(n) in bf16 and fp32 at one and two threads (tools/cpu_roofline.py)
- tau FILE          τ by prompt category of the real model's drafts (tools/real_tau.py)
- heads FILE        how those drafts were trained and how often they agree with the target (tools/real_tau.py)
- paths             the two paths through the course and their times (tools/paths.py)
A block drawn from a file opens with a line that names the file and what the file records of the run (model, CPU,
threads, precision, versions, date). tests/test_docs.py fails when a block differs from what this script writes.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import paths  # noqa: E402

from specdec_lab import report  # noqa: E402

BLOCK = re.compile(r"<!-- generated: (\w+)(?: (\S+))? -->\n(.*?)<!-- /generated -->", re.S)
WIDTH = 120


def pages() -> list[Path]:
    """The pages that may hold generated blocks: the README and every page under docs/."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, WIDTH, break_on_hyphens=False))


def _threads(n: int) -> str:
    return f"{n} thread{'s' * (n != 1)}"


def _showdown_caption(file: str, meta: dict) -> str:
    if meta["device"] != "cpu":
        where = f"device {meta['device']}"
    else:
        where = f"CPU: {meta.get('cpu') or meta['machine'] + ', its model not recorded in the file'}"
    return _wrap(f"*From `{file}`: pair `{meta['pair']}`; {where}; {_threads(meta['threads'])}; {meta['dtype']}; "
                 f"{meta['prompts']} prompts × {meta['max_new_tokens']} new tokens; batch {meta.get('batch', 1)}; "
                 f"torch {meta['torch']}, transformers {meta['transformers']}; {meta['date']}.*")


def _showdown(draw):
    """A block drawn from a showdown's results file by `draw` (a report.*_markdown), under the file's caption."""
    def block(file: str) -> str:
        data = json.loads((ROOT / file).read_text())
        return _showdown_caption(file, data["meta"]) + "\n\n" + draw(data["results"])
    return block


def roofline(file: str) -> str:
    """v(n), a pass over n tokens in one-token steps, for each thread count and precision the run timed."""
    run = json.loads((ROOT / file).read_text())
    columns = [(t, dtype) for t, by in run["threads"].items() for dtype in by["dtypes"]]
    ns = sorted({int(n) for t, dtype in columns for n in run["threads"][t]["dtypes"][dtype]["v"]})
    caption = _wrap(f"*From `{file}`: SmolLM2-135M-Instruct ({run['params']:,} parameters) on {run['cpu']}; "
                    f"torch {run['torch']}; {run['date']}.*")
    lines = ["| | " + " | ".join(f"{dtype}, {_threads(int(t))}" for t, dtype in columns) + " |",
             "|---" * (len(columns) + 1) + "|",
             "| one step (ms) | " + " | ".join(f"{run['threads'][t]['dtypes'][dtype]['step_ms']:.1f}"
                                               for t, dtype in columns) + " |"]
    for n in ns[1:]:
        lines.append(f"| v({n}) | " + " | ".join(f"{run['threads'][t]['dtypes'][dtype]['v'][str(n)]:.2f}"
                                                for t, dtype in columns) + " |")
    return caption + "\n\n" + "\n".join(lines)


def _tau_caption(file: str, run: dict) -> str:
    plain = (f" (and {run['plain_prompts']} openings of plain text to continue, outside the template: plain, not in "
             "all)") if any("plain" in by for by in run["tau"].values()) else ""
    return _wrap(f"*From `{file}`: SmolLM2-135M-Instruct, {run['prompts']} held-out prompts{plain}, greedy, "
                 f"{run['new_tokens']} new tokens each.*")


def tau(file: str) -> str:
    run = json.loads((ROOT / file).read_text())
    cats = list(dict.fromkeys(c for by in run["tau"].values() for c in by))  # plain: only rows run with --plain
    lines = ["| drafter | " + " | ".join(cats) + " |", "|---" * (len(cats) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{by[c]:.2f}" if c in by else "–" for c in cats) + " |"
              for name, by in run["tau"].items()]
    return _tau_caption(file, run) + "\n\n" + "\n".join(lines)


def heads(file: str) -> str:
    run = json.loads((ROOT / file).read_text())
    lines = ["| draft | data | scored | windows | steps | minutes | agreement 1, 2, 3 tokens ahead |",
             "|---|---|---|---|---|---|---|"]
    for name, h in run["heads"].items():
        agree = ", ".join(f"{a:.2f}" for a in h["val_accuracy_vs_target"][:3])
        lines.append(f"| {name} | `{h['data']}` | {h.get('scored', '–')} | {h['windows']:,} | {h['steps']:,} | "
                     f"{h['seconds'] / 60:.0f} | {agree} |")
    return _tau_caption(file, run) + "\n\n" + "\n".join(lines)


KINDS = {"summary": _showdown(report.summary_markdown), "leaderboard": _showdown(report.leaderboard_markdown),
         "batch": _showdown(report.batch_markdown), "roofline": roofline, "tau": tau,
         "heads": heads, "paths": lambda file=None: paths.table()}


def render(kind: str, file: str | None) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown generated block {kind!r}: one of {', '.join(KINDS)}")
    return KINDS[kind](file) if file else KINDS[kind]()


def blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(kind, file, body as written) of every generated block of a page."""
    return [(m.group(1), m.group(2), m.group(3)) for m in BLOCK.finditer(text)]


def refreshed(text: str) -> str:
    """The page with every generated block rewritten."""
    return BLOCK.sub(lambda m: f"<!-- generated: {m.group(1)}{' ' + m.group(2) if m.group(2) else ''} -->\n"
                               f"{render(m.group(1), m.group(2))}\n<!-- /generated -->", text)


def stale() -> list[str]:
    """'page: kind file' of every block that differs from what `render` draws."""
    out = []
    for page in pages():
        for kind, file, body in blocks(page.read_text(encoding="utf-8")):
            if body != render(kind, file) + "\n":
                out.append(f"{page.relative_to(ROOT)}: {kind} {file or ''}".rstrip())
    return out


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        found = stale()
        print("\n".join(found) or "every generated block is current")
        return 1 if found else 0
    if argv[1:]:
        print(__doc__)
        return 2
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = refreshed(text)
        if new != text:
            page.write_text(new, encoding="utf-8")
        print(f"{'wrote' if new != text else 'unchanged'}  {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
