"""Interactive explorers for the notebooks, each with a static fallback (a plot grid) for places where
widgets do not render (a repository page, a PDF, nbviewer).

    explorer()        sliders for α, γ, c and batch size: tokens per pass, speedup, best γ, live
    speedup_grid()    the same numbers as a fixed grid of curves (the fallback)

Used by notebooks/02_speedup_economics.ipynb. The batch dimension uses a roofline model of a real model
on a real accelerator (default: seed 004's Qwen2.5-7B on an H100, `economics.QWEN25_7B_ON_H100`).
"""

from __future__ import annotations

from specdec_lab.economics import QWEN25_7B_ON_H100, Roofline, expected_tokens, optimal_gamma, speedup

__all__ = ["explorer", "speedup_grid", "summary"]

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _curve(model: Roofline, alpha: float, c: float, batch: int | None, max_gamma: int) -> list[float]:
    """Speedup for γ = 1..max_gamma; batch None = verification free (the plain formula)."""
    if batch is None:
        return [speedup(alpha, g, c) for g in range(1, max_gamma + 1)]
    return [model.speedup(alpha, g, c, batch) for g in range(1, max_gamma + 1)]


def _best(model: Roofline, alpha: float, c: float, batch: int | None, max_gamma: int) -> int:
    if batch is None:
        return optimal_gamma(alpha, c, max_gamma)
    return optimal_gamma(alpha, c, max_gamma, lambda g: model.verify_cost(g, batch))


def summary(alpha: float, gamma: int, c: float, batch: int = 1, model: Roofline = QWEN25_7B_ON_H100,
            max_gamma: int = 16) -> dict:
    """The numbers the explorer shows, as a dict (also handy without widgets)."""
    return {
        "tokens_per_pass": expected_tokens(alpha, gamma),
        "speedup_free_verify": speedup(alpha, gamma, c),
        "verify_cost": model.verify_cost(gamma, batch),
        "speedup_at_batch": model.speedup(alpha, gamma, c, batch),
        "best_gamma_free_verify": _best(model, alpha, c, None, max_gamma),
        "best_gamma_at_batch": _best(model, alpha, c, batch, max_gamma),
    }


def _draw(ax, model, alpha, gamma, c, batch, max_gamma, legend=True):
    xs = range(1, max_gamma + 1)
    for b, style, label in [(None, "--", "verification free"), (batch, "-", f"batch {batch}, roofline")]:
        ys = _curve(model, alpha, c, b, max_gamma)
        line, = ax.plot(xs, ys, style, label=label)
        best = _best(model, alpha, c, b, max_gamma)
        if best:
            ax.plot(best, ys[best - 1], "o", color=line.get_color())
    ax.axvline(gamma, color="gray", lw=0.8)
    ax.axhline(1, color="black", lw=0.8)
    ax.set_xlabel("γ (draft tokens per round)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_ylim(0, None)
    if legend:
        ax.legend(fontsize=8, loc="lower right")


def explorer(model: Roofline = QWEN25_7B_ON_H100, max_gamma: int = 16, alpha: float = 0.8, gamma: int = 4,
             c: float = 0.05, batch: int = 1):
    """Sliders for α, γ, c and batch; shows tokens per pass, speedup and the best γ, and the speedup curve.

    Returns the widget (display it, or leave it as the cell's last expression). Dots mark the best γ.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt

    sliders = {
        "alpha": w.FloatSlider(value=alpha, min=0.0, max=1.0, step=0.01, description="α"),
        "gamma": w.IntSlider(value=gamma, min=1, max=max_gamma, description="γ"),
        "c": w.FloatSlider(value=c, min=0.0, max=0.5, step=0.01, description="c"),
        "batch": w.SelectionSlider(options=BATCHES, value=batch, description="batch"),
    }
    text, plot = w.HTML(), w.Output()

    def update(_=None):
        v = {k: s.value for k, s in sliders.items()}
        s = summary(v["alpha"], v["gamma"], v["c"], v["batch"], model, max_gamma)
        text.value = (
            f"<b>{s['tokens_per_pass']:.2f}</b> tokens per target pass · speedup <b>{s['speedup_free_verify']:.2f}×"
            f"</b> if verification is free · <b>{s['speedup_at_batch']:.2f}×</b> at batch {v['batch']} "
            f"(verifying γ+1 tokens costs {s['verify_cost']:.2f} decode steps)<br>"
            f"best γ: <b>{s['best_gamma_free_verify']}</b> if verification is free, "
            f"<b>{s['best_gamma_at_batch']}</b> at batch {v['batch']} (0 = do not speculate)")
        with plot:
            plot.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(6.5, 3.2))
            _draw(ax, model, v["alpha"], v["gamma"], v["c"], v["batch"], max_gamma)
            ax.set_title(f"α = {v['alpha']:.2f}, c = {v['c']:.2f}", fontsize=10)
            plt.show()

    for s in sliders.values():
        s.observe(update, names="value")
    update()
    return w.VBox([w.HBox([sliders["alpha"], sliders["gamma"]]), w.HBox([sliders["c"], sliders["batch"]]),
                   text, plot])


def speedup_grid(model: Roofline = QWEN25_7B_ON_H100, alphas=(0.6, 0.7, 0.8, 0.9), cs=(0.02, 0.05, 0.15),
                 batches=(1, 64, 128, 256), max_gamma: int = 12):
    """The explorer as a static figure: one panel per (batch, c), one curve per α, a dot at the best γ.

    Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(batches), len(cs), figsize=(3.4 * len(cs), 2.4 * len(batches)), sharex=True,
                             sharey=True, squeeze=False)
    xs = range(1, max_gamma + 1)
    for row, batch in zip(axes, batches):
        for ax, c in zip(row, cs):
            for alpha in alphas:
                ys = _curve(model, alpha, c, batch, max_gamma)
                line, = ax.plot(xs, ys, label=f"α = {alpha}")
                best = _best(model, alpha, c, batch, max_gamma)
                if best:
                    ax.plot(best, ys[best - 1], "o", color=line.get_color())
            ax.axhline(1, color="black", lw=0.8)
            ax.set_title(f"batch {batch}, c = {c}", fontsize=9)
            ax.set_xticks(range(2, max_gamma + 1, 2))
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("γ")
    for ax in axes[:, 0]:
        ax.set_ylabel("speedup")
    axes[0, -1].legend(fontsize=7, loc="upper left")
    fig.suptitle("speedup over plain decoding on the roofline (dots: best γ)", fontsize=10)
    fig.tight_layout()
    return fig
