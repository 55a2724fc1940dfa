"""The course's two paths (README): every lecture marks what a first pass skips, the marks sit under section
headings, and the README's table of times is what tools/paths.py computes from the notebooks."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import paths  # noqa: E402

LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.name)
def test_each_lecture_marks_what_a_first_pass_skips(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]
    marks = 0
    for cell in cells:
        lines = "".join(cell["source"]).split("\n")
        for i, line in enumerate(lines):
            if "First pass" in line:
                assert line.startswith(paths.SKIP), f"{path.name}: write the mark exactly as {paths.SKIP!r}: {line!r}"
                assert i >= 2 and re.match(r"#+\s", lines[i - 2]) and not lines[i - 1].strip(), (
                    f"{path.name}: a first-pass mark belongs right under a section's heading: {line!r}")
                marks += 1
    assert marks, f"{path.name} marks no section a first pass can skip"
    read, total = paths.skipped_words(path)
    assert 0 < read < total


def test_a_marked_section_ends_at_the_next_heading_of_its_level(tmp_path):
    cells = ["# T\n\nTime: about 60 minutes to read.", "## 1. Kept\n\none two three",
             f"## 2. Skipped\n\n{paths.SKIP} why\n\nfour five\n\n### 2.1 Inside\n\nsix seven", "## 3. Kept\n\neight"]
    nb = {"cells": [{"cell_type": "markdown", "source": c, "metadata": {}} for c in cells], "metadata": {},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    read, total = paths.skipped_words(path)
    skipped = total - read
    assert skipped == len(re.findall(r"\w+", f"2. Skipped {paths.SKIP} why four five 2.1 Inside six seven"))
    assert paths.stated_minutes(path) == 60


def test_the_readme_shows_both_paths_with_the_computed_times():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- generated: paths -->\n(.*?)\n<!-- /generated -->", readme, re.S)
    assert block, "the README's paths table is missing (between <!-- generated: paths --> and <!-- /generated -->)"
    assert block.group(1) == paths.table(), "the README's paths table is stale: run `python tools/tables.py`"
    total = paths.table().splitlines()[-1]
    day, full = re.findall(r"\*\*(\d+ h \d+)\*\*", total)
    assert f"one-day path ({day})" in readme and f"full path ({full})" in readme, "say both totals in the prose"
    for doc in ("CHEATSHEET.md", "READING.md", "BUGS.md"):
        assert f"]({doc})" in readme, f"the README links {doc}"


def test_the_paths_table_runs_in_the_course_order():
    """Chapter numbers rise down the table: the capstone (10) sits between 09 and 11."""
    numbers = [line.split("|")[1].strip() for line in paths.table().splitlines()[2:-1]]
    assert numbers == sorted(numbers) and "10" in numbers, numbers
