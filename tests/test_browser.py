"""The widgets and the exercise workflow as a learner meets them: JupyterLab driven by headless Chromium.

Starts JupyterLab on 127.0.0.1 (a free port, no token) in a temporary folder with three small generated
notebooks, opens them in Debian's Chromium through Playwright (the system browser: no browser download, and
every request that leaves 127.0.0.1 is refused) and checks:

- the economics explorer (chapter 02) and the tree explorer (chapter 04) render as widgets, not as their text
  form; moving a slider changes their text and their plot;
- the tree explorer's "run the real pair" button shows that it is busy, then a measured τ and
  "identical to greedy: True";
- the round stepper (chapter 03) renders as a widget on the real pair, and its "next round" button moves it to
  the next round of the same text: its status, its words and its bars change;
- exercise 02.1 as a learner does it: the grader fails on the stub with its hint first and no grading code
  shown, then passes once the solution is typed into the exercise cell;
- the browser console shows no error other than resources refused offline.

Marked `browser`; skipped (with the reason) where Chromium or Playwright is missing, and failed instead when CI
is set, since .ci/run installs both. The server it starts is stopped by its process id at the end.
Run alone: pytest -m browser
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("SPECDEC_CHROMIUM", "/usr/bin/chromium")
SLOW = 180_000  # ms: loading the pair and running it on two busy cores
pytestmark = pytest.mark.browser


def _missing() -> str | None:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium; or set SPECDEC_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install playwright; its own browser download is not needed)"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test, but: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


# ---- JupyterLab, started and stopped here -------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """Every descendant of pid (the kernels run in sessions of their own, so killpg does not reach them)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server by its process id: its kernels and its process group, politely, then for sure."""
    kernels = _children(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in kernels:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, sig)  # started with start_new_session=True: the group is the server's own
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def _notebook(cells: list[str]):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _exercise_cells() -> tuple[list[str], str]:
    """Exercise 02.1 (expected_tokens): its import cell, stub and grader, and the solution a learner types."""
    code = lambda path: [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    exercise, solution = code(ROOT / "exercises/02_speedup_economics.ipynb"), code(ROOT / "solutions/02_speedup_economics.ipynb")
    stub = next(i for i, s in enumerate(exercise) if "raise NotImplementedError" in s)
    assert "grading.check_expected_tokens" in exercise[stub + 1], "exercise 02.1 moved: update this test"
    typed = "\n".join(line for line in solution[stub].splitlines() if "### " not in line)
    return exercise[stub - 1: stub + 2], typed


@pytest.fixture(scope="module")
def lab(browser, tmp_path_factory):
    """(url, folder): JupyterLab serving a temporary folder with explorers.ipynb, stepper.ipynb and exercise.ipynb."""
    folder = tmp_path_factory.mktemp("lab")
    nbformat.write(_notebook([
        "from specdec_lab import widgets, zoo\nfrom specdec_lab.prompts import load_prompts\n\nwidgets.explorer()",
        'pair = zoo.load_pair("tiny")\nwidgets.tree_explorer(pair=pair, prompts=load_prompts("edit")[:2], max_new_tokens=24)',
    ]), folder / "explorers.ipynb")
    nbformat.write(_notebook([
        'from specdec_lab import widgets, zoo\n\ntarget, draft, tok = zoo.load_pair("tiny")\n'
        'widgets.round_stepper(target, draft, "def add(a, b):\\n    ", gamma=3, temperature=0.8, tokenizer=tok, '
        'max_new_tokens=24)',
    ]), folder / "stepper.ipynb")
    cells, _ = _exercise_cells()
    nbformat.write(_notebook(cells), folder / "exercise.ipynb")
    news = folder / ".settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no "get Jupyter news?" toast, offline
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(folder / ".config"), "JUPYTER_RUNTIME_DIR": str(folder / ".runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(folder / ".settings"), "JUPYTERLAB_WORKSPACES_DIR": str(folder / ".workspaces"),
           "IPYTHONDIR": str(folder / ".ipython"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.password=",
         f"--ServerApp.root_dir={folder}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly",
         "--ServerApp.terminals_enabled=False"] + (["--allow-root"] if os.geteuid() == 0 else []),
        cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{(folder / 'server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"JupyterLab did not answer in 120 s:\n{(folder / 'server.log').read_text()[-3000:]}")
        yield url, folder
    finally:
        _stop(proc)
        log.close()


@pytest.fixture
def page(browser, lab):
    """A fresh page that may reach 127.0.0.1 only; collects console errors into page.errors."""
    url, _ = lab
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.errors, pg.refused = [], []
    pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))
    pg.on("pageerror", lambda e: pg.errors.append(f"page error: {e}"))

    def offline(route):
        if route.request.url.startswith(url):
            route.continue_()
        else:
            pg.refused.append(route.request.url)
            route.abort()

    pg.route("**/*", offline)
    yield pg
    context.close()


def _open(page, lab, name: str):
    url, _ = lab
    page.goto(f"{url}/lab/tree/{name}?reset")  # reset: no tabs restored from an earlier page
    _cells(page).first.wait_for(timeout=60_000)
    # the kernel has started and connected (a cell run before that is dropped)
    page.locator(".jp-StatusBar-Widget").get_by_text(re.compile(r"\| Idle$")).wait_for(timeout=120_000)


def _cells(page):
    return page.locator(".jp-Notebook:visible .jp-Cell")


def _run_cell(page, index: int):
    """Click into cell `index` and press Shift+Enter, as a learner does."""
    cell = _cells(page).nth(index)
    cell.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    return cell


def _wait_done(cell, timeout=SLOW):
    """Wait until the cell has run: its prompt shows a number, not [*] or [ ]."""
    cell.locator(".jp-InputArea-prompt").filter(has_text=re.compile(r"\[\d+\]")).wait_for(timeout=timeout)


def _offline_only(page) -> list[str]:
    """Console errors other than a resource refused offline (the route above aborts every outside request)."""
    offline = ("net::ERR_FAILED", "net::ERR_INTERNET_DISCONNECTED", "net::ERR_NAME_NOT_RESOLVED")
    return [e for e in page.errors if not (e.startswith("Failed to load resource") and any(o in e for o in offline))]


def _assert_widget(cell, what: str):
    out = cell.locator(".jp-Cell-outputArea")
    out.locator(".jp-OutputArea-output").first.wait_for(timeout=SLOW)
    _wait_done(cell)
    text = out.inner_text()
    assert "VBox(children" not in text and "Run this cell in a live kernel" not in text, (
        f"the {what} rendered as text, not as a widget:\n{text[:300]}")
    out.locator(".widget-slider").first.wait_for(timeout=30_000)
    return out


def _slide(out, index: int, steps: int = 1):
    """Move slider `index` of a widget output with the keyboard, as a learner can."""
    handle = out.locator(".widget-slider .noUi-handle").nth(index)
    handle.focus()
    for _ in range(steps):
        handle.press("ArrowRight")


def _changes(read, before: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = read()
        if now != before:
            return now
        time.sleep(0.2)
    raise AssertionError(f"nothing changed in {timeout} s: still {before[:200]!r}")


def test_explorers_render_and_respond(page, lab):
    _open(page, lab, "explorers.ipynb")

    # chapter 02: the economics explorer
    cell = _run_cell(page, 0)
    out = _assert_widget(cell, "economics explorer")
    text, plot = out.locator(".widget-html-content").first, out.locator(".widget-output img").first
    plot.wait_for(timeout=SLOW)
    words, picture = text.inner_text(), plot.get_attribute("src")
    assert "tokens per target pass" in words and "3.36" in words, words  # α = 0.8, γ = 4
    _slide(out, 0, 5)  # α 0.80 -> 0.85
    words2 = _changes(text.inner_text, words)
    assert "3.36" not in words2 and "tokens per target pass" in words2, words2
    _changes(lambda: plot.get_attribute("src"), picture)

    # chapter 04: the tree explorer, with the real pair
    cell = _run_cell(page, 1)
    out = _assert_widget(cell, "tree explorer")
    text, plot = out.locator(".widget-html-content").first, out.locator(".widget-output img").first
    plot.wait_for(timeout=SLOW)
    words, picture = text.inner_text(), plot.get_attribute("src")
    assert "tree [2, 2, 1, 1]" in words, words
    _slide(out, 1)  # depth 4 -> 5
    words2 = _changes(text.inner_text, words)
    assert "tree [2, 2, 1, 1, 1]" in words2, words2
    _changes(lambda: plot.get_attribute("src"), picture)

    button = out.locator("button", has_text="run the real pair")
    seen = []
    page.expose_function("buttonSeen", lambda t, disabled: seen.append((t, disabled)))
    button.evaluate("b => new MutationObserver(() => window.buttonSeen(b.innerText, b.disabled))"
                    ".observe(b, {attributes: true, childList: true, subtree: true, characterData: true})")
    button.click()
    result = out.locator(".widget-html-content", has_text="measured τ")
    result.wait_for(timeout=SLOW)
    measured = result.inner_text()
    assert re.search(r"measured τ \d+\.\d\d, predicted \d+\.\d\d", measured), measured
    assert "identical to greedy: True" in measured, measured
    assert any("running" in t and disabled for t, disabled in seen), f"no busy state on the button: {seen}"
    page.wait_for_function("b => !b.disabled", arg=button.element_handle(), timeout=30_000)
    assert button.inner_text().strip() == "run the real pair"

    assert not _offline_only(page), f"console errors: {_offline_only(page)}"


def test_round_stepper_renders_and_steps(page, lab):
    _open(page, lab, "stepper.ipynb")
    cell = _run_cell(page, 0)
    out = cell.locator(".jp-Cell-outputArea")
    button = out.locator("button", has_text="next round")
    button.wait_for(timeout=SLOW)
    _wait_done(cell)
    assert "Run this cell in a live kernel" not in out.inner_text(), "the stepper rendered as text, not as a widget"
    status = out.locator(".widget-html-content", has_text="new tokens so far").first
    words = out.locator(".widget-html-content pre").first
    plot = out.locator(".widget-output img").first
    plot.wait_for(timeout=SLOW)
    before, said, picture = status.inner_text(), words.inner_text(), plot.get_attribute("src")
    assert before.startswith("round 1:") and said.startswith("round 1: text of"), (before, said)
    assert "target cache 0 →" in said and "draft cache 0 →" in said, said
    button.click()
    after = _changes(status.inner_text, before)
    assert after.startswith("round 2:"), after
    said2 = _changes(words.inner_text, said)
    assert said2.startswith("round 2: text of") and "target cache 0 →" not in said2, said2
    _changes(lambda: plot.get_attribute("src"), picture)
    assert not _offline_only(page), f"console errors: {_offline_only(page)}"


def test_exercise_fails_with_its_hint_then_passes(page, lab):
    _, typed = _exercise_cells()
    _open(page, lab, "exercise.ipynb")
    _wait_done(_run_cell(page, 0))
    _wait_done(_run_cell(page, 1))
    grader = _run_cell(page, 2)
    error = grader.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    error.wait_for(timeout=SLOW)
    lines = [line for line in error.inner_text().splitlines() if line.strip()]
    assert "expected_tokens is not implemented yet" in lines[0], f"the hint is not first:\n{lines}"
    assert len(lines) <= 3 and not any(re.search(r"grading[/\\]\w+\.py", line) for line in lines), (
        f"grading frames shown:\n{lines}")

    # type the solution into the exercise cell, run it, then the grader again
    editor = _cells(page).nth(1).locator(".cm-content")
    editor.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.insert_text(typed)
    page.keyboard.press("Shift+Enter")
    _wait_done(_cells(page).nth(1))
    page.keyboard.press("Shift+Enter")  # the grader is now the active cell
    grader.locator(".jp-OutputArea-output", has_text="PASS").wait_for(timeout=SLOW)
    assert "not implemented" not in grader.locator(".jp-Cell-outputArea").inner_text()

    assert not _offline_only(page), f"console errors: {_offline_only(page)}"
