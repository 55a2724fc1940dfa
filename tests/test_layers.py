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
import re
from pathlib import Path

import pytest

import specdec_lab

PACKAGE = Path(specdec_lab.__file__).parent
LAYERS = {
    "core": {"checks", "precision", "masks", "lm", "ragged", "sampling", "economics", "tree", "vocab"},
    "methods": {"draft_models", "training", "weights", "drafters", "ngram", "medusa", "eagle"},
    "loops": {"decoding", "lookahead", "serving"},
    "tools": {"zoo", "prompts", "chat", "measure", "identity", "tune", "train_heads", "train_zoo", "engines", "bench",
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


def test_the_contributors_page_lists_every_module_in_its_layer():
    """docs/contributing.md names each layer's modules, so a reader can find where a module sits; a module added,
    moved or removed here and not there fails (layer sizes are not written down, so a harmless edit never does)."""
    page = (PACKAGE.parent / "docs" / "contributing.md").read_text(encoding="utf-8")
    items = dict(re.findall(r"^- \*\*(\w+)\*\*, (.*?)(?=^- |^$)", page, re.MULTILINE | re.DOTALL))
    # the modules: the names in backquotes after the colon, up to the sentence's end, asides in brackets left out
    listed = {layer: set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", text.split(":", 1)[1]).split(".")[0]))
              for layer, text in items.items() if layer in LAYERS}
    assert listed == LAYERS, "docs/contributing.md's list of layers differs from LAYERS: " + "; ".join(
        f"{layer}: the page lacks {sorted(LAYERS[layer] - listed.get(layer, set()))} and has "
        f"{sorted(listed.get(layer, set()) - LAYERS[layer])} besides" for layer in LAYERS
        if listed.get(layer) != LAYERS[layer])
