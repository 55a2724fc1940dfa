"""The README's two paths through the course, with their times, computed from the notebooks themselves.

    python tools/paths.py          print the table the README holds (`python tools/tables.py` writes it there)

Where the times come from:
- a lecture's full time is the reading-and-running time its title cell states ("Time: about 60 minutes ...");
- its first-pass time is that time scaled by the share of its prose (markdown words) outside the sections marked
  "*First pass: skip this section.*" (a marked section runs from its heading to the next heading of the same or a
  higher level), rounded to 5 minutes;
- an exercise notebook's time is the one its title cell states ("about 70 minutes for its 4 graded exercises",
  about 15 minutes an exercise); the capstone's is its stated 2 to 4 hours, counted as 3.
The one-day path is the first pass of the lectures in ONE_DAY_LECTURES plus the exercise notebooks in
ONE_DAY_EXERCISES; the full path is every lecture whole, every exercise notebook and the capstone.
tests/test_paths.py checks the README's table against this output.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = "*First pass: skip this section.*"
WORD = re.compile(r"\w+")
CAPSTONE_MINUTES = 180  # its title cell: "2 to 4 hours for the suffix drafter"
# The one-day path: the first pass of these lectures (the rule, the economics, the decoder, trees, EAGLE, the
# showdown; Medusa, drafter-free methods and serving wait for a second day) and these exercise notebooks (the rule,
# and one speculative step with two caches).
ONE_DAY_LECTURES = ("00", "01", "02", "03", "04", "06", "08")
ONE_DAY_EXERCISES = ("01", "03")


def _markdown(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]


def stated_minutes(path: Path) -> int:
    """The minutes the title cell states: 'Time: about N minutes' (lectures), 'about N minutes for' (exercises)."""
    m = re.search(r"about (\d+) minutes", _markdown(path)[0])
    if not m:
        raise ValueError(f"{path.name}: its title cell states no time ('about N minutes')")
    return int(m.group(1))


def sections(path: Path) -> list[tuple[int, str, bool, int]]:
    """(level, heading, marked for a first pass to skip, prose words under it before the next heading)."""
    out = [(0, "(before the first heading)", False, 0)]
    fenced = False
    for text in _markdown(path):
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fenced = not fenced
            heading = re.match(r"(#+)\s", line) if not fenced else None
            if heading:
                marked = any(l.startswith(SKIP) for l in lines[i + 1:i + 3])
                out.append((len(heading.group(1)), line.lstrip("# ").strip(), marked, 0))
            level, name, marked, words = out[-1]
            out[-1] = (level, name, marked, words + len(WORD.findall(line)))
    return out


def skipped_words(path: Path) -> tuple[int, int]:
    """(prose words a first pass reads, all prose words)."""
    read = total = 0
    skip_level = None  # the level of the marked heading whose section we are in
    for level, _, marked, words in sections(path):
        if skip_level is not None and 0 < level <= skip_level:
            skip_level = None
        if marked and skip_level is None:
            skip_level = level
        total += words
        read += 0 if skip_level is not None else words
    return read, total


def rows() -> list[dict]:
    out = []
    for lecture in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        number = lecture.name[:2]
        read, total = skipped_words(lecture)
        full = stated_minutes(lecture)
        exercise = ROOT / "exercises" / lecture.name
        graded = sum("grading.check_" in "".join(c["source"]) for c in json.loads(exercise.read_text())["cells"]
                     if c["cell_type"] == "code") if exercise.exists() else 0
        title = re.match(r"# \d+ · ([^:]*)", _markdown(lecture)[0]).group(1)
        out.append(dict(number=number, name=f"[{title}](notebooks/{lecture.name})", full=full,
                        first=5 * round(full * read / total / 5), skipped=sum(m for _, _, m, _ in sections(lecture)),
                        exercise=stated_minutes(exercise) if exercise.exists() else 0, graded=graded))
    return out


def _hours(minutes: int) -> str:
    return f"{minutes // 60} h {minutes % 60:02d}"


def table() -> str:
    """The paths table, in the course's order (the capstone is chapter 10); times in minutes."""
    rs = rows()
    lines = ["| # | lecture | sections a first pass skips | first pass | whole lecture | exercises | one-day path | "
             "full path |", "|---|---|---|---|---|---|---|---|"]
    for r in rs:
        day = ((r["first"] if r["number"] in ONE_DAY_LECTURES else 0)
               + (r["exercise"] if r["number"] in ONE_DAY_EXERCISES else 0))
        lines.append(f"| {r['number']} | {r['name']} | {r['skipped']} | {r['first']} | {r['full']} | "
                     f"{r['graded']} graded, {r['exercise']} | {day or '–'} | {r['full'] + r['exercise']} |")
    after = sum(r["number"] < "10" for r in rs)  # the capstone, chapter 10, after the lectures before it
    lines.insert(2 + after, f"| 10 | [capstone](exercises/10_capstone.ipynb) | | | | 1 graded, about "
                            f"{CAPSTONE_MINUTES} | – | {CAPSTONE_MINUTES} |")
    day = (sum(r["first"] for r in rs if r["number"] in ONE_DAY_LECTURES)
           + sum(r["exercise"] for r in rs if r["number"] in ONE_DAY_EXERCISES))
    full = sum(r["full"] + r["exercise"] for r in rs) + CAPSTONE_MINUTES
    lines.append(f"| | **total** | {sum(r['skipped'] for r in rs)} | {sum(r['first'] for r in rs)} | "
                 f"{sum(r['full'] for r in rs)} | {sum(r['graded'] for r in rs) + 1} graded | "
                 f"**{_hours(day)}** | **{_hours(full)}** |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
