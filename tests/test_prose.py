"""Prose that cannot drift from its evidence: every figure in a notebook's markdown is printed by one of its cells
(or cites a source, or is marked as worked arithmetic), and no sentence appeals to runs the reader never sees.
The rule and its exceptions are in tools/prose_check.py."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import nbtool  # noqa: E402
import prose_check  # noqa: E402

ALL = [p for folder in nbtool.FOLDERS for p in nbtool.notebooks(folder)]


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_figure_in_the_prose_is_printed(path):
    problems = prose_check.unshown(path)
    assert not problems, (
        "numbers in markdown that no cell of the notebook prints (print them from the measurement, cite the "
        "source on the line, or mark worked arithmetic with <!-- worked -->):\n" + "\n".join(problems)
    )


def _notebook(tmp_path, markdown, output, folder="notebooks"):
    (tmp_path / folder).mkdir(exist_ok=True)
    path = tmp_path / folder / "x.ipynb"
    cells = [
        {"cell_type": "code", "source": ["x = measure()\n"], "metadata": {}, "execution_count": 1,
         "outputs": [{"output_type": "stream", "name": "stdout", "text": [output]}]},
        {"cell_type": "markdown", "source": [markdown], "metadata": {}},
    ]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


@pytest.mark.parametrize("markdown", [
    "The speedup is 1.19x.",                       # printed as written
    "c comes out at 0.36 here.",                    # a rounding of the printed 0.3612
    "It saves 14% of the time.",                    # printed as 0.14
    "It ran 1,500 rows.",                           # printed as 1500
    "Leviathan et al. (2023) report 2.5x.",         # cited
    "By hand: 0.7 × 0.7 = 0.49. <!-- worked -->",   # marked
    "<!-- worked -->\n| a | b |\n|---|---|\n| 0.25 | 12.5 |",  # a marked table
    "Chapter 04, section 6 and exercise 2.3.",      # names, not figures
    "γ = 3 drafts, 2 threads.",                     # small integers
])
def test_a_shown_cited_or_marked_figure_passes(tmp_path, markdown):
    path = _notebook(tmp_path, markdown, "speedup 1.19x, c = 0.3612, saved 0.14 of it, 1500 rows\n")
    assert prose_check.unshown(path) == []


@pytest.mark.parametrize("markdown, figure", [
    ("The speedup is 1.23x.", "1.23"),
    ("c comes out at 0.42 here.", "0.42"),
    ("It saves 20% of the time.", "20%"),
    ("It ran 3,000 rows.", "3000"),
    ("A pass over 64 nodes.", "64"),
    ("<!-- worked -->\n| 0.25 |\n\nThen 0.77 in the next paragraph.", "0.77"),  # a marker covers one block only
])
def test_a_figure_nothing_prints_is_reported(tmp_path, markdown, figure):
    path = _notebook(tmp_path, markdown, "speedup 1.19x, c = 0.3612, saved 0.14 of it, 1500 rows\n")
    problems = prose_check.unshown(path)
    assert len(problems) == 1 and f": {figure} is printed nowhere" in problems[0], problems


@pytest.mark.parametrize("markdown", [
    "In our runs the chains were faster.",
    "Over the executions behind this chapter c came out between a third and a half.",
    "Every run we saved agreed.",
])
def test_an_appeal_to_an_unseen_run_is_reported(tmp_path, markdown):
    problems = prose_check.unshown(_notebook(tmp_path, markdown, ""))
    assert problems and "never sees" in problems[0]


def test_an_exercise_is_checked_against_what_its_solution_prints(tmp_path):
    _notebook(tmp_path, "Your run prints 0.83.", "tau 0.83\n", folder="solutions")
    exercise = _notebook(tmp_path, "Your run prints 0.83.", "", folder="exercises")
    assert prose_check.unshown(exercise) == []
    assert prose_check.unshown(_notebook(tmp_path, "Your run prints 0.83.", "")) != []


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_the_first_pass_path_runs(path):
    """A learner who skips the marked sections meets no NameError: no kept cell reads a name only they define."""
    problems = prose_check.needs_skipped(path)
    assert not problems, "define these outside the skipped section, or mark the cell's section too:\n" + "\n".join(problems)


def test_a_name_defined_only_in_a_skipped_section_is_caught(tmp_path):
    def cell(kind, text):
        return {"cell_type": kind, "source": [text], "metadata": {}, **({"outputs": [], "execution_count": None}
                                                                      if kind == "code" else {})}
    cells = [cell("markdown", "## 1. Kept"), cell("code", "a = 1\n%pip install x\nif a:\n    !ls\n"),
             cell("markdown", f"## 2. Skipped\n\n{prose_check.SKIP} Why.\n\n### 2.1 Still inside"),
             cell("code", "b = a + 1\ndef f(x):\n    return x"),
             cell("markdown", "## 3. Kept again"), cell("code", "print(a, f(2))\nc = [b for b in range(3)]")]
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert [p.split(": ", 1)[1] for p in prose_check.needs_skipped(path)] == [
        "reads 'f', which only a section a first pass skips defines"]
