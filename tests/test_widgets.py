"""specdec_lab.widgets: the explorer builds and updates, and the static fallback draws the same numbers."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from specdec_lab import economics, widgets  # noqa: E402


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
