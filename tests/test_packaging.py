"""pyproject.toml, environment.yml and the README agree with each other and with CI."""

import re
import subprocess
from pathlib import Path

import pytest

from specdec_lab import REPO_URL

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> tuple[str, str]:
    name, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", req).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = (ROOT / "environment.yml").read_text()
    pip_block = env.split("- pip:", 1)[1]
    env_deps = [line.strip()[2:] for line in pip_block.splitlines() if line.strip().startswith("- ")]
    assert sorted(map(_norm, env_deps)) == sorted(map(_norm, deps)), (
        "environment.yml and pyproject.toml list different dependencies: edit both together")


def test_transformers_range_has_both_bounds():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = dict(map(_norm, deps))["transformers"]
    assert ">=" in spec and "<" in spec.replace("<=", "<")


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    install = re.findall(r"^    \$ (pip install .*)$", readme, re.M)
    test = re.findall(r"^    \$ (pytest.*)$", readme, re.M)
    assert len(install) == 1 and len(test) == 1, "README must show exactly one install and one test command"
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
