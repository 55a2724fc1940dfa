"""The package reads downward: every module imports only modules of its own layer or of the layers below it, and no
import circle exists, function-level imports included (read from the source, so an import inside a function that a
test never calls still counts).

    core     the math and the model adapter: argument checks, precision, masks, lm, sampling, economics, tree, vocab
    methods  what proposes: the drafters, with concrete settings only (a tuner builds tuned ones from above), and
             the loop that trains them on a frozen target's states
    loops    what decodes: generate, lookahead, the batched loop
    tools    the models and prompts the course runs on, and what measures, tunes, trains, benchmarks, grades and
             draws; the command line

A learner reading a module finds below it everything it uses; a method never times, tunes or decodes.
"""
import ast
from pathlib import Path

import pytest

import specdec_lab

PACKAGE = Path(specdec_lab.__file__).parent
LAYERS = {
    "core": {"checks", "precision", "masks", "lm", "ragged", "sampling", "economics", "tree", "vocab"},
    "methods": {"draft_models", "training", "drafters", "ngram", "medusa", "eagle"},
    "loops": {"decoding", "lookahead", "serving"},
    "tools": {"zoo", "prompts", "chat", "measure", "identity", "tune", "heads", "train_zoo", "engines", "bench",
              "widgets", "viz", "grading", "lineup", "report", "__main__", "__init__"},
}
RANK = {module: rank for rank, modules in enumerate(LAYERS.values()) for module in modules}


def _name(path: Path) -> str:
    """A module's name in LAYERS: its file name, or 'grading' for the graders' package."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """The package's modules that `path` imports anywhere in its source (`from specdec_lab import lm`,
    `from specdec_lab.tree import X`, `import specdec_lab.eagle`); a name from the package root is '__init__'."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path.name}: write imports in full (from specdec_lab.x import y), as the rest do")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "specdec_lab":
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:
                for alias in node.names:
                    is_module = (PACKAGE / f"{alias.name}.py").exists() or (PACKAGE / alias.name).is_dir()
                    found.add(alias.name if is_module else "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "specdec_lab":
                    found.add(parts[1] if len(parts) > 1 else "__init__")
    return found


GRAPH: dict[str, set[str]] = {}
for _path in sorted(PACKAGE.rglob("*.py")):
    GRAPH.setdefault(_name(_path), set()).update(_imports(_path))
for _module in GRAPH:
    GRAPH[_module].discard(_module)


def test_every_module_has_a_layer():
    assert set(GRAPH) == set(RANK), (f"give these modules a layer in LAYERS: {sorted(set(GRAPH) - set(RANK))}; "
                                     f"no longer in the package: {sorted(set(RANK) - set(GRAPH))}")


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_only_go_down(module):
    upward = sorted(m for m in GRAPH[module] if RANK[m] > RANK[module])
    layer = list(LAYERS)[RANK[module]]
    assert not upward, (f"{module} ({layer}) imports {', '.join(f'{m} ({list(LAYERS)[RANK[m]]})' for m in upward)}: "
                        "move the code that needs it up, or what it needs down")


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` ({module: modules it imports}), as a path that ends where it starts, or None."""
    state: dict[str, str] = {}  # "open" while on the search path, "done" once every path from it was searched

    def search(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := search(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return None

    return next((c for m in sorted(graph) if m not in state and (c := search(m, [m]))), None)


def test_no_import_circle():
    circle = _circle(GRAPH)
    assert circle is None, "an import circle: " + " -> ".join(circle)


def test_the_checker_sees_function_level_imports_and_circles(tmp_path):
    """The reader finds imports inside functions (the old circle: drafters -> tune -> drafters), and the search
    finds that circle and a longer one."""
    source = tmp_path / "x.py"
    source.write_text("import specdec_lab.lm\ndef f():\n    from specdec_lab import tune, generate\n"
                      "    from specdec_lab.decoding import Generation\n")
    assert _imports(source) == {"lm", "tune", "__init__", "decoding"}
    assert RANK["tune"] > RANK["drafters"] and RANK["decoding"] > RANK["eagle"]
    assert _circle({"drafters": {"tune"}, "tune": {"drafters", "lm"}, "lm": set()}) == ["drafters", "tune", "drafters"]
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_generate_fits_one_screen():
    """The loop a learner reads first stays one screen: at most 40 lines of `generate`, its docstring aside."""
    fn = next(n for n in ast.parse((PACKAGE / "decoding.py").read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name == "generate")
    doc = fn.body[0]
    lines = fn.end_lineno - fn.lineno + 1 - (doc.end_lineno - doc.lineno + 1)
    assert lines <= 40, f"generate is {lines} lines without its docstring: move a step into a helper of its own"


def layer_lines() -> dict[str, int]:
    """{layer: lines of its modules' source}."""
    return {layer: sum(len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(PACKAGE.rglob("*.py"))
                       if _name(p) in modules) for layer, modules in LAYERS.items()}


def test_the_readme_says_how_long_each_layer_is():
    """The README's reading guide gives each layer's length, to the nearest hundred lines."""
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    lines = layer_lines()
    told = {layer: f"{round(n, -2):,} lines" for layer, n in lines.items()}
    read = lines["core"] + lines["methods"] + lines["loops"]
    missing = [f"{layer}: {text}" for layer, text in told.items() if f"({text}" not in readme]
    assert not missing and f"about {round(read, -2):,} lines" in readme, (
        f"update the README's package paragraph: the layers now hold {told}, the first three about "
        f"{round(read, -2):,} lines")
