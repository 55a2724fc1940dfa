"""Interactive explorers for the notebooks, each with a static fallback (a plot grid) for places where
widgets do not render (a repository page, a PDF, nbviewer).

    explorer()        sliders for α, γ, c and batch size: tokens per pass, speedup, best γ, live
    speedup_grid()    the same numbers as a fixed grid of curves (the fallback)
    tree_explorer()   chapter 04: tree width, depth, hit rate, draft and verify costs; optionally the real pair
    tree_grid()       its static fallback
    round_stepper()   chapter 03: one round of speculative sampling on the real pair, a button to the next round
    RoundStepper, round_lines(), round_figure()   the rounds it steps through, in words and as bars (its fallback)

Used by notebooks/02_speedup_economics.ipynb, 03_draft_target.ipynb and 04_tree_attention.ipynb. The batch dimension uses a roofline
model of a real model on a real accelerator (default: Qwen2.5-7B on an H100, `economics.QWEN25_7B_ON_H100`).
Where no kernel runs, an explorer's saved output is a one-line placeholder (EXPLORER_TEXT, TREE_EXPLORER_TEXT)
rather than ipywidgets' `VBox(children=...` text (STEPPER_TEXT for the stepper); tests/test_browser.py checks
the explorers and the stepper in JupyterLab.
Works with ipywidgets 8 and 7.7 (Colab's).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass

import ipywidgets as w
import matplotlib.pyplot as plt
import torch
from IPython.display import display
from torch import Tensor
from transformers import AutoTokenizer

from specdec_lab import checks, decoding, lm, measure, sampling
from specdec_lab.drafters import Drafter, DraftModelDrafter
from specdec_lab.economics import (QWEN25_7B_ON_H100, Roofline, expected_tokens, level_hit_rates, optimal_gamma,
                                   speedup, tree_expected_tokens, tree_nodes, tree_speedup)
from specdec_lab.sampling import Warp

__all__ = ["explorer", "speedup_grid", "summary", "tree_shape", "tree_summary",
           "tree_explorer", "tree_grid", "Round", "RoundStepper", "round_lines", "round_figure", "round_stepper"]

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
EXPLORER_TEXT = ("[the explorer: sliders for α, γ, c and batch size. Run this cell in a live kernel (JupyterLab, "
                 "Colab) to use it; the static grid below shows the same curves.]")
TREE_EXPLORER_TEXT = ("[the tree explorer: sliders for tree width, depth, α and costs, and a button that runs the real "
                      "pair. Run this cell in a live kernel (JupyterLab, Colab) to use it; the static grid below "
                      "shows the same curves.]")


def _box(rows, label: str):
    """A VBox of `rows` whose text form (what a page without a live kernel shows instead of the widget) is
    `label`, not the long `VBox(children=(HBox(children=(FloatSlider(...` of ipywidgets."""

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


def _redraw(plot, draw, title: str) -> None:
    """Replace the figure in `plot` (an ipywidgets Output) with one drawn by draw(ax), titled `title`."""
    with plot:
        plot.clear_output(wait=True)
        _, ax = plt.subplots(figsize=(6.5, 3.2))
        draw(ax)
        ax.set_title(title, fontsize=10)
        plt.show()


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
        _redraw(plot, lambda ax: _draw(ax, model, v["alpha"], v["gamma"], v["c"], v["batch"], max_gamma),
                f"α = {v['alpha']:.2f}, c = {v['c']:.2f}")

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
        hit, c = sliders["hit"].value, sliders["c"].value
        _redraw(plot, lambda ax: _tree_curves(ax, [sm["branching"], [1] * len(sm["branching"])], hit, c, s_max,
                                              sliders["s"].value), f"α = {hit:.2f}, c = {c:.2f}")

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


# ---- chapter 03: one round of the sampled speculative step, stepped through on real logits -------------------
# Used by notebooks/03_draft_target.ipynb. `RoundStepper` calls `decoding.step`, the round `generate` loops over,
# with the same generator, so its rounds emit exactly what `generate` emits for the same seed
# (tests/test_widgets.py); the verifier hands back the uniforms u it drew, to show the test u·q(x) < p(x) that decided.

STEPPER_TEXT = ("[the round stepper: one round of speculative sampling on the real pair, q and p bars per draft, the "
                "accept test, the residual or the bonus, both caches; a button steps to the next round. Run this cell "
                "in a live kernel (JupyterLab, Colab) to use it; the static rounds below show the same thing.]")


@dataclass
class Round:
    """One round of `generate` with a draft-model chain, as `RoundStepper.step` saw it.

    drafts: the γ drafted tokens; q [γ, V] the warped draft distributions they were drawn from (None at T = 0,
    where the drafts are the draft's argmax); p [γ+1, V] the target's warped distributions from its one pass (row i:
    after the text and the first i drafts; row γ gives the bonus); u [γ] the uniforms of the accept test (None at
    T = 0, where a draft passes when it is the target's argmax); accepted: drafts kept (n); emitted: the tokens the
    round committed (the accepted drafts, then the correction or the bonus, cut at EOS or the length budget);
    residual [V]: norm(max(p_n - q_n, 0)), the correction's distribution, after a rejection at T > 0;
    committed: the text's length before the round (prompt included); target_cache, draft_cache: their lengths
    (before the round, after its forward passes, after the rollback); done: the text is complete.
    """

    index: int
    committed: int
    drafts: list[int]
    q: Tensor | None
    p: Tensor
    u: list[float] | None
    accepted: int
    emitted: list[int]
    residual: Tensor | None
    target_cache: tuple[int, int, int]
    draft_cache: tuple[int, int, int]
    done: bool
    temperature: float

    @property
    def kind(self) -> str:
        """What the round's last token is: 'correction' (a draft was rejected), 'bonus' (all passed), or 'cut'
        (EOS or the length budget ended the round inside its accepted drafts)."""
        if len(self.emitted) <= self.accepted:
            return "cut"
        return "bonus" if self.accepted == len(self.drafts) else "correction"

    def passed(self) -> list[bool | None]:
        """Per draft: True (accepted), False (the rejected one), None (never tested: after a rejection)."""
        n = self.accepted
        return [True] * n + ([False] if n < len(self.drafts) else []) + [None] * max(len(self.drafts) - n - 1, 0)


def _prompt_ids(prompt, tokenizer) -> Tensor:
    """A prompt as Hugging Face users pass one: text (tokenized here), a tokenizer's output, or token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("the prompt is text: pass tokenizer=tok (zoo.load_pair and zoo.load_model return one)")
        return tokenizer(prompt, return_tensors="pt").input_ids  # [1, T]
    if isinstance(prompt, Mapping):  # a BatchEncoding: tok(text, return_tensors="pt")
        return torch.as_tensor(prompt["input_ids"])
    return prompt


def _tokenizer_of(model):
    """The tokenizer saved beside a local model (the zoo's and load_model's folders hold one), else None."""
    try:

        return AutoTokenizer.from_pretrained(model.name_or_path, local_files_only=True)
    except Exception:  # no tokenizer files there: tokens are shown as ids
        return None


class RoundStepper:
    """`decoding.generate(target, ids, DraftModelDrafter(draft, gamma), ...)`, one round per `step()`: each calls
    the loop's own `decoding.step` and keeps what it did, with what the figures show (p, q, the residual).

    target, draft: causal LMs with one vocabulary (draft may also be a chain DraftModelDrafter). prompt: text (with
    `tokenizer`), a tokenizer's output, or token ids. The other arguments are generate's; `seed` seeds the one
    generator every draw comes from. `rounds` holds every Round so far, `ids` [1, T] the committed text.
    """

    def __init__(self, target, draft, prompt, gamma: int = 3, temperature: float = 0.8, tokenizer=None,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0, max_new_tokens: int = 64,
                 eos_token_id=None):
        self.tokenizer = tokenizer if tokenizer is not None else _tokenizer_of(target)
        chain = draft if isinstance(draft, DraftModelDrafter) else DraftModelDrafter(draft, gamma)
        if any(b != 1 for b in chain.branching):
            raise checks.ArgumentError(f"the stepper shows a chain: pass gamma=γ, not branching={chain.branching}")
        self.drafter = _Watched(chain)
        seeded = torch.Generator(device=target.device).manual_seed(seed)
        self.loop = decoding.start(target, _prompt_ids(prompt, self.tokenizer), self.drafter, max_new_tokens,
                                   temperature, top_k, top_p, eos_token_id, seeded)
        self.prompt_len, self.rounds = self.loop.T0, []

    @property
    def ids(self) -> Tensor:
        """The committed text, [1, T]."""
        return self.loop.ids

    @property
    def done(self) -> bool:
        return self.loop.done

    @property
    def tokens(self) -> list[int]:
        """The new tokens so far (what `generate(...).tokens` holds once the stepper is done)."""
        return self.ids[0, self.prompt_len:].tolist()

    @torch.inference_mode()
    def step(self) -> Round:
        """One round: draft γ tokens, ONE target pass, accept or reject each, correction or bonus, roll back."""
        T, d0 = self.loop.T, lm.cache_len(self.drafter.chain.cache)
        r = decoding.step(self.loop)  # the round generate runs
        warp, n, tree = self.loop.warp, len(r.path), r.tree
        p, sampled = warp.probs(r.logits), not warp.greedy and len(tree) > 0  # [γ+1, V]
        residual = sampling.residual(p[n], tree.q[n]) if sampled and n < len(tree) else None  # the correction's
        shown = Round(len(self.rounds), T, list(tree.tokens), tree.q, p, r.u if sampled else None, n, r.emitted,
                      residual, r.cache, (d0, self.drafter.drafted, lm.cache_len(self.drafter.chain.cache)),
                      self.loop.done, warp.temperature)
        self.rounds.append(shown)
        return shown


class _Watched(Drafter):
    """The stepper's chain drafter, noting its cache's length after drafting (the figures show it)."""

    def __init__(self, chain: DraftModelDrafter):
        self.chain, self.drafted = chain, 0

    def start(self, target, ids: Tensor) -> None:
        self.chain.start(target, ids)

    def propose(self, ids: Tensor, warp: Warp, limit: int):
        tree = self.chain.propose(ids, warp, limit)
        self.drafted = lm.cache_len(self.chain.cache)
        return tree

    def commit(self, ids: Tensor, accepted: int, path: list[int], hidden) -> None:
        self.chain.commit(ids, accepted, path, hidden)


def _piece(tokenizer, token: int) -> str:
    """A token as a short visible label: its text in quotes (newlines and spaces shown), or its id."""
    if tokenizer is None:
        return f"#{token}"
    text = repr(tokenizer.decode([token]))
    return text if len(text) <= 14 else text[:12] + "…'"


def _num(x: float, digits: int = 3) -> str:
    """A probability with `digits` decimals, or two significant digits when it is smaller than that shows."""
    return f"{x:.{digits}f}" if x == 0 or abs(x) >= 10 ** -digits else f"{x:.2g}"


def round_lines(r: Round, tokenizer=None) -> list[str]:
    """The round in words, one line per step: the drafts' tests, the correction or bonus, both caches."""
    name, g = (lambda t: _piece(tokenizer, t)), len(r.drafts)
    lines = [f"round {r.index + 1}: text of {r.committed} tokens; the draft proposes {g}: "
             + " ".join(name(t) for t in r.drafts)]
    if not g:
        lines[0] = f"round {r.index + 1}: text of {r.committed} tokens; one token left to emit, nothing drafted"
    for i, (x, ok) in enumerate(zip(r.drafts, r.passed())):
        px = float(r.p[i, x])
        if ok is None:
            lines.append(f"  draft {i + 1} {name(x)}: not tested (a draft before it was rejected)")
        elif r.temperature == 0:  # greedy: one-hot p and q
            best = int(r.p[i].argmax())
            lines.append(f"  draft {i + 1} {name(x)}: the target's argmax is {name(best)}: "
                         + ("equal, accepted" if ok else "different, rejected"))
        else:
            qx, u = float(r.q[i, x]), r.u[i]
            lines.append(f"  draft {i + 1} {name(x)}: q = {_num(qx)}, p = {_num(px)}, u = {_num(u)}: "
                         f"u·q = {_num(u * qx)} {'<' if ok else '≥'} p, " + ("accepted" if ok else "rejected"))
    last = r.emitted[-1]
    if r.kind == "correction":
        where = (f"from the residual norm(max(p − q, 0)), where it has probability {_num(float(r.residual[last]))}"
                 if r.residual is not None else "the target's argmax")
        lines.append(f"  correction {name(last)}: {where}")
    elif r.kind == "bonus" and not g:
        lines.append(f"  the target's own token {name(last)}, drawn from p")
    elif r.kind == "bonus":
        how = ("the target's argmax" if r.temperature == 0 else
               f"drawn from p (p = {_num(float(r.p[g, last]))})")
        lines.append(f"  all {g} accepted: bonus {name(last)}, {how} after the last draft, free: the same pass "
                     "computed it")
    else:
        lines.append("  the text ends inside the accepted drafts (EOS or max_new_tokens): no correction or bonus")
    (t0, t1, t2), (d0, d1, d2) = r.target_cache, r.draft_cache
    lines.append(f"  committed {len(r.emitted)}: text {r.committed} → {r.committed + len(r.emitted)} tokens")
    lines.append(f"  target cache {t0} → {t1} after its pass → {t2} kept; draft cache {d0} → {d1} after drafting "
                 f"→ {d2} kept" + (" (one behind: the last draft was never fed)" if r.kind == "bonus" and g else ""))
    return lines


def _bars(ax, rows: list[tuple[str, Tensor, str]], picked: int | None, top: int, tokenizer, title: str,
          mark: dict[int, str] | None = None):
    """Bars of the `top` likeliest tokens under any of rows ((label, [V] probabilities, color)); the tick of
    `picked` in bold, those of `mark` ({token: color}) in their color."""
    score = torch.stack([row for _, row, _ in rows]).amax(0)  # [V]
    must = {t for t in [picked, *(mark or {})] if t is not None}  # shown even when unlikely
    ids = [t for t in score.topk(min(top + len(must), len(score))).indices.tolist() if t not in must]
    ids = sorted(ids[:top - len(must)] + sorted(must), key=lambda t: -float(score[t]))
    width = 0.8 / len(rows)
    for j, (label, row, color) in enumerate(rows):
        xs = [i + (j - (len(rows) - 1) / 2) * width for i in range(len(ids))]
        ax.bar(xs, [float(row[t]) for t in ids], width, color=color, label=label)
    names = [_piece(tokenizer, t) for t in ids]
    ax.set_xticks(range(len(ids)), names, rotation=60, ha="right", fontsize=7, family="monospace")
    for label, t in zip(ax.get_xticklabels(), ids):
        label.set_color((mark or {}).get(t, "black" if t == picked else "dimgray"))
        if t == picked or t in (mark or {}):
            label.set_fontweight("bold")
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6, loc="upper right")


def round_figure(r: Round, tokenizer=None, top: int = 6):
    """The round as bars: per draft, q and p of the likeliest tokens (the draft's in bold) and the test; after a
    rejection the residual beside them; the bonus position's p. Returns the matplotlib Figure."""

    g = len(r.drafts)
    fig, axes = plt.subplots(1, g + 1, figsize=(2.6 * (g + 1), 2.8), sharey=True, squeeze=False)
    for i, (ax, ok) in enumerate(zip(axes[0], r.passed() + [None])):
        if i == g:  # the bonus position
            if r.kind != "bonus" or not g:
                ax.text(0.5, 0.5, "not reached:\na draft was rejected" if g else "nothing drafted", ha="center",
                        va="center", fontsize=8, color="gray", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_facecolor("#f3f3f3")
                ax.set_title(f"after draft {g}", fontsize=8)
                continue
            bonus = r.emitted[-1]
            _bars(ax, [("p (target)", r.p[g], "tab:blue")], bonus, top, tokenizer,
                  f"after draft {g}: bonus {_piece(tokenizer, bonus)}", mark={bonus: "tab:blue"})
            continue
        x = r.drafts[i]
        rows = [("q (draft)", r.q[i] if r.q is not None else torch.nn.functional.one_hot(torch.tensor(x), r.p.shape[1]).float(),
                 "tab:orange"), ("p (target)", r.p[i], "tab:blue")]
        if ok is None:
            title = f"draft {i + 1} {_piece(tokenizer, x)}: not tested"
        elif r.temperature == 0:
            title = f"draft {i + 1} {_piece(tokenizer, x)}: {'= argmax p ✓' if ok else '≠ argmax p ✗'}"
        else:
            qx, px = float(r.q[i, x]), float(r.p[i, x])
            title = (f"draft {i + 1} {_piece(tokenizer, x)}: u·q = {_num(r.u[i] * qx, 2)} "
                     f"{'<' if ok else '≥'} p = {_num(px, 2)} {'✓' if ok else '✗'}")
        mark = None
        if ok is False and r.kind == "correction":
            rows.append(("residual", r.residual if r.residual is not None else r.p[i], "tab:red"))
            title += f"\ncorrection {_piece(tokenizer, r.emitted[-1])}"
            mark = {r.emitted[-1]: "tab:red"}
        _bars(ax, rows, x, top, tokenizer, title, mark)
        if ok is None:
            ax.set_facecolor("#f3f3f3")
    axes[0, 0].set_ylabel("probability")
    fig.suptitle(f"round {r.index + 1}: {r.accepted} of {g} drafts accepted, then a {r.kind}; "
                 f"target cache {r.target_cache[0]} → {r.target_cache[1]} → {r.target_cache[2]}, "
                 f"draft cache {r.draft_cache[0]} → {r.draft_cache[1]} → {r.draft_cache[2]}", fontsize=9)
    fig.tight_layout()
    return fig


def _round_html(stepper: RoundStepper, r: Round) -> str:
    """The text so far: the prompt's tail gray, earlier rounds plain, this round's accepted drafts green, its
    correction red or its bonus blue."""

    tok = stepper.tokenizer
    text = lambda ids: html.escape(tok.decode(ids)) if tok is not None else " ".join(f"#{t}" for t in ids)
    before = stepper.ids[0, :r.committed].tolist()
    new = r.emitted
    color = {"correction": "#ffc9c9", "bonus": "#c9dcff", "cut": "#c8f7c5"}[r.kind]
    spans = [f'<span style="color:#888">{text(before[:stepper.prompt_len])[-300:]}</span>',
             text(before[stepper.prompt_len:]),
             f'<span style="background:#c8f7c5">{text(new[:r.accepted])}</span>',
             f'<span style="background:{color}">{text(new[r.accepted:])}</span>']
    return f'<div style="font-family:monospace;white-space:pre-wrap;line-height:1.4">{"".join(spans)}</div>'


def round_stepper(target, draft, prompt, gamma: int = 3, temperature: float = 0.8, tokenizer=None,
                  top_k: int | None = None, top_p: float | None = None, seed: int = 0, max_new_tokens: int = 64,
                  eos_token_id=None, top: int = 6):
    """Step through the rounds of `generate` with a draft-model chain on real logits: a "next round" button, the
    text so far (this round's accepted drafts green, correction red, bonus blue), the round in words and as bars
    (`round_lines`, `round_figure`). Arguments as `RoundStepper`'s; top: tokens per bar chart. Returns the widget;
    its `stepper` attribute is the RoundStepper it drives."""


    stepper = RoundStepper(target, draft, prompt, gamma, temperature, tokenizer, top_k, top_p, seed, max_new_tokens,
                           eos_token_id)
    button, status = w.Button(description="next round", icon="forward"), w.HTML()
    text, words, plot = w.HTML(), w.HTML(), w.Output()

    def next_round(_=None):
        r = stepper.step()
        status.value = (f"<b>round {r.index + 1}</b>: {r.accepted} of {len(r.drafts)} accepted, then a {r.kind}; "
                        f"{len(stepper.tokens)} new tokens so far (T = {r.temperature})")
        text.value = _round_html(stepper, r)
        words.value = "<pre>" + html.escape("\n".join(round_lines(r, stepper.tokenizer))) + "</pre>"
        with plot:
            plot.clear_output(wait=True)
            round_figure(r, stepper.tokenizer, top)
            plt.show()
        if stepper.done:
            button.disabled, button.description = True, "text complete"

    button.on_click(next_round)
    next_round()
    box = _box([w.HBox([button, status]), text, words, plot], STEPPER_TEXT)
    box.stepper = stepper
    return box
