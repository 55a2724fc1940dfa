"""The README and the pages under docs/: pages that hold up.

- No line of the README, of docs/ or of READING.md is over 120 characters.
- Every link in those pages resolves to a file, or to a heading of the page it names.
- The README links every page under docs/, and its course map lists every chapter, in order.
- No page appeals to runs a reader never sees, or tells the history of a change.
- Every generated table is what tools/tables.py draws from its file today; a page that shows a measured figure
  names the committed results file it comes from, and every results file a page names exists.
- docs/references.md lists every work that a notebook cites: in the text (author et al., year), in its References
  cell, or by arXiv number.
- Every committed showdown under results/ adds up (rows, sums by category, τ, identity counts), and what the pages
  say of the committed runs is what those files hold.
"""

import csv
import json
import re
import sys
from pathlib import Path

import pytest

from specdec_lab.prompts import load_prompts

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


# ---- the committed results files: each consistent with itself, and what the pages say of them -------------------
# These read results/, not the code: `specdec-lab bench` itself is tested on tiny runs in tests/test_bench.py.

SHOWDOWNS = sorted((ROOT / "results").glob("showdown-*.json"))


def _saved(name: str) -> dict:
    return json.loads((ROOT / "results" / f"{name}.json").read_text())


def _greedy(run: dict) -> dict:
    """{method: its greedy row over all prompts} of a saved showdown."""
    return {r["method"]: r for r in run["results"] if r["category"] == "all" and r["temperature"] == 0}


@pytest.mark.parametrize("path", SHOWDOWNS, ids=rel)
def test_a_saved_showdown_adds_up(path):
    """What `bench` writes holds together: one row per method, temperature and category; each method's row over all
    prompts is the sum of its categories' rows and covers every prompt of the run; τ = tokens / target passes;
    efficiency = speedup / limit (where recorded); a greedy row sorts every prompt as identical, a tie or a bug; the temperatures are
    the run's. A hand edit or a tool that drops, double-counts or mislabels rows breaks one of them."""
    data = json.loads(path.read_text())
    meta, rows = data["meta"], data["results"]
    assert sorted({r["temperature"] for r in rows}) == sorted(meta["temperatures"])
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = (r["temperature"], r["method"], r.get("batch"))
        assert r["category"] not in groups.setdefault(key, {}), f"two rows for {key}, {r['category']}"
        groups[key][r["category"]] = r
    for key, by in groups.items():
        whole, parts = by.get("all"), [r for c, r in by.items() if c != "all"]
        assert whole is not None, f"{key} has no row over all prompts"
        if whole["skipped"]:
            continue
        assert whole["prompts"] == meta["prompts"], key
        for field in ("prompts", "tokens", "target_calls"):
            assert whole[field] == sum(r[field] for r in parts), (key, field)
    for r in rows:
        if r["skipped"]:
            continue
        assert r["tau"] == pytest.approx(r["tokens"] / r["target_calls"], abs=1e-3), r
        if r.get("limit"):  # runs before the roofline limit was recorded have none
            assert r["efficiency"] == pytest.approx(r["speedup"] / r["limit"], rel=1e-3, abs=1e-3), r
        if r["temperature"] == 0:
            assert r["identical"] + r["ties"] + r["bugs"] == r["prompts"], r
    csv_path = path.with_suffix(".csv")
    if csv_path.exists():
        with open(csv_path, newline="") as f:
            assert len(list(csv.DictReader(f))) == len(rows), f"{rel(csv_path)} and {rel(path)} differ"


def _page(path: str) -> str:
    """A page's text with its wrapped lines and continued commands joined, so a sentence reads as one line."""
    return " ".join((ROOT / path).read_text(encoding="utf-8").replace("\\\n", " ").split())


def test_leaderboards_are_the_committed_runs():
    """The README's short leaderboard and the leaderboards page show the committed results of `specdec-lab bench`,
    which were exact; each page names the command that made the file (tests/test_docs.py regenerates the tables)."""
    data = _saved("showdown-tiny-cpu")
    assert data["meta"]["pair"] == "tiny" and data["meta"]["threads"] == 1
    assert data["meta"]["prompts"] == len(load_prompts()), "the run read the whole prompt suite of today"
    greedy = _greedy(data).values()
    assert all(r["identical"] == r["prompts"] for r in greedy), "every greedy output equal to plain decoding's"
    assert any(r["method"].endswith("(auto)") for r in greedy), "the command ran with --auto"
    readme, page = _page("README.md"), _page("docs/leaderboards.md")
    command = "specdec-lab bench --auto --threads 1 --json results/showdown-tiny-cpu.json"
    assert "<!-- generated: summary results/showdown-tiny-cpu.json -->" in readme and command in readme
    assert "<!-- generated: leaderboard results/showdown-tiny-cpu.json -->" in page and command in page
    two = _saved("showdown-tiny-cpu-2threads")
    assert two["meta"]["threads"] == 2 and two["meta"]["prompts"] == data["meta"]["prompts"]
    assert all(r["identical"] == r["prompts"] for r in _greedy(two).values())
    assert "<!-- generated: leaderboard results/showdown-tiny-cpu-2threads.json -->" in page
    assert "specdec-lab bench --auto --threads 2 --json results/showdown-tiny-cpu-2threads.json" in page


def test_what_the_leaderboards_page_says_of_the_shipped_pair_is_what_the_files_hold():
    """The sentences of docs/leaderboards.md on the shipped pair: the order at one thread, what a second thread
    does, half precision's ties and its Medusa rows, and the batch of 8."""
    page = _page("docs/leaderboards.md")
    one, two = _greedy(_saved("showdown-tiny-cpu")), _greedy(_saved("showdown-tiny-cpu-2threads"))
    speed = {m: r["speedup"] for m, r in one.items()}
    assert max(speed, key=speed.get) == "prompt lookup (10, 3)", "the page says prompt lookup is the fastest"
    drafting = {m: v for m, v in speed.items() if m.startswith(("draft model", "Medusa", "EAGLE"))}
    assert max(drafting, key=drafting.get) == "EAGLE-1, chain γ=4", "and EAGLE-1's chain of those with a model"
    taus = sorted(one, key=lambda m: one[m]["tau"])[-2:]
    assert set(taus) == {"EAGLE-2, dynamic tree", "EAGLE-3, dynamic tree"}, "the default trees keep the most tokens"
    for version in (2, 3):
        tuned = next(m for m in one if m.startswith(f"EAGLE-{version}, tree") and m.endswith("(auto)"))
        assert speed[tuned] > speed[f"EAGLE-{version}, dynamic tree"], "the tuned trees are faster"
    assert speed["Medusa, 24-node tree"] < 1
    rates = (f"({two['target only']['tokens_per_s']:.1f} tokens/s here, {one['target only']['tokens_per_s']:.1f} "
             "at one thread)")
    assert rates in page, rates
    assert all(two[m]["speedup"] > one[m]["speedup"] for m in two.keys() & one.keys() if m != "target only"), (
        "the page says every method gains more at two threads")
    half = {dtype: _greedy(_saved(f"showdown-tiny-cpu-{dtype}")) for dtype in ("bfloat16", "float16")}
    assert all(r["bugs"] == 0 for rows in half.values() for r in rows.values()), "the page says no mismatch is a bug"
    medusa = f"(τ {half['bfloat16']['Medusa, 24-node tree']['tau']:.2f} in bfloat16, against " \
             f"{one['Medusa, 24-node tree']['tau']:.2f} in fp32"
    assert medusa in page, medusa
    batch = _saved("batch8-tiny-cpu")
    rows = [r for r in batch["results"] if r["temperature"] == 0 and r["batch"] == 8 and r["method"] != "target only"]
    assert rows and all(r["speedup"] < 1 and r["identical"] == r["prompts"] for r in rows)
    assert "<!-- generated: batch results/batch8-tiny-cpu.json -->" in page
    assert "specdec-lab bench --batch 8 --threads 1 --json results/batch8-tiny-cpu.json" in page


def test_leaderboard_of_the_real_model_is_the_committed_run():
    """The leaderboards page's table for SmolLM2-135M-Instruct comes from the committed `bench --target` run, which
    was exact: every greedy output equal to plain decoding's in the same precision, or parted from it at a tie (bf16)."""
    data = _saved("showdown-smollm2-135m-instruct-cpu")
    assert data["meta"]["pair"] == "smollm2-135m-instruct"
    greedy = [r for r in data["results"] if r["temperature"] == 0 and r["category"] == "all"]
    assert {"EAGLE-2, dynamic tree", "EAGLE-3, dynamic tree"} <= {r["method"] for r in greedy}
    ran = [r for r in greedy if not r["skipped"]]
    assert all(r["prompts"] == data["meta"]["prompts"] and r["bugs"] == 0 for r in ran)
    if data["meta"]["dtype"] == "float32":  # exact: no ties either
        assert all(r["identical"] == r["prompts"] for r in ran)
    page = _page("docs/leaderboards.md")
    assert "<!-- generated: leaderboard results/showdown-smollm2-135m-instruct-cpu.json -->" in page
    assert "--json results/showdown-smollm2-135m-instruct-cpu.json" in page


def test_figures_of_the_cpu_roofline_are_the_committed_run():
    """The leaderboards page's v(n) ranges and step times for the real model come from `tools/cpu_roofline.py`'s
    saved run."""
    run = _saved("roofline-cpu")
    page = _page("docs/leaderboards.md")

    def v_range(dtype):  # the pass over 2 to 11 tokens, in steps, over both thread counts
        vs = [v for t in run["threads"].values() for n, v in t["dtypes"][dtype]["v"].items() if 1 < int(n) <= 11]
        return f"{min(vs):.2f}-{max(vs):.2f}"

    two = run["threads"]["2"]["dtypes"]
    assert f"{v_range('bfloat16')} steps in bf16, against {v_range('float32')} in fp32" in page
    assert f"({two['bfloat16']['step_ms']:.1f} against {two['float32']['step_ms']:.1f} ms at two threads" in page


def test_figures_of_the_real_model_at_one_thread_on_amd_and_under_avx2_are_the_committed_runs():
    """The leaderboards page shows the committed greedy runs at one thread, on an AMD EPYC and with the math libraries
    held to AVX2 (a simulation, in fp32), and its sentences on them quote those files: the order they measured, AMD's
    rates and rounds, and the AVX2 run's pass costs."""
    page = _page("docs/leaderboards.md")
    tree = "EAGLE-2, dynamic tree of 6, depth 3"
    intel = _greedy(_saved("showdown-smollm2-135m-instruct-cpu"))
    for name in ("1thread", "amd", "avx2sim"):
        file = f"results/showdown-smollm2-135m-instruct-cpu-{name}.json"
        run = json.loads((ROOT / file).read_text())
        assert all(r["bugs"] == 0 for r in run["results"] if not r["skipped"]), file
        assert f"<!-- generated: leaderboard {file} -->" in page and f"--json {file}" in page
        greedy = _greedy(run)
        if name == "1thread":
            assert run["meta"]["threads"] == 1 and run["meta"]["dtype"] == "bfloat16"
        elif name == "amd":
            assert run["meta"]["cpu"] == "AMD EPYC (native bf16)" and run["meta"]["dtype"] == "bfloat16"
            rates = f"({greedy['target only']['tokens_per_s']:.1f} against {intel['target only']['tokens_per_s']:.1f} tokens/s)"
            rounds = f"({greedy[tree]['tau'] / greedy[tree]['limit']:.2f} steps against {intel[tree]['tau'] / intel[tree]['limit']:.2f}"
            assert rates in page and rounds in page, (rates, rounds)
            assert greedy[tree]["speedup"] < intel[tree]["speedup"], "the page says the same drafts buy less there"
        else:
            assert run["meta"]["dtype"] == "float32" and "simulated: ONEDNN_MAX_CPU_ISA=AVX2" in run["meta"]["cpu"]
            assert all(r["speedup"] < 1 and r["identical"] == r["prompts"] for m, r in greedy.items()
                       if m != "target only"), "the page says every method is slower there, and every output identical"
    speed = {m: r["speedup"] for m, r in intel.items() if not r["skipped"]}
    assert max(speed, key=speed.get) == tree, "the page says the 6-node tree is the fastest"
    assert max(intel, key=lambda n: intel[n]["tau"] or 0) == "EAGLE-2, dynamic tree", "and the 24-node tree's τ"
    by = {(r["method"], r["category"]): r["speedup"] for r in _saved("showdown-smollm2-135m-instruct-cpu")["results"]
          if r["temperature"] == 0}
    for lookup in ("prompt lookup (10, 3)", "HF prompt lookup, 10"):
        assert max(("chat", "code", "rewrite"), key=lambda c: by[lookup, c]) == "rewrite", "lookups gain most on rewrites"
    sim = _saved("roofline-cpu-avx2sim")
    assert "simulated: ONEDNN_MAX_CPU_ISA=AVX2" in sim["cpu"] and sim["decoding_dtype"] == "torch.float32"
    vs = [v for t in sim["threads"].values() for n, v in t["dtypes"]["float32"]["v"].items() if 1 < int(n) <= 5]
    assert f"pass over 2 to 5 tokens cost {min(vs):.2f}-{max(vs):.2f} steps at one or two threads" in page
