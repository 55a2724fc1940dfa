"""tools/test_times.py: a junit report summed per test file and per notebook, slowest items first."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("test_times", ROOT / "tools" / "test_times.py")
test_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(test_times)

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_tree" name="test_a" time="2.5"/>
<testcase classname="tests.test_tree" name="test_b[x]" time="1.0"/>
<testcase classname="notebooks.08_showdown.ipynb" name="Cell 4" time="30.0"/>
<testcase classname="notebooks.08_showdown.ipynb" name="Cell 5" time="0.5"/>
<testcase classname="solutions.10_capstone.ipynb" name="Cell 3" time="4.0"/>
</testsuite></testsuites>"""


def test_sums_per_file_and_notebook_and_orders_items(tmp_path, capsys):
    path = tmp_path / "times.xml"
    path.write_text(REPORT)
    per_file, items = test_times.times(str(path))
    assert per_file == {"tests/test_tree.py": 3.5, "notebooks/08_showdown.ipynb": 30.5,
                        "solutions/10_capstone.ipynb": 4.0}
    assert [s for s, _ in items] == [30.0, 4.0, 2.5, 1.0, 0.5]
    assert items[0][1] == "notebooks/08_showdown.ipynb::Cell 4"
    test_times.main([str(path), "--top", "2"])
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "38 s over all workers (0.6 min), 5 items"
    assert "the 2 slowest items:" in out and "test_b" not in out
