"""Notebook checks next to nbval's replay of notebooks/ and solutions/ (which `pytest` runs too):

(b) exercises/ is exactly what `python tools/nbtool.py exercises` makes from solutions/;
(c) every grader cell fails on its unsolved stub with a hint, and the graders catch typical wrong answers
    with a hint that names the mistake;
and every notebook's badge and setup cell are what `python tools/nbtool.py stamp` writes.
"""

import re
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from specdec_lab import REPO_URL, grading

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
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    assert nbtool.colab_url("notebooks/x.ipynb") == (
        f"https://colab.research.google.com/github/{owner_repo}/blob/main/notebooks/x.ipynb"
    )


@pytest.mark.parametrize("path", nbtool.notebooks("notebooks") + nbtool.notebooks("solutions"), ids=rel)
def test_committed_outputs_come_from_one_run(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{rel(path)}: re-execute it top to bottom, then commit"


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


# ---- the graders name the mistake ----------------------------------------------------------------------


def _residual(p, q):
    positive = (p - q).clamp_min(0)
    mass = positive.sum(-1, keepdim=True)
    return torch.where(mass > 0, positive / mass, p)


def _draw(probs, generator):
    return int(torch.multinomial(probs, 1, generator=generator))


def _rule(accept, replacement):
    """A single-position rule from an accept test and a replacement distribution (for wrong variants)."""

    def accept_or_replace(p, q, x, generator=None):
        u = torch.rand((), generator=generator)
        return x if accept(u, p[x], q[x]) else _draw(replacement(p, q), generator)

    return accept_or_replace


_right = _rule(lambda u, px, qx: u * qx < px, _residual)


def _chain(step, bonus=True, stop=True):
    def verify_chain(p, q, draft, generator=None):
        out = []
        for i, x in enumerate(draft):
            out.append(step(p[i], q[i], x, generator))
            if stop and out[-1] != x:
                return out
        return out + ([_draw(p[len(draft)], generator)] if bonus else [])

    return verify_chain


def _answers(**wrong):
    right = {"accept": [0.8, 1, 1, 0], "p_res": [0, 2 / 3, 1 / 3, 0], "alpha": 0.7, "tv": 0.3}

    def four_token_answers():
        return {**right, **wrong}

    return four_token_answers


def _in_place(p, q):
    p -= q
    return _residual(p.clamp_min(0), torch.zeros_like(p))


def _whole_batch(p, q):
    positive = (p - q).clamp_min(0)
    return positive / positive.sum() if positive.sum() > 0 else p


WRONG = [
    (grading.check_four_token, _answers(accept=[0.8, 2, 1, 0]), "caps at 1"),
    (grading.check_four_token, _answers(accept=[1.25, 1, 1, 0]), "the ratio is p over q"),
    (grading.check_four_token, _answers(accept=[0.8, 1, 1, 0.5]), "p(D) = 0"),
    (grading.check_four_token, _answers(p_res=[0, 0.2, 0.1, 0]), "sums to 0.3: did you normalize"),
    (grading.check_four_token, _answers(p_res=[1 / 3, 0, 0, 2 / 3]), "positive part of q - p"),
    (grading.check_four_token, _answers(alpha=0.3), "is the total variation"),
    (grading.check_four_token, _answers(tv=0.6), "half of it"),
    (grading.check_residual, lambda p, q: (p - q).clamp_min(0), "did you normalize?"),
    (grading.check_residual, lambda p, q: (p - q) / (p - q).abs().sum(-1, keepdim=True), "negative entries"),
    (grading.check_residual, lambda p, q: (p - q).clamp_min(0) / (p - q).clamp_min(0).sum(-1, keepdim=True), "NaN"),
    (grading.check_residual, lambda p, q: _residual(q, p), "built from q - p"),
    (grading.check_residual, _whole_batch, "whole batch"),
    (grading.check_residual, _in_place, "in place"),
    (grading.check_accept_or_replace, _rule(lambda u, px, qx: px >= qx, _residual), "accept when p >= q"),
    (grading.check_accept_or_replace, _rule(lambda u, px, qx: u * qx < px, lambda p, q: p), "follow p, not the residual"),
    (grading.check_accept_or_replace, _rule(lambda u, px, qx: u * qx > px, _residual), "must always be accepted"),
    (grading.check_accept_or_replace, lambda p, q, x, generator=None: torch.tensor([x, x]), "one token id"),
    (grading.check_verify_chain, _chain(_right, bonus=False), "bonus token drawn from p[γ] is missing"),
    (grading.check_verify_chain, _chain(_right, stop=False), "stop at the first rejection"),
    (grading.check_verify_chain, _chain(_rule(lambda u, px, qx: u * qx < px, lambda p, q: p)), "not distributed as p[0]"),
    (grading.check_verify_chain, lambda p, q, draft, generator=None: list(draft) + [0], "bonus counts"),
]


@pytest.mark.parametrize("check, answer, hint", WRONG, ids=[f"{c.__name__}-{h}" for c, _, h in WRONG])
def test_graders_name_the_mistake(check, answer, hint):
    with pytest.raises(AssertionError, match=re.escape(hint)):
        check(answer)


@pytest.mark.parametrize(
    "check, answer",
    [
        (grading.check_four_token, _answers()),
        (grading.check_residual, _residual),
        (grading.check_accept_or_replace, _right),
        (grading.check_verify_chain, _chain(_right)),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_graders_pass_right_answers(check, answer, capsys):
    check(answer)
    assert capsys.readouterr().out.startswith("PASS")
