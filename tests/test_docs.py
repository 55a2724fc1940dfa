"""The README and the pages under docs/: a front page of one screen, pages that hold up.

- The README is at most 150 lines; no line of it, of docs/ or of READING.md is over 120 characters.
- Every link in those pages resolves to a file, or to a heading of the page it names.
- The README links every page under docs/, and its course map lists every chapter, in order.
- No page appeals to runs a reader never sees, or tells the history of a change.
- Every generated table is what tools/tables.py draws from its file today; a page that shows a measured figure
  names the committed results file it comes from, and every results file a page names exists.
- docs/references.md lists every work that a notebook cites: in the text (author et al., year), in its References
  cell, or by arXiv number.
"""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import tables  # noqa: E402
from prose_check import CHANGELOG, UNSEEN  # noqa: E402

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
LINKED = [*PAGES, ROOT / "READING.md", ROOT / "CHEATSHEET.md"]  # pages whose links must resolve
NOTEBOOKS = [p for folder in ("notebooks", "exercises", "solutions") for p in sorted((ROOT / folder).glob("*.ipynb"))]
MEASURED = re.compile(r"\b\d+\.\d+x\b|tokens/s|\b\d+(?:\.\d+)? (?:ms|min)\b")  # speedups, rates, times
RESULTS = re.compile(r"results/[\w./-]+\.(?:json|csv)")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def prose(text: str) -> str:
    """A page without its fenced and indented code blocks and its inline code."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path.read_text(encoding="utf-8")), re.M):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def test_the_readme_fits_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move reference material to a page under docs/"


@pytest.mark.parametrize("path", [*PAGES, ROOT / "READING.md"], ids=rel)
def test_no_line_is_over_120_characters(path):
    long = [f"{rel(path)}:{n}: {len(line)} characters" for n, line in
            enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > 120]
    assert not long, "wrap these lines (a table: shorten its cells or make it a list):\n" + "\n".join(long)


@pytest.mark.parametrize("path", LINKED, ids=rel)
def test_every_link_resolves(path):
    text = prose(path.read_text(encoding="utf-8"))
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]: (\S+)$", text, re.M)
    broken = []
    for target in targets:
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: {rel(where)} has no heading #{anchor}")
    assert not broken, f"{rel(path)}: links that do not resolve:\n" + "\n".join(broken)


def test_the_readme_links_every_page_of_docs():
    readme = README.read_text(encoding="utf-8")
    missing = [rel(p) for p in DOCS if f"]({rel(p)})" not in readme]
    assert DOCS and not missing, f"link these pages from the README: {missing}"


def test_every_page_has_a_title():
    untitled = [rel(p) for p in PAGES if not p.read_text(encoding="utf-8").startswith("# ")]
    assert not untitled, f"open these pages with a '# Title' line: {untitled}"


def test_the_course_map_lists_every_chapter_in_order():
    """One line per chapter, 00 up, the capstone as 10: each a link to its lecture (the capstone's exercises)."""
    section = README.read_text(encoding="utf-8").split("## Course map", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"^- `(\d\d)` \[[^\]]+\]\(([^)]+)\)", section, re.M)
    numbers = [n for n, _ in entries]
    chapters = sorted({p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")} | {"10"})
    assert numbers == chapters, f"the course map lists {numbers}; the chapters are {chapters}, in that order"
    for number, target in entries:
        folder = "exercises" if number == "10" else "notebooks"
        assert re.fullmatch(rf"{folder}/{number}_\w+\.ipynb", target), f"chapter {number} links {target}"


def test_the_unseen_run_phrases_are_caught_and_plain_words_are_not():
    for phrase in ("against our previous run (the day before)", "at batch 2, in our two runs", "Replaced: 360M",
                   "measured in earlier runs", "1.24x then, 1.19x now", "in our runs"):
        assert UNSEEN.search(phrase) or CHANGELOG.search(phrase), phrase
    for phrase in ("the token after a rejected draft is drawn from the residual", "each round replaces the target",
                   "before the first pass", "the run before it in the same file", "now run the command"):
        assert not (UNSEEN.search(phrase) or CHANGELOG.search(phrase)), phrase


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_no_page_appeals_to_unseen_runs_or_tells_a_history(path):
    hits = [f"{rel(path)}:{n}: {line.strip()}" for n, line in
            enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if UNSEEN.search(line) or CHANGELOG.search(line)]
    assert not hits, ("say what is and which committed file shows it, not what a run the reader never sees showed or "
                      "what a change replaced:\n" + "\n".join(hits))


def test_generated_tables_are_current():
    stale = tables.stale()
    assert not stale, "regenerate these tables with `python tools/tables.py`:\n" + "\n".join(stale)


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_a_page_with_measured_figures_names_their_files(path):
    text = path.read_text(encoding="utf-8")
    named = RESULTS.findall(text)
    missing = [f for f in named if not (ROOT / f).exists()]
    assert not missing, f"{rel(path)} names results files that do not exist: {missing}"
    if MEASURED.search(prose(text)):
        assert named, f"{rel(path)} shows measured figures but names no committed results file they come from"


def test_every_generated_block_names_an_existing_file():
    for page in PAGES:
        for kind, file, _ in tables.blocks(page.read_text(encoding="utf-8")):
            assert kind in tables.KINDS, f"{rel(page)}: unknown generated block {kind!r}"
            assert file is None or (ROOT / file).exists(), f"{rel(page)}: {kind} block names {file}, which is missing"


# --- the bibliography -------------------------------------------------------------------------------------------

def _markdown(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "markdown"]


def _entries(text: str) -> list[str]:
    """The bullets of a list, each with its continuation lines joined."""
    out = []
    for line in text.splitlines():
        if re.match(r"[*-] ", line):
            out.append(line[2:].strip())
        elif out and line.startswith(" ") and line.strip():
            out[-1] += " " + line.strip()
        elif not line.strip() and out and out[-1] != "":
            out.append("")
    return [e for e in out if e]


def _references() -> list[str]:
    return _entries((ROOT / "docs" / "references.md").read_text(encoding="utf-8"))


def _cited_in_references_cells() -> list[tuple[str, str]]:
    """(notebook, entry) of every entry of every notebook's References cell."""
    out = []
    for nb in NOTEBOOKS:
        for text in _markdown(nb):
            parts = re.split(r"^#+ References\s*$", text, flags=re.M)
            if len(parts) > 1:
                out += [(rel(nb), e) for e in _entries(parts[1])]
    return out


def _listed(surname: str, year: str, refs: list[str]) -> bool:
    return any(re.match(rf"{re.escape(surname)}(?!\w)", e) and re.search(rf"\({year}[a-z]?\)", e) for e in refs)


def test_every_work_a_notebook_cites_is_in_the_references():
    refs = _references()
    page = " ".join((ROOT / "docs" / "references.md").read_text(encoding="utf-8").split())
    missing = []
    for where, entry in _cited_in_references_cells():
        year = re.search(r"\(((?:19|20)\d\d)[a-z]?\)", entry)
        if year:
            surname = re.match(r"[^,(]+", entry).group(0).strip()
            if not _listed(surname, year.group(1), refs):
                missing.append(f"{where}: {surname} ({year.group(1)})")
        else:  # a data sheet or documentation: its italic title and its site
            for name in re.findall(r"\*([^*]+)\*", entry) + re.findall(r"\b(?:[a-z0-9-]+\.)+(?:ai|io|co|com|org)\b", entry):
                if name not in page:
                    missing.append(f"{where}: {name}")
    texts = [(rel(nb), t) for nb in NOTEBOOKS for t in _markdown(nb)]
    texts += [(rel(p), p.read_text(encoding="utf-8")) for p in (*PAGES, ROOT / "READING.md", ROOT / "CHEATSHEET.md")]
    for where, text in texts:
        for surname, year in re.findall(r"\b([A-Z][\w'-]+)\s+et\s+al\.,?\s+\(?((?:19|20)\d\d)", text):
            if not _listed(surname, year, refs):
                missing.append(f"{where}: {surname} et al. {year}")
        for number in re.findall(r"arXiv:\s?(\d{4}\.\d{4,5})", text):
            if number not in page:
                missing.append(f"{where}: arXiv:{number}")
    assert not missing, "add these works to docs/references.md:\n" + "\n".join(sorted(set(missing)))
