"""Pictures of speculative decoding: which tokens the target accepted, corrected, or added.

Made for notebooks/03_draft_target.ipynb. `show_acceptance` renders colored HTML in Jupyter and prints a
bracketed text form elsewhere (the text form is also what a terminal or an HTML-less viewer shows).
"""

from __future__ import annotations

import html
import sys

import matplotlib.pyplot as plt
from tqdm.std import tqdm

ACCEPTED, CORRECTED, BONUS, PLAIN = "accepted", "corrected", "bonus", "target"
COLORS = {ACCEPTED: "#c8f7c5", CORRECTED: "#ffc9c9", BONUS: "#c9dcff", PLAIN: "#eeeeee"}
TEXT_MARKS = {ACCEPTED: ("", ""), CORRECTED: ("⟦", "⟧"), BONUS: ("⟨", "⟩"), PLAIN: ("", "")}  # rare in code


def acceptance_kinds(gen) -> list[str]:
    """One kind per generated token of a `decoding.Generation`.

    Target pass i emitted accept_lengths[i] accepted drafts, then one token of the target's own: a
    correction when a draft was rejected, the bonus token when all draft_lengths[i] drafts passed, or a plain
    target token when nothing was drafted. EOS or the length budget may cut the last pass short.
    """
    kinds = []
    for accepted, drafted in zip(gen.accept_lengths, gen.draft_lengths):
        own = PLAIN if drafted == 0 else BONUS if accepted == drafted else CORRECTED
        kinds += [ACCEPTED] * accepted + [own]
    return kinds[: len(gen.tokens)]


def _pieces(tokenizer, tokens: list[int]) -> list[str]:
    """Each token's own text (byte-level pieces decoded one by one)."""
    return [tokenizer.decode([t]) for t in tokens]


def acceptance_text(tokenizer, gen) -> str:
    """Plain-text view: ⟦corrected⟧ and ⟨bonus⟩ tokens marked, accepted drafts as they are."""
    out = []
    for piece, kind in zip(_pieces(tokenizer, gen.tokens), acceptance_kinds(gen)):
        left, right = TEXT_MARKS[kind]
        out.append(f"{left}{piece}{right}")
    return "".join(out)


def acceptance_html(tokenizer, gen, prompt: str | None = None) -> str:
    """HTML view: accepted drafts green, corrections red, bonus tokens blue, the prompt gray."""
    spans = []
    if prompt is not None:
        spans.append(f'<span style="color:#888">{html.escape(prompt)}</span>')
    for piece, kind in zip(_pieces(tokenizer, gen.tokens), acceptance_kinds(gen)):
        spans.append(f'<span title="{kind}" style="background:{COLORS[kind]};border-radius:3px">'
                     f"{html.escape(piece)}</span>")
    legend = " ".join(f'<span style="background:{COLORS[k]};padding:0 4px">{k}</span>'
                      for k in (ACCEPTED, CORRECTED, BONUS))
    return (f'<div style="font-family:monospace;white-space:pre-wrap;line-height:1.5">{"".join(spans)}</div>'
            f'<div style="font-size:smaller">{legend}</div>')


class _Acceptance:
    """Shown as HTML by Jupyter, as the text form everywhere else."""

    def __init__(self, tokenizer, gen, prompt):
        self.text = acceptance_text(tokenizer, gen)
        self.html = acceptance_html(tokenizer, gen, prompt)

    def _repr_html_(self):
        return self.html

    def __repr__(self):
        return self.text


def show_acceptance(tokenizer, gen, prompt: str | None = None):
    """Display the generated text colored by what the verifier did with each token."""
    return _Acceptance(tokenizer, gen, prompt)


# ---- chapter 04: trees and tree masks (matplotlib only) -------------------------------------------------


def tree_layout(parents: list[int]) -> list[tuple[int, float]]:
    """(depth, row) of every node of a DraftTree (parent -1 = child of the root): leaves take rows 0, 1, ...
    in depth-first order and a parent sits at the mean row of its children. The root itself is (−1, mean)."""
    children = [[] for _ in parents]
    roots = []
    for i, p in enumerate(parents):
        (roots if p < 0 else children[p]).append(i)
    depth, row, next_row = {}, {}, [0]

    def place(i, d):
        depth[i] = d
        if not children[i]:
            row[i] = float(next_row[0])
            next_row[0] += 1
        else:
            for c in children[i]:
                place(c, d + 1)
            row[i] = sum(row[c] for c in children[i]) / len(children[i])

    for r in roots:
        place(r, 0)
    return [(depth[i], row[i]) for i in range(len(parents))]


def draw_tree(parents: list[int], labels: list[str] | None = None, path: list[int] | None = None,
              root_label: str = "root", ax=None, title: str | None = None):
    """Draw a DraftTree left to right: node i at (depth, row), a line to its parent; `path` (accepted node
    indices) in green, the other nodes gray. Returns the Axes."""
    xy = tree_layout(parents)
    if ax is None:
        depth, rows = max([d for d, _ in xy], default=0), max([r for _, r in xy], default=0) + 1
        _, ax = plt.subplots(figsize=(1.4 * (depth + 2) + 0.5, 0.32 * rows + 0.9))
    roots = [i for i, p in enumerate(parents) if p < 0]
    root_xy = (-1, sum(xy[i][1] for i in roots) / max(len(roots), 1))
    accepted = set(path or [])
    for i, p in enumerate(parents):
        px, py = root_xy if p < 0 else xy[p]
        on_path = i in accepted and (p < 0 or p in accepted)
        ax.plot([px, xy[i][0]], [py, xy[i][1]], color="tab:green" if on_path else "lightgray",
                lw=2.5 if on_path else 1, zorder=1)
    points = [root_xy] + xy
    names = [root_label] + [labels[i] if labels else str(i) for i in range(len(parents))]
    colors = ["#c9dcff"] + ["#c8f7c5" if i in accepted else "#eeeeee" for i in range(len(parents))]
    for (x, y), name, color in zip(points, names, colors):
        ax.text(x, y, name, ha="center", va="center", fontsize=8, family="monospace", zorder=2,
                bbox=dict(boxstyle="round,pad=0.25", fc=color, ec="gray", lw=0.6))
    ax.set_xlim(-1.6, max(x for x, _ in points) + 0.6)
    ax.set_ylim(max(y for _, y in points) + 0.7, min(y for _, y in points) - 0.7)
    ax.set_xticks(range(-1, max(x for x, _ in points) + 1),
                  ["root"] + [f"depth {d}" for d in range(max(x for x, _ in points) + 1)], fontsize=8)
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def draw_mask(mask, labels: list[str] | None = None, ax=None, title: str | None = None):
    """imshow of a tree mask [n, n] (row i: what node i attends to), node labels on both axes. Returns the Axes."""
    n = mask.shape[0]
    if ax is None:
        _, ax = plt.subplots(figsize=(0.32 * n + 1.5, 0.32 * n + 1.2))
    ax.imshow(mask.int().numpy() if hasattr(mask, "numpy") else mask, cmap="Greens", vmin=0, vmax=1.6)
    names = labels or [str(i) for i in range(n)]
    ax.set_xticks(range(n), names, rotation=90, fontsize=7, family="monospace")
    ax.set_yticks(range(n), names, fontsize=7, family="monospace")
    ax.set_xlabel("attends to (key)")
    ax.set_ylabel("node (query)")
    ax.set_xticks([x - 0.5 for x in range(1, n)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, n)], minor=True)
    ax.grid(which="minor", color="white", lw=0.5)
    ax.tick_params(which="minor", length=0)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def progress(iterable=None, desc: str | None = None, total: int | None = None, **kwargs):
    """A text progress bar (tqdm) on stderr for a cell that runs for a while: live count, rate and time left.

    Its last line leaves out the times ("prompts: 100%|██████████| 52/52"), so a notebook replayed under nbval
    shows the same text as the committed one (nbval keeps only what follows a stream's last carriage return).
    Use it like tqdm: `for x in progress(xs, "prompts")`, or `bar = progress(total=n)` and `bar.update()`.
    """
    class _Progress(tqdm):
        def close(self):
            if self.disable or not self.leave:
                return super().close()
            self.leave = False
            super().close()  # erases the live line (tqdm pads it with spaces: their number varies)
            self.leave = True
            self.bar_format = "{l_bar}{bar}| {n_fmt}/{total_fmt}"  # the last line: no times, no padding
            self.fp.write(f"\r{self}\n")
            self.fp.flush()

    kwargs.setdefault("mininterval", 1.0)
    kwargs.setdefault("file", sys.stderr)
    return _Progress(iterable, desc=desc, total=total, **kwargs)


# ---- chapter 03: one round as a timeline (matplotlib only) ------------------------------------------------


def draw_round(r, tokenizer=None, ax=None, title: str | None = None):
    """One speculative round as a timeline, left to right: the draft's γ forwards, the target's ONE pass, the
    accept/reject test of each draft, the correction or bonus token, the rollback of both caches, with each
    cache's length under every stage. `r` is a `widgets.Round` (RoundStepper.step()). Returns the Axes."""
    g, n = len(r.drafts), r.accepted
    name = (lambda t: repr(tokenizer.decode([t]))[:10]) if tokenizer is not None else (lambda t: f"#{t}")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.05 * (2 * g + 6), 2.6))
    lanes = {"draft model": 2, "target": 1, "verifier": 0}

    def box(x, w, lane, text, color, under=None):
        y = lanes[lane]
        ax.add_patch(plt.Rectangle((x, y - 0.3), w, 0.6, fc=color, ec="gray", lw=0.8))
        ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=7.5, family="monospace")
        if under is not None:
            ax.text(x + w / 2, y - 0.42, under, ha="center", va="center", fontsize=7, color="dimgray")

    (t0, t1, t2), (d0, d1, d2) = r.target_cache, r.draft_cache
    ax.text(-0.1, 2 - 0.42, f"cache {d0}", ha="right", va="center", fontsize=7, color="dimgray")
    ax.text(-0.1, 1 - 0.42, f"cache {t0}", ha="right", va="center", fontsize=7, color="dimgray")
    for i, t in enumerate(r.drafts):  # 1. draft: one forward per token, the first also reads the uncached tail
        reads = r.committed - d0 if i == 0 else 1
        box(i, 0.9, "draft model", f"d{i + 1} {name(t)}", "#ffe0b3",
            f"reads {reads}" + (f", cache {d1}" if i == g - 1 else ""))
    x = g + 0.1  # 2. verify: ONE target pass over the uncached tail and every draft
    box(x, 1.6, "target", f"ONE pass\n{g + 1} rows of p", "#c9dcff", f"reads {t1 - t0}, cache {t1}")
    x += 1.7
    for i, ok in enumerate(r.passed()):  # 3. accept / reject, left to right
        mark, color = {True: ("✓", "#c8f7c5"), False: ("✗", "#ffc9c9"), None: ("–", "#eeeeee")}[ok]
        box(x, 0.9, "verifier", f"{mark} d{i + 1}", color, "not tested" if ok is None else None)
        x += 1.0
    last = name(r.emitted[-1])  # 4. the target's own token
    if r.kind == "correction":
        box(x, 1.5, "verifier", f"correction\n{last}", "#ffc9c9", "from the residual" if r.temperature else "argmax p")
    elif r.kind == "bonus":
        box(x, 1.5, "verifier", f"bonus\n{last}", "#c9dcff", "from p after d" + str(g) if r.temperature else "argmax p")
    else:
        box(x, 1.5, "verifier", "cut\n(EOS / budget)", "#eeeeee")
    x += 1.6  # 5. roll back: each cache keeps the committed text but its last (pending) token
    box(x, 1.5, "draft model", "roll back", "#e8e8e8", f"cache {d2}" + (" (one behind)" if d2 < t2 else ""))
    box(x, 1.5, "target", "roll back", "#e8e8e8", f"cache {t2} = text − 1")
    ax.set_xlim(-1.1, x + 1.7)
    ax.set_ylim(-0.65, 2.45)
    ax.set_yticks(list(lanes.values()), list(lanes))
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    k = len(r.emitted)
    ax.set_title(title or f"round {r.index + 1}: {n} of {g} drafts accepted + 1 {r.kind}: text {r.committed} → "
                 f"{r.committed + k} tokens", fontsize=9)
    return ax
