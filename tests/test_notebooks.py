"""Notebook checks next to nbval's replay of notebooks/ and solutions/ (which `pytest` runs too):

(b) exercises/ is exactly what `python tools/nbtool.py exercises` makes from solutions/;
(c) every grader cell fails on its unsolved stub with a hint (that the graders pass right answers and name
    typical mistakes is tested chapter by chapter, in tests/test_grading_00.py to test_grading_09.py);
and every notebook's badge and setup cell are what `python tools/nbtool.py stamp` writes.
"""

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from specdec_lab import REPO_URL

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import nbtool  # noqa: E402

ALL = [p for folder in nbtool.FOLDERS for p in nbtool.notebooks(folder)]
EXERCISES = nbtool.notebooks("exercises")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# ---- (b) exercises are generated -----------------------------------------------------------------


def test_exercises_equal_the_generator_output():
    expected = nbtool.expected_exercises()
    assert expected, "no solution notebooks found"
    for path, contents in expected.items():
        assert path.exists() and path.read_text() == contents, (
            f"{rel(path)} differs from what the generator makes from solutions/: "
            "run `python tools/nbtool.py exercises` and commit the result"
        )
    extra = set(EXERCISES) - set(expected)
    assert not extra, f"exercise notebooks without a solution notebook: {sorted(map(rel, extra))}"


def test_solution_regions_become_stubs():
    source = "def f(x):\n    '''doc'''\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n    ### END SOLUTION\n"
    assert nbtool.strip_solutions(source) == (
        "def f(x):\n    '''doc'''\n    raise NotImplementedError(\"f: your code here\")"
    )
    with pytest.raises(ValueError, match="without"):
        nbtool.strip_solutions("### BEGIN SOLUTION\nx = 1\n")


def test_exercises_have_no_outputs_and_no_solutions():
    for path in EXERCISES:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            assert nbtool.BEGIN not in cell.source, f"{rel(path)} still contains a solution region"
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{rel(path)} has outputs"


# ---- badges and setup cells ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_badge_and_setup_cell_are_stamped(path):
    nb = nbformat.read(path, as_version=4)
    stamped = nbtool.stamp(nb, rel(path))
    assert nb.cells[0].source == stamped.cells[0].source, f"{rel(path)}: badge is stale, run `python tools/nbtool.py stamp`"
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert setup.source == nbtool.SETUP, f"{rel(path)}: setup cell is stale, run `python tools/nbtool.py stamp`"
    assert f"blob/main/{rel(path)}" in nb.cells[0].source


def test_stamp_uses_the_one_repository_address():
    assert f"git+{REPO_URL}" in nbtool.SETUP
    assert '"google.colab" in sys.modules' in nbtool.SETUP
    assert "--no-deps" in nbtool.SETUP  # Colab's preinstalled torch, transformers, ipywidgets stay as they are
    # ... except a transformers older than pyproject's range, and then only transformers is upgraded, to that range
    pins = [line.split("install -q ")[1] for line in nbtool.SETUP.splitlines() if "%pip install" in line]
    assert pins[1:] == [f'"{nbtool.TRANSFORMERS}"  # transformers and what it needs, never torch or ipywidgets'], pins
    assert nbtool.TRANSFORMERS.startswith("transformers>=") and f"{nbtool.LOW}" in nbtool.SETUP
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    assert nbtool.colab_url("notebooks/x.ipynb") == (
        f"https://colab.research.google.com/github/{owner_repo}/blob/main/notebooks/x.ipynb"
    )


@pytest.mark.parametrize("path", nbtool.notebooks("notebooks") + nbtool.notebooks("solutions"), ids=rel)
def test_committed_outputs_come_from_one_run(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{rel(path)}: re-execute it top to bottom, then commit"


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_nbval_markers_are_ones_nbval_reads(path):
    """nbval acts on a comment line only when it is exactly a marker: `# NBVAL_IGNORE_OUTPUT (timings)` is read as
    nothing, and the cell's timings are compared on every run."""
    from nbval.plugin import comment_markers

    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        for line in cell.source.splitlines() if cell.cell_type == "code" else []:
            word = line.strip().lstrip("#").strip()
            if line.strip().startswith("#") and word.startswith("NBVAL"):
                assert word in comment_markers, f"{rel(path)} cell {i}: {line.strip()!r} is no nbval marker"


# ---- (c) graders fail on the stubs ------------------------------------------------------------------


@pytest.mark.parametrize("path", EXERCISES, ids=rel)
def test_every_grader_fails_on_its_unsolved_stub(path):
    """Run the exercise notebook as a learner would before writing anything: every cell in order, errors
    allowed, as `pytest --nbval-lax` does. Only grader cells may fail, each with a hint."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    graders = [i for i, c in enumerate(code) if "grading.check_" in c.source]
    stubs = [i for i, c in enumerate(code) if "raise NotImplementedError" in c.source]
    assert graders and [i + 1 for i in stubs] == graders, f"{rel(path)}: each exercise cell needs a grader cell right after it"
    NotebookClient(nb, timeout=300, allow_errors=True, resources={"metadata": {"path": str(ROOT)}}).execute()
    for i, cell in enumerate(code):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if i not in graders:
            assert not errors, f"{rel(path)}: cell {cell.source[:60]!r} failed: {errors[0].evalue if errors else ''}"
            continue
        assert errors, f"{rel(path)}: grader {cell.source!r} passed on an unsolved stub"
        assert errors[0].ename == "AssertionError" and "not implemented yet" in errors[0].evalue, (
            f"{rel(path)}: grader {cell.source!r} failed without a hint: {errors[0].ename}: {errors[0].evalue}"
        )
