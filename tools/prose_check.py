"""Numbers in a notebook's prose that nothing in the notebook shows, and appeals to runs a reader never sees.

    python tools/prose_check.py NOTEBOOK...     list them; exit status 1 if there are any

A course's measured figures move with every run. The rule this enforces: a figure in a markdown cell is either
printed by a code cell of the same notebook (its output, or the code itself: a constant, a slice), or it is
not a measurement at all and says so:
- its line cites a source (an author "et al.", a year, an arXiv number): a published figure;
- its line carries the marker <!-- worked --> (invisible when rendered): worked arithmetic, a made-up example,
  a chosen value (a threshold, a setting); or <!-- cited -->: a published figure whose source is named nearby
  (the sentence before, the table's caption). A line holding only a marker covers the block below it (a table,
  a paragraph) up to the next blank line; put a blank line before it, since a comment line ends the paragraph.
Numbers that are names, not figures, are skipped: "chapter 03", "section 6", "exercise 2.1", "§4", headings'
own numbering, list numbering, link targets, HTML comments, fenced code blocks, a title cell's reading time. An exercise notebook
is committed without outputs; what its solution notebook prints is what running it shows.

A cell a first pass runs may not read a name that only a section marked "*First pass: skip this section.*"
defines (`needs_skipped`): the learner on the first-pass path would meet a NameError.

A printed 0.3612 supports a written 0.36 (a rounding of it), a printed 0.14 a written 14%. Integers below 10
are too common to check (γ = 3, two threads). tests/test_prose.py runs this over notebooks/, solutions/ and
exercises/ and fails on any hit.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paths import SKIP  # noqa: E402  the mark under a heading: a first pass skips the section

MARKERS = ("<!-- worked -->", "<!-- cited -->")
CITES = re.compile(r"et al\.|\b(19|20)\d\d\b|arXiv|data ?sheet|Spec-Bench|\b\d+\(\d+\)", re.I)
# names, not figures: "chapter 03", "chapters 02-04", "exercise 2.1 and 2.3", "§4", "cell 12"
NAMES = re.compile(
    r"(?:\b(?:chapters?|sections?|exercises?|notebooks?|cells?|parts?|steps?|items?|lectures?|figures?|"
    r"tables?|questions?|lines?|rows?)|§)\s*\d+(?:\.\d+)*(?:\s*(?:[-–,]|and|or|to)\s*\d+(?:\.\d+)*)*"
    r"|\b\d+ minutes (?:to read|for its)",  # the title cell's reading time: an estimate, not a measurement
    re.I,
)
HIDDEN = re.compile(r"<!--.*?-->|\]\([^)]*\)|<https?://[^>]*>|https?://\S+")  # comments, link targets, URLs
# a figure in prose: 0.36, 1,500, 14%, 1.19x, 12 ms, 1.05M; not the 135 of "SmolLM2-135M" or the 2.5 of "Qwen2.5"
NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z]-)(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(\s*%)?(?:x|×|ms|µs|s|GB|MB|M|k)?(?!\w)")
PRINTED = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")  # in code and outputs any digits count: 153x, v(5), 1e-3
UNSEEN = re.compile(
    r"\bin our (?:own )?runs?\b|\bour (?:full |earlier |other |saved )?runs\b|\bexecutions? behind\b|"
    r"\bevery run we\b|\bruns? we (?:saved|made|did)\b|\bin CI\b|\bwe (?:have )?(?:measured|saw|observed) (?:elsewhere|before)\b",
    re.I,
)


# Changelog prose on a page (README, docs/): "replaced", "earlier runs", "our previous run (the day before)", "in our
# two runs", "1.24x then, 1.19x now". tests/test_docs.py applies it with UNSEEN.
CHANGELOG = re.compile(
    r"\breplaced\b|\b(?:earlier|previous|former|last) (?:runs?|versions?|heads|measurements?)\b|\bthe day before\b|"
    r"\bin (?:our|the) (?:two|three|four|several|\d+) runs\b|\b(?:than|as) before\b|\bno longer\b|"
    r"\bbefore (?:the|this|it was) (?:change|fix|trim|retrain)|\b(?:then|earlier), [^;]{0,30}?\bnow\b",
    re.I,
)


def _figures(text: str) -> list[tuple[str, bool]]:
    """The numbers of a line of prose worth checking: (number as written without commas, is a percentage)."""
    text = NAMES.sub(" ", HIDDEN.sub(" ", text))
    text = re.sub(r"^\s*(?:#+\s*)?\d+(?:\.\d+)*(?:[.)]| ·)\s", " ", text)  # "## 3. Title", "2. item", "# 11 · Title"
    found = []
    for m in NUMBER.finditer(text):
        n, percent = m.group(1).replace(",", ""), bool(m.group(2))
        if "." in n or percent or float(n) >= 10:
            found.append((n, percent))
    return found


def _evidence(nbs: list[dict]) -> tuple[set[str], list[float]]:
    """Every number in the notebooks' code cells and their text outputs: as written, and as values."""
    texts = []
    for cell in (cell for nb in nbs for cell in nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        texts.append("".join(cell["source"]))
        for out in cell.get("outputs", []):
            texts.append("".join(out.get("text", "")))
            for kind, value in out.get("data", {}).items():
                if kind.startswith("text/"):
                    texts.append("".join(value) if isinstance(value, list) else str(value))
    numbers = PRINTED.findall(re.sub(r"(?<=\d)[,_](?=\d{3}\b)", "", "\n".join(texts)))  # 1,500 and 1_500
    numbers += [n.partition("e")[0] for n in numbers if "e" in n]  # 3.35e12 shows a written 3.35 (TB/s)
    return set(numbers), [float(n) for n in numbers]


def _shown(n: str, percent: bool, written: set[str], values: list[float]) -> bool:
    if n in written:
        return True
    places = len(n.partition(".")[2])
    target = float(n)
    scales = (1.0, 100.0) if percent else (1.0,)
    return any(abs(round(v * s, places) - target) < 1e-9 for v in values for s in scales)


def unshown(path: str | Path) -> list[str]:
    """One line per problem in the notebook at `path`: a number its prose states and nothing in it shows, or an
    appeal to a run the reader never sees."""
    path = Path(path)
    nb = json.loads(path.read_text())
    # an exercise notebook is committed without outputs: its solution's outputs are what running it prints
    solution = path.parent.parent / "solutions" / path.name
    shown_by = [nb] + ([json.loads(solution.read_text())] if path.parent.name == "exercises" and solution.exists() else [])
    written, values = _evidence(shown_by)
    problems = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        covered = fenced = False
        for line in "".join(cell["source"]).splitlines():
            if line.lstrip().startswith("```"):  # a fenced block is code, not prose
                fenced = not fenced
                continue
            if fenced:
                continue
            if line.strip() in MARKERS:
                covered = True
                continue
            if not line.strip():
                covered = False
            where = f"{path} cell {i}"
            if UNSEEN.search(line):
                problems.append(f"{where}: appeals to a run the reader never sees | {line.strip()[:100]}")
            if covered or any(m in line for m in MARKERS) or CITES.search(line):
                continue
            for n, percent in _figures(line):
                if not _shown(n, percent, written, values):
                    problems.append(f"{where}: {n}{'%' if percent else ''} is printed nowhere | {line.strip()[:100]}")
    return problems




def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a code cell binds, names it reads); IPython's % and ! lines left out."""
    code = "\n".join(line[:len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())
    bound, read = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, read


def needs_skipped(path: str | Path) -> list[str]:
    """One line per name a cell a first pass runs reads from a cell only a skipped section defines: a NameError for
    the learner who follows the first-pass path (a marked section runs to the next heading of its level or above)."""
    nb = json.loads(Path(path).read_text())
    skipping = None  # the level of the marked section we are in, or None
    kept, only_skipped, problems = set(), set(), []
    for i, cell in enumerate(nb["cells"]):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            lines = text.split("\n")
            for j, line in enumerate(lines):
                heading = re.match(r"(#+)\s", line)
                if heading:
                    level = len(heading.group(1))
                    if skipping is not None and level <= skipping:
                        skipping = None
                    if skipping is None and any(l.startswith(SKIP) for l in lines[j + 1:j + 3]):
                        skipping = level
            continue
        bound, read = _names(text)
        if skipping is not None:
            only_skipped |= bound - kept
            continue
        for name in sorted((read - bound) & only_skipped):
            problems.append(f"{path} cell {i}: reads {name!r}, which only a section a first pass skips defines")
        kept |= bound
        only_skipped -= bound
    return problems


def main(paths: list[str]) -> int:
    problems = [p for path in paths for p in unshown(path) + needs_skipped(path)]
    print("\n".join(problems))
    print(f"{len(problems)} problems in {len(paths)} notebooks")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
