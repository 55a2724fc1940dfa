"""Pictures of speculative decoding: which tokens the target accepted, corrected, or added.

Made for notebooks/03_draft_target.ipynb. `show_acceptance` renders colored HTML in Jupyter and prints a
bracketed text form elsewhere (the text form is also what a terminal or an HTML-less viewer shows).
"""

from __future__ import annotations

import html

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
