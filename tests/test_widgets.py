"""specdec_lab.widgets: the explorer builds and updates, and the static fallback draws the same numbers."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from specdec_lab import economics, measure, widgets  # noqa: E402


def test_summary_matches_economics():
    s = widgets.summary(0.8, 4, 0.05, 64)
    m = economics.QWEN25_7B_ON_H100
    assert s["tokens_per_pass"] == economics.expected_tokens(0.8, 4)
    assert s["speedup_free_verify"] == economics.speedup(0.8, 4, 0.05)
    assert s["speedup_at_batch"] == pytest.approx(m.speedup(0.8, 4, 0.05, 64))
    assert s["best_gamma_free_verify"] == economics.optimal_gamma(0.8, 0.05, 16)
    assert s["best_gamma_at_batch"] == 3


def test_explorer_updates_its_numbers():
    box = widgets.explorer()
    (alpha, gamma), (c, batch) = box.children[0].children, box.children[1].children
    text = box.children[2]
    assert "3.36" in text.value and "2.80×" in text.value  # α 0.8, γ 4, c 0.05
    batch.value = 256
    assert "0.90×" in text.value and "batch 256" in text.value
    alpha.value = 0.0
    assert "<b>1.00</b> tokens per target pass" in text.value and "<b>0</b>" in text.value
    plt.close("all")


def test_speedup_grid_has_one_panel_per_batch_and_c():
    fig = widgets.speedup_grid(batches=(1, 128), cs=(0.05, 0.15), alphas=(0.7, 0.9), max_gamma=8)
    assert len(fig.axes) == 4
    ax = fig.axes[0]  # batch 1, c = 0.05: the plain formula (verification is free at batch 1)
    ys = ax.lines[0].get_ydata()
    assert ys[3] == pytest.approx(economics.speedup(0.7, 4, 0.05))
    plt.close(fig)


def shown(obj, monkeypatch) -> dict:
    """The bundle IPython shows for `obj`: through _repr_mimebundle_ (ipywidgets 8) or _ipython_display_ (7)."""
    import IPython.display
    from IPython.core.formatters import DisplayFormatter

    published = []
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: published.append(data))
    data, _ = DisplayFormatter().format(obj)
    return published[0] if published else data


def test_explorers_show_a_placeholder_not_their_widget_tree_as_text(monkeypatch):
    box = widgets.explorer()
    assert repr(box) == widgets.EXPLORER_TEXT and "VBox(children" not in repr(box)
    assert box._repr_mimebundle_()["text/plain"] == widgets.EXPLORER_TEXT  # what a page without a kernel shows
    bundle = shown(box, monkeypatch)  # what IPython shows, in ipywidgets 7 (Colab's) as in 8
    assert bundle["text/plain"] == widgets.EXPLORER_TEXT
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == box.model_id
    assert repr(widgets.tree_explorer()) == widgets.TREE_EXPLORER_TEXT
    plt.close("all")


def test_tree_explorer_labels_are_whole():
    box = widgets.tree_explorer()
    sliders = [s for row in box.children[:2] for s in row.children]
    assert {s.description for s in sliders} >= {"s (cost per node)", "α (hit rate)", "wide levels"}
    assert all(s.style.description_width == "initial" for s in sliders)
    plt.close("all")


def test_a_curve_under_another_gets_no_legend_entry_of_its_own():
    fig, ax = plt.subplots()
    widgets._draw(ax, economics.QWEN25_7B_ON_H100, 0.8, 4, 0.05, 1, 8)  # batch 1: the two curves coincide
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["batch 1, roofline: verification free"]
    ax.clear()
    widgets._draw(ax, economics.QWEN25_7B_ON_H100, 0.8, 4, 0.05, 256, 8)
    assert len(ax.get_legend().get_texts()) == 2
    ax.clear()
    widgets._tree_curves(ax, [[1, 1, 1], [1, 1, 1]], 0.7, 0.05, 0.1)  # width 1: the tree is the chain
    assert len(ax.get_legend().get_texts()) == 1
    plt.close(fig)


def test_tree_grid_fits_every_curve():
    fig = widgets.tree_grid(hits=(0.6, 0.9), cs=(0.05, 0.3))
    top = max(max(line.get_ydata()) for ax in fig.axes for line in ax.lines)
    for ax in fig.axes:
        lo, hi = ax.get_ylim()
        assert lo == 0 and hi >= top, f"{ax.get_title()}: y axis ends at {hi:.2f}, a curve reaches {top:.2f}"
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == len(widgets.SHAPES)
    plt.close(fig)


def test_run_button_is_busy_while_it_runs(monkeypatch):
    import torch

    class Tok:
        eos_token_id = None

        def __call__(self, text, return_tensors):
            return type("Enc", (), {"input_ids": torch.tensor([[1, 2, 3]])})()

    seen = []
    box = widgets.tree_explorer(pair=(torch.nn.Linear(1, 1), None, Tok()), prompts=[{"id": "p0", "prompt": "x"}])
    button, result = box.children[-2].children[1], box.children[-1]

    def fake_measure(target, draft, ids, branching, max_new_tokens, eos):
        seen.append((button.disabled, button.description, result.value))
        return {"branching": branching, "hit": [0.5], "predicted_tau": 2.0, "measured_tau": 2.5, "target_calls": 4,
                "nodes_per_pass": 3.0, "same_as_greedy": True}

    monkeypatch.setattr(measure, "measure_tree", fake_measure)
    button.click()
    assert seen and seen[0][0] and seen[0][1] == "running…" and "running the real pair on p0" in seen[0][2]
    assert not button.disabled and button.description == "run the real pair"
    assert "measured τ <b>2.50</b>" in result.value and "identical to greedy: True" in result.value

    def fail(*args):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(measure, "measure_tree", fail)
    button.click()  # ipywidgets logs a callback's exception; the button must come back all the same
    assert not button.disabled and "the run failed: RuntimeError: out of memory" in result.value
    plt.close("all")
