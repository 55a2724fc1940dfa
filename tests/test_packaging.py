"""pyproject.toml, environment.yml and the README agree with each other and with CI."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_lab import REPO_URL

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


DEV_TOOLS = {"jupyterlab", "nbval", "nbclient", "nbformat", "pytest", "pytest-xdist", "playwright"}


def _norm(req: str) -> tuple[str, str]:
    name, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", req).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_environment_yml_lists_core_and_dev_dependencies():
    core, dev = _project()["dependencies"], _project()["optional-dependencies"]["dev"]
    env = (ROOT / "environment.yml").read_text()
    pip_block = env.split("- pip:", 1)[1]
    env_deps = [line.strip()[2:] for line in pip_block.splitlines() if line.strip().startswith("- ")]
    assert sorted(map(_norm, env_deps)) == sorted(map(_norm, core + dev)), (
        "environment.yml must list pyproject.toml's dependencies and its [dev] extra: edit them together")


def test_core_dependencies_hold_no_dev_tools():
    core = {name for name, _ in map(_norm, _project()["dependencies"])}
    dev = {name for name, _ in map(_norm, _project()["optional-dependencies"]["dev"])}
    assert not core & DEV_TOOLS, f"{sorted(core & DEV_TOOLS)} belong in [dev], not in the core dependencies"
    assert dev == DEV_TOOLS


def test_plain_install_pulls_no_dev_tools(tmp_path):
    """`pip install .` installs the built metadata's Requires-Dist without an extra, then theirs: neither the
    package's own nor (as far as they are installed here) its dependencies' hold a dev tool (jupyterlab, nbval,
    pytest...)."""
    pytest.importorskip("setuptools.build_meta")
    from email.parser import Parser
    from importlib import metadata

    from packaging.requirements import Requirement

    # the metadata pip reads before it installs (setuptools' prepare_metadata_for_build_wheel, under a second)
    code = "import setuptools.build_meta as b, sys; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()[-1]
    meta = Parser().parsestr((tmp_path / out / "METADATA").read_text())

    def pulled(requires):  # the requirements that apply without any extra
        reqs = map(Requirement, requires or [])
        return {r.name.lower().replace("_", "-") for r in reqs if not r.marker or r.marker.evaluate({"extra": ""})}

    direct = pulled(meta.get_all("Requires-Dist"))
    assert direct == {name for name, _ in map(_norm, _project()["dependencies"])}
    seen, todo = set(), set(direct)
    while todo:
        name = todo.pop()
        seen.add(name)
        try:
            if name == "widgetsnbextension" and metadata.version(name).startswith("3."):
                continue  # an ipywidgets 7 already installed (Colab's) keeps the classic notebook's extension, which
                # pulls the notebook server; a fresh install resolves ipywidgets 8, whose extension needs nothing
            todo |= pulled(metadata.requires(name)) - seen
        except metadata.PackageNotFoundError:
            pass
    assert not seen & DEV_TOOLS, f"`pip install .` pulls {sorted(seen & DEV_TOOLS)}"


def test_every_module_imports_without_the_dev_tools():
    """A module that needs a dev tool imports it where it is used, so that a plain install works (a few seconds)."""
    code = f"""
import importlib, importlib.machinery, pkgutil, sys
class Refuse:  # found (transformers 4.x probes for pytest with find_spec at import) but never imported
    def create_module(self, spec):
        raise ImportError(spec.name + " is a [dev] tool")
    def exec_module(self, module):
        pass
class NoDevTools:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {sorted(DEV_TOOLS | {"_pytest", "xdist"})!r}:
            return importlib.machinery.ModuleSpec(name, Refuse())
sys.meta_path.insert(0, NoDevTools())
import specdec_lab
for m in pkgutil.walk_packages(specdec_lab.__path__, "specdec_lab."):
    importlib.import_module(m.name)
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


def test_transformers_range_has_both_bounds():
    spec = dict(map(_norm, _project()["dependencies"]))["transformers"]
    assert ">=" in spec and "<" in spec.replace("<=", "<")


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    install = re.findall(r"^    \$ (pip install .*)$", readme, re.M)
    test = re.findall(r"^    \$ (pytest.*)$", readme, re.M)
    assert len(install) == 1 and len(test) == 1, "README must show exactly one install and one test command"
    assert '".[dev]"' in install[0], "the test command needs the [dev] tools (pytest, nbval, ...)"
    script = (ROOT / ".ci" / "run").read_text()
    assert "eval \"$install_cmd\"" in script and "eval \"$test_cmd\"" in script
    # the CI script extracts exactly those two commands
    out = subprocess.run(["sed", "-n", r"s/^    \$ \(pip install .*\)$/\1/p", str(ROOT / "README.md")],
                         capture_output=True, text=True).stdout.strip()
    assert out == install[0]


def test_readme_badges_point_at_the_repository():
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    readme = (ROOT / "README.md").read_text()
    badges = re.findall(r"colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/main/(\S+?\.ipynb)", readme)
    assert badges, "README has no Open-in-Colab badges"
    for repo, path in badges:
        assert repo == owner_repo, f"README badge for {path} points at {repo}, REPO_URL says {owner_repo}"
        assert (ROOT / path).exists(), f"README badge points at {path}, which does not exist"


def test_the_lowest_versions_slice_names_test_files_that_exist():
    """tools/lowest.sh runs a list of test files under the lowest versions; a renamed file would leave it with
    nothing to run (pytest exits 5 and CI fails only at its very end)."""
    script = (ROOT / "tools" / "lowest.sh").read_text()
    files = re.findall(r"tests/test_\w+\.py", script)
    assert files and all((ROOT / f).exists() for f in files), [f for f in files if not (ROOT / f).exists()]
