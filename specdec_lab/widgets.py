"""Interactive explorers for the notebooks, each with a static fallback (a plot grid) for places where
widgets do not render (a repository page, a PDF, nbviewer).

    explorer()        sliders for α, γ, c and batch size: tokens per pass, speedup, best γ, live
    speedup_grid()    the same numbers as a fixed grid of curves (the fallback)
    tree_explorer()   chapter 04: tree width, depth, hit rate, draft and verify costs; optionally the real pair
    tree_grid()       its static fallback

Used by notebooks/02_speedup_economics.ipynb and 04_tree_attention.ipynb. The batch dimension uses a roofline
model of a real model on a real accelerator (default: Qwen2.5-7B on an H100, `economics.QWEN25_7B_ON_H100`).
Where no kernel runs, an explorer's saved output is a one-line placeholder (EXPLORER_TEXT, TREE_EXPLORER_TEXT)
rather than ipywidgets' `VBox(children=...` text; tests/test_browser.py checks both explorers in JupyterLab.
Works with ipywidgets 8 and 7.7 (Colab's).
"""

from __future__ import annotations

from specdec_lab.economics import QWEN25_7B_ON_H100, Roofline, expected_tokens, optimal_gamma, speedup

__all__ = ["explorer", "speedup_grid", "summary", "tree_shape", "tree_summary",
           "tree_explorer", "tree_grid"]

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
EXPLORER_TEXT = ("[the explorer: sliders for α, γ, c and batch size. Run this cell in a live kernel (JupyterLab, "
                 "Colab) to use it; the static grid below shows the same curves.]")
TREE_EXPLORER_TEXT = ("[the tree explorer: sliders for tree width, depth, α and costs, and a button that runs the real "
                      "pair. Run this cell in a live kernel (JupyterLab, Colab) to use it; the static grid below "
                      "shows the same curves.]")


def _box(rows, label: str):
    """A VBox of `rows` whose text form (what a page without a live kernel shows instead of the widget) is
    `label`, not the long `VBox(children=(HBox(children=(FloatSlider(...` of ipywidgets."""
    import ipywidgets as w

    class Explorer(w.VBox):
        def __repr__(self):
            return label

        def _repr_mimebundle_(self, **kwargs):
            if hasattr(w.VBox, "_repr_mimebundle_"):  # ipywidgets 8
                data = super()._repr_mimebundle_(**kwargs)
            else:  # ipywidgets 7 (Colab's) has none: the bundle its _ipython_display_ shows
                data = {"application/vnd.jupyter.widget-view+json":
                        {"version_major": 2, "version_minor": 0, "model_id": self.model_id}}
            if data:
                data["text/plain"] = label  # whole: ipywidgets cuts a text form at 110 characters
            return data

        if not hasattr(w.VBox, "_repr_mimebundle_"):
            def _ipython_display_(self, **kwargs):  # how ipywidgets 7 displays a widget: with the bundle above
                from IPython.display import display

                display(self._repr_mimebundle_(), raw=True)
                self._handle_displayed(**kwargs)

    return Explorer(rows)


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
    free, at_batch = _curve(model, alpha, c, None, max_gamma), _curve(model, alpha, c, batch, max_gamma)
    if all(abs(a - b) < 1e-9 for a, b in zip(free, at_batch)):  # one curve hidden under the other: label it once
        curves = [(None, "-", f"batch {batch}, roofline: verification free")]
    else:
        curves = [(None, "--", "verification free"), (batch, "-", f"batch {batch}, roofline")]
    for b, style, label in curves:
        ys = free if b is None else at_batch
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
    return _box([w.HBox([sliders["alpha"], sliders["gamma"]]), w.HBox([sliders["c"], sliders["batch"]]), text, plot],
                EXPLORER_TEXT)


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


# ---- chapter 04: tree drafts ----------------------------------------------------------------------------
# Used by notebooks/04_tree_attention.ipynb. The model (economics.tree_expected_tokens, tree_speedup): a level
# whose accepted parent has b children contains the target's next token with probability h(b), from a hit rate
# α under independence, h(b) = 1 - (1 - α)^b, or from measured top-k hit rates, h(b) = hit[b-1]; hits at
# different depths are independent. Cost of a pass in target decode steps: v(1 + nodes) ≈ 1 + s·nodes (the
# target reads the pending token and every node; s is the extra cost per node) + c·depth (one draft forward
# per level).

SHAPES = ([1, 1, 1, 1], [2, 2, 1, 1], [3, 2, 1], [4, 2], [3, 3, 2])


def tree_shape(width: int, depth: int, wide_levels: int) -> list[int]:
    """The branching with `width` children per node on the first `wide_levels` levels, then a chain: depth levels."""
    wide_levels = max(0, min(wide_levels, depth))
    return [width] * wide_levels + [1] * (depth - wide_levels)


def tree_summary(branching: list[int], hit, c: float = 0.05, s: float = 0.0) -> dict:
    """The numbers the tree explorer shows, beside the chain of the same depth (handy without widgets too)."""
    from specdec_lab.economics import level_hit_rates, tree_expected_tokens, tree_nodes, tree_speedup

    chain = [1] * len(branching)
    return {
        "branching": list(branching),
        "nodes": tree_nodes(branching),
        "level_hits": level_hit_rates(branching, hit),
        "tokens_per_pass": tree_expected_tokens(branching, hit),
        "speedup": tree_speedup(branching, hit, c, s),
        "chain_tokens_per_pass": tree_expected_tokens(chain, hit),
        "chain_speedup": tree_speedup(chain, hit, c, s),
    }


def _tree_curves(ax, shapes, hit, c, s_max, s_now=None, legend=True):
    from specdec_lab.economics import tree_nodes, tree_speedup

    ss = [s_max * i / 50 for i in range(51)]
    unique = [list(s) for i, s in enumerate(shapes) if list(s) not in [list(t) for t in shapes[:i]]]
    for shape in unique:  # a shape listed twice (a tree of width 1 is the chain) is drawn and labelled once
        ax.plot(ss, [tree_speedup(shape, hit, c, s) for s in ss], label=f"{shape}: {tree_nodes(shape)} nodes")
    if s_now is not None:
        ax.axvline(s_now, color="gray", lw=0.8)
    ax.axhline(1, color="black", lw=0.8)
    ax.set_xlabel("s: extra cost per verified node (decode steps)")
    ax.set_ylabel("estimated speedup")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7, loc="upper right")



def tree_explorer(hit: float = 0.7, width: int = 2, depth: int = 4, wide_levels: int = 2, c: float = 0.05,
                  s: float = 0.0, s_max: float = 0.1, pair=None, prompts=None, max_new_tokens: int = 40):
    """Sliders for tree width, depth, wide levels, hit rate α, draft cost c and verify cost per node s.

    Shows expected tokens per pass, nodes verified and estimated speedup (tree and same-depth chain), and the
    speedup as s grows. With pair=(target, draft, tokenizer) and prompts (suite entries, dicts with "id" and
    "prompt"), a second row picks a prompt and runs the real pair on it (`measure.measure_tree`): measured τ beside
    the prediction from that prompt's measured top-k hit rates. Returns the widget.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt

    label = {"style": {"description_width": "initial"}}  # the whole label, however long ("s (cost per node)")
    sliders = {
        "width": w.IntSlider(value=width, min=1, max=4, description="width", **label),
        "depth": w.IntSlider(value=depth, min=1, max=6, description="depth", **label),
        "wide_levels": w.IntSlider(value=wide_levels, min=0, max=6, description="wide levels", **label),
        "hit": w.FloatSlider(value=hit, min=0.0, max=1.0, step=0.01, description="α (hit rate)", **label),
        "c": w.FloatSlider(value=c, min=0.0, max=0.5, step=0.01, description="c (draft)", **label),
        "s": w.FloatSlider(value=s, min=0.0, max=s_max, step=s_max / 50, description="s (cost per node)",
                           readout_format=".3f", **label),
    }
    text, plot = w.HTML(), w.Output()

    def shape():
        return tree_shape(sliders["width"].value, sliders["depth"].value, sliders["wide_levels"].value)

    def update(_=None):
        sm = tree_summary(shape(), sliders["hit"].value, sliders["c"].value, sliders["s"].value)
        text.value = (
            f"tree <b>{sm['branching']}</b>: <b>{sm['nodes']}</b> nodes verified per pass, "
            f"<b>{sm['tokens_per_pass']:.2f}</b> tokens per pass, estimated speedup <b>{sm['speedup']:.2f}×</b>"
            f"<br>chain of the same depth: {len(sm['branching'])} nodes, {sm['chain_tokens_per_pass']:.2f} tokens "
            f"per pass, {sm['chain_speedup']:.2f}×")
        with plot:
            plot.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(6.5, 3.2))
            _tree_curves(ax, [sm["branching"], [1] * len(sm["branching"])], sliders["hit"].value, sliders["c"].value,
                         s_max, sliders["s"].value)
            ax.set_title(f"α = {sliders['hit'].value:.2f}, c = {sliders['c'].value:.2f}", fontsize=10)
            plt.show()

    for s in sliders.values():
        s.observe(update, names="value")
    update()
    rows = [w.HBox([sliders["width"], sliders["depth"], sliders["wide_levels"]]),
            w.HBox([sliders["hit"], sliders["c"], sliders["s"]]), text, plot]
    if pair is not None and prompts:
        target, draft, tok = pair
        choice = w.Dropdown(options=[(p["id"], i) for i, p in enumerate(prompts)], description="prompt")
        idle = "run the real pair"
        button, result = w.Button(description=idle, icon="play"), w.HTML()

        def run(_=None):
            name, branching = prompts[choice.value]["id"], shape()
            button.disabled, button.description, button.icon = True, "running…", "hourglass-half"
            result.value = (f"running the real pair on {name} with tree {branching} ({max_new_tokens} new tokens, "
                            "three decodes: target alone, draft's top-k, speculative)…")
            try:
                device = next(target.parameters()).device
                ids = tok(prompts[choice.value]["prompt"], return_tensors="pt").input_ids.to(device)  # [1, T]
                from specdec_lab import measure

                m = measure.measure_tree(target, draft, ids, branching, max_new_tokens, tok.eos_token_id)
                hits = ", ".join(f"{h:.2f}" for h in m["hit"])
                result.value = (f"{name}, tree {m['branching']}: measured τ <b>{m['measured_tau']:.2f}</b>, "
                                f"predicted <b>{m['predicted_tau']:.2f}</b> from this prompt's top-k hit rates "
                                f"({hits}); {m['target_calls']} target passes, output identical to greedy: "
                                f"{m['same_as_greedy']}")
            except Exception as e:  # shown beside the button, where the learner looks
                result.value = f"the run failed: {type(e).__name__}: {e}"
                raise
            finally:
                button.disabled, button.description, button.icon = False, idle, "play"

        button.on_click(run)
        rows += [w.HBox([choice, button]), result]
    return _box(rows, TREE_EXPLORER_TEXT)


def tree_grid(hits=(0.6, 0.7, 0.8, 0.9), cs=(0.05, 0.3), shapes=SHAPES, s_max: float = 0.1):
    """The tree explorer as a static figure: one panel per (α, c), one curve per shape, speedup against s.

    Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(cs), len(hits), figsize=(3.3 * len(hits), 2.6 * len(cs) + 0.5), sharex=True,
                             squeeze=False)
    for row, c in zip(axes, cs):
        for ax, hit in zip(row, hits):
            _tree_curves(ax, shapes, hit, c, s_max, legend=False)
            ax.set_title(f"α = {hit}, c = {c}", fontsize=9)
            ax.set_xlabel("")
            ax.set_ylabel("")
    # one y range for every panel, set after all of them are drawn: the highest curve anywhere fits
    top = max(max(line.get_ydata()) for ax in axes.flat for line in ax.lines if len(line.get_ydata()) > 2)
    for ax in axes.flat:
        ax.set_ylim(0, 1.05 * top)
    for ax in axes[:, 1:].flat:
        ax.tick_params(labelleft=False)
    for ax in axes[-1]:
        ax.set_xlabel("s (cost per node)")
    for ax in axes[:, 0]:
        ax.set_ylabel("speedup")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(labels), frameon=False)
    fig.suptitle("estimated speedup of tree shapes as verification cost per node grows", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
