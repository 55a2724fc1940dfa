"""Shared test settings, the lines that tell a learner how to run less than everything, and the order in which
pytest-xdist hands out the work (longest notebooks first, so two workers finish together)."""
import json
import os
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch


# Test files share models and checks through tests/helpers.py (`from helpers import ...`). pytest's default
# import mode puts this folder on sys.path already; saying it here keeps that true under any import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers  # noqa: E402

# Two pytest workers share the machine's cores with the Jupyter kernels and commands they start. A process with
# several torch threads next to a busy one waits at every operation for a thread that is not running: with both
# cores busy, 48 tokens of greedy decoding took 3 to 4 s on 2 threads against 0.6 to 0.8 s on 1. So every process
# the tests start gets one thread, like the tests themselves (`one_thread` below), unless OMP_NUM_THREADS says
# otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")

FAST = 'pytest tests -m "not browser"'
HINT = (f"only the fast unit tests (about 6 minutes on 2 cores): {FAST}  ·  the browser test alone: pytest -m browser  ·  "
        "one notebook: pytest notebooks/02_speedup_economics.ipynb")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and kinder to whatever else runs on the machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", name="small_vocab_pair")
def small_vocab_pair_fixture():
    """helpers.small_vocab_pair(), once per worker (the loops' sampling tests share it)."""
    return helpers.small_vocab_pair()


@pytest.fixture(scope="session")
def pair():
    """(target, draft, tokenizer): the zoo pair on the CPU in fp32, loaded once per pytest worker. Tests may not
    change it; a file that needs another pair (random models, another device or dtype) defines its own `pair`."""
    from specdec_lab import zoo

    return zoo.load_pair("tiny", device="cpu")


def pytest_report_header(config):
    return [HINT]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After a run that replayed notebooks (the long one), say again how to run only the fast tests."""
    reports = [r for reports in terminalreporter.stats.values() for r in reports if hasattr(r, "nodeid")]
    if any(r.nodeid.split("::")[0].endswith(".ipynb") for r in reports):
        terminalreporter.write_line(HINT)


# The longest test files, in seconds within the whole test command on a 2-core AMD EPYC with native bf16 (a clean
# clone, `pytest --junitxml=times.xml`, then `python tools/test_times.py times.xml`; rounded). Files not listed take a
# few seconds or less. Only the order they give matters.
TEST_SECONDS = {"test_real_model.py": 141, "test_exactness.py": 67, "test_notebooks.py": 60, "test_bench.py": 40,
                "test_grading_03.py": 36, "test_browser.py": 34, "test_decoding.py": 22, "test_grading_11.py": 22,
                "test_sampling.py": 21, "test_tune.py": 19, "test_eagle.py": 18, "test_chat.py": 15,
                "test_identity.py": 15, "test_architectures.py": 14, "test_grading_10.py": 13}


def _recorded_seconds(path: Path) -> float:
    """How long a notebook took when its outputs were committed (from the execution times nbclient records)."""
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return 0.0
    total = 0.0
    for cell in cells:
        run = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in run and "shell.execute_reply" in run:
            start, end = (datetime.fromisoformat(run[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            total += (end - start).total_seconds()
    return total


def pytest_collection_modifyitems(session, config, items):
    """Longest work first, so that the two workers finish together: notebooks by their recorded run time, test
    files by TEST_SECONDS (the rest last, in their own order). With `--dist loadfile --no-loadscope-reorder` each
    file stays whole on one worker, taken in this order."""
    cost = {}
    for item in items:
        path = Path(str(item.path))
        if path not in cost:
            cost[path] = _recorded_seconds(path) if path.suffix == ".ipynb" else TEST_SECONDS.get(path.name, 0.0)
    order = {path: i for i, path in enumerate(cost)}
    items.sort(key=lambda item: (-cost[Path(str(item.path))], order[Path(str(item.path))]))
