"""Notebook tooling for the course.

    python tools/nbtool.py exercises   regenerate exercises/ from solutions/
    python tools/nbtool.py stamp       rewrite the Colab badge and the setup cell of every notebook

exercises: in each solutions/NN_topic.ipynb, every region between `### BEGIN SOLUTION` and
`### END SOLUTION` becomes one `raise NotImplementedError(...)` line at the region's indentation;
outputs and execution counts are cleared; the result goes to exercises/NN_topic.ipynb, stamped.
stamp: markdown cell 0 gets the Open-in-Colab badge for the notebook's own path and the first code
cell becomes SETUP, both built from specdec_lab.REPO_URL (the one place the address lives).
tests/test_notebooks.py checks that the committed notebooks equal what these commands write.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from specdec_lab import REPO_URL  # noqa: E402

FOLDERS = ("notebooks", "solutions", "exercises")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

# transformers' declared range, read from pyproject.toml (its one place): Colab's own transformers is kept unless it
# is older than the range's low end, and then only transformers is upgraded
_found = re.search(r'^\s*"(transformers>=([0-9.]+)[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M)
TRANSFORMERS = _found.group(1)                                  # "transformers>=4.53,<5.25"
LOW = tuple(int(x) for x in _found.group(2).split("."))         # (4, 53)

SETUP = f"""\
# Setup (the same in every notebook). On Colab it installs the course package first.
import sys

if "google.colab" in sys.modules:
    # --no-deps: Colab has what the course needs (chapter 11 installs gguf); never replace its torch or ipywidgets
    %pip install -q --no-deps "specdec-lab @ git+{REPO_URL}"
    from importlib.metadata import version

    if tuple(int(x) for x in version("transformers").split(".")[:{len(LOW)}]) < {LOW}:  # older than the course's range
        %pip install -q "{TRANSFORMERS}"  # transformers and what it needs, never torch or ipywidgets

import torch

import specdec_lab

torch.manual_seed(0)  # fixed seeds: cells not marked NBVAL_IGNORE_OUTPUT print the same each run; fp32 by default
torch.set_default_dtype(torch.float32)"""


def colab_url(relpath: str) -> str:
    """The Colab address that opens `relpath` (e.g. notebooks/01_x.ipynb) from the repository's main branch."""
    owner_repo = REPO_URL.removeprefix("https://github.com/").removesuffix(".git").strip("/")
    return f"https://colab.research.google.com/github/{owner_repo}/blob/main/{relpath}"


def badge(relpath: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(relpath)})"


def stamp(nb, relpath: str):
    """A copy of `nb` with the badge in markdown cell 0 and SETUP as the first code cell."""
    nb = copy.deepcopy(nb)
    head = nb.cells[0]
    if head.cell_type != "markdown":
        raise ValueError(f"{relpath}: cell 0 must be the markdown title cell")
    lines = [line for line in head.source.splitlines() if BADGE_IMAGE not in line]
    while len(lines) > 1 and not lines[1].strip():  # the title, one blank line, the badge, the rest
        del lines[1]
    head.source = "\n".join(lines[:1] + ["", badge(relpath)] + ([""] + lines[1:] if lines[1:] else []))
    setup = next((c for c in nb.cells if c.cell_type == "code"), None)
    if setup is None:
        raise ValueError(f"{relpath}: no code cell to hold the setup")
    setup.source = SETUP
    return nb


def strip_solutions(source: str) -> str:
    """Each BEGIN/END SOLUTION region becomes one NotImplementedError stub at the region's indentation."""
    out, inside = [], False
    for i, line in enumerate(source.splitlines()):
        if line.strip() == BEGIN:
            if inside:
                raise ValueError(f"nested {BEGIN} at line {i + 1}:\n{source}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            names = re.findall(r"^\s*def (\w+)", "\n".join(out), flags=re.M)
            what = f"{names[-1]}: your code here" if names else "your code here"
            out.append(f'{indent}raise NotImplementedError("{what}")')
        elif line.strip() == END:
            if not inside:
                raise ValueError(f"{END} without {BEGIN} at line {i + 1}:\n{source}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN} without {END}:\n{source}")
    return "\n".join(out)


def make_exercise(solution, relpath: str):
    """The exercise notebook for `relpath` (exercises/NN_topic.ipynb) from its solution notebook."""
    nb = copy.deepcopy(solution)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source)
            cell.outputs = []
            cell.execution_count = None
    return stamp(nb, relpath)


def notebooks(folder: str) -> list[Path]:
    return sorted((ROOT / folder).glob("*.ipynb"))


def text(nb) -> str:
    """The exact file contents `write` produces."""
    return nbformat.writes(nb) + "\n"


def write(nb, path: Path) -> bool:
    """Write `nb` to `path` if it differs from what is there; True when the file changed."""
    new = text(nb)
    if path.exists() and path.read_text() == new:
        return False
    path.write_text(new)
    return True


def expected_exercises() -> dict[Path, str]:
    """Every exercise notebook's path and the contents the generator makes for it."""
    out = {}
    for src in notebooks("solutions"):
        relpath = f"exercises/{src.name}"
        out[ROOT / relpath] = text(make_exercise(nbformat.read(src, as_version=4), relpath))
    return out


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "exercises":
        (ROOT / "exercises").mkdir(exist_ok=True)
        for path, contents in expected_exercises().items():
            changed = not path.exists() or path.read_text() != contents
            if changed:
                path.write_text(contents)
            print(f"{'wrote' if changed else 'unchanged'}  {path.relative_to(ROOT)}")
        return 0
    if command == "stamp":
        for folder in FOLDERS:
            for path in notebooks(folder):
                relpath = path.relative_to(ROOT).as_posix()
                changed = write(stamp(nbformat.read(path, as_version=4), relpath), path)
                print(f"{'stamped' if changed else 'unchanged'}  {relpath}")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
