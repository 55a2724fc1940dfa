"""Learner-facing text cites sources a learner can find, and every chapter links the glossary.

- No "seed 0..." reference (the course's internal source notes) anywhere a learner reads: the notebooks, exercises
  and solutions (sources and saved outputs), the README and the pages under docs/, and the package (code,
  docstrings, data, model card).
- Every lecture notebook links the glossary (docs/glossary.md) near its top and has a References cell.
- docs/glossary.md holds the glossary those links point at; docs/references.md the bibliography (tests/test_docs.py
  checks that it lists every work the notebooks cite).
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEARNER_FACING = [ROOT / "notebooks", ROOT / "exercises", ROOT / "solutions", ROOT / "README.md", ROOT / "READING.md",
                  ROOT / "CHEATSHEET.md", ROOT / "docs", ROOT / "specdec_lab"]
TEXT_SUFFIXES = {".py", ".ipynb", ".md", ".json", ".txt", ".toml", ".cfg", ".yaml", ".yml", ".csv", ".html"}
SEED = re.compile(r"seed 0", re.IGNORECASE)
GLOSSARY_LINK = "docs/glossary.md"
LECTURES = sorted((ROOT / "notebooks").glob("*.ipynb"))


def learner_files() -> list[Path]:
    files = []
    for place in LEARNER_FACING:
        candidates = [place] if place.is_file() else sorted(p for p in place.rglob("*") if p.is_file())
        files += [p for p in candidates if p.suffix in TEXT_SUFFIXES and ".ipynb_checkpoints" not in p.parts
                  and "__pycache__" not in p.parts]
    return files


def test_no_seed_references():
    hits = []
    for path in learner_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if SEED.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, ("learner-facing text names a seed; cite the paper or system instead (author, year), or the "
                      "chapter and section:\n" + "\n".join(hits))


def markdown_cells(path: Path) -> list[str]:
    """The text of every cell, "" for code cells, so indices stay those of the notebook."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["" if c["cell_type"] != "markdown" else "".join(c["source"]) if isinstance(c["source"], list)
            else c["source"] for c in cells]


def test_there_are_lectures():
    assert len(LECTURES) >= 10, f"expected the ten lecture notebooks 00-09, found {[p.name for p in LECTURES]}"


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.stem)
def test_lecture_links_the_glossary_near_its_top(path):
    cells = markdown_cells(path)
    assert any(GLOSSARY_LINK in text for text in cells[:4]), (
        f"{path.name}: link the glossary in one of its first cells, e.g. a line in the title cell: "
        f"'Symbols and terms: [glossary](../{GLOSSARY_LINK}).'")


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.stem)
def test_lecture_has_a_references_cell(path):
    refs = [text for text in markdown_cells(path) if re.search(r"^#+ References\s*$", text, re.MULTILINE)]
    assert refs, f"{path.name}: add a Markdown cell '## References' listing the works the chapter cites"
    entries = [line for line in refs[0].splitlines() if line.lstrip().startswith(("*", "-"))]
    assert entries, f"{path.name}: its References cell lists no works"


def test_the_glossary_and_the_bibliography_have_their_pages():
    glossary = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    assert re.match(r"# Glossary and notation\s*$", glossary, re.MULTILINE), (
        "docs/glossary.md: the notebooks link it, so it opens with '# Glossary and notation'")
    references = (ROOT / "docs" / "references.md").read_text(encoding="utf-8")
    assert re.match(r"# References\s*$", references, re.MULTILINE), "docs/references.md: open with '# References'"
    for term in ("α", "τ", "γ", "c_bench", "v(n)", "pending token", "residual", "bonus token", "draft tree", "root",
                 "path compaction", "agreement", "lossy"):
        assert term in glossary, f"docs/glossary.md: the glossary lacks {term!r}"


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.stem)
def test_lecture_ends_with_a_self_test_with_folded_answers(path):
    cells = markdown_cells(path)
    at = [i for i, text in enumerate(cells) if re.search(r"^#+ Self-test\s*$", text, re.MULTILINE)]
    assert at and at[-1] > 2 * len(cells) // 3, (
        f"{path.name}: end the chapter with a '## Self-test' cell (before the summary), its answers folded in "
        "<details>")
    assert "<details>" in cells[at[-1]] and "</details>" in cells[at[-1]], f"{path.name}: fold the self-test's answers"


TIMED = LECTURES + sorted((ROOT / "exercises").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("path", TIMED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_notebook_says_how_long_it_takes(path):
    top = "\n".join(markdown_cells(path)[:3])
    assert re.search(r"Time: (about )?\d", top), (
        f"{path.parent.name}/{path.name}: say near the top how long it takes, e.g. 'Time: about 45 minutes'")
