"""Greedy identity up to ties: what "identical to the target's greedy decoding" means in half precision.

Every decoder of the course emits the target's own argmax at every position, so in exact arithmetic its greedy
output IS the target's greedy output. Floating point is not exact: plain decoding computes position t's logits
in a one-token forward, a speculative decoder in a forward over several tokens (a chain or a tree), and the two
round differently. In fp32 the difference is about 1e-5 of a logit on the zoo target, and no argmax flipped on
the 52 prompts of the suite. In bfloat16 (8 bits of mantissa) or float16 it is about one rounding step of the largest logit, so
where the target's top two logits are that close (a near-tie) the two computations may pick different tokens.
From that position on the outputs differ, and both are the target's greedy decoding, each in its own rounding.

So `compare` classifies each prompt's FIRST mismatch (later tokens follow different texts and say nothing):

- noise δ: how far two computations of the same logits lie apart, MEASURED on the text before the mismatch:
  one uncached forward over the text against a cached one-token-at-a-time and a cached 4-at-a-time recomputation
  of the last few positions' logits (`logit_noise`);
- a TIE when both tokens' logits (from the uncached forward) lie within 2δ of the top logit: if every
  computation lies within δ of that one, any of them may rank either token first, so both are greedy;
- a BUG otherwise (a wrong mask, a stale cache, an off-by-one position all move logits by far more than δ),
  and when one output simply stops before the other (a budget or EOS mistake).

    report = identity.compare(target, prompts, outputs, references)   # per prompt: ids [1, T], token lists
    print(report)                    # "51/52 identical; 1 tie, 0 bugs" + one line per mismatch
    assert not report.bugs           # exact in fp32, where a correct decoder also has no ties
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec_lab import lm

__all__ = ["Mismatch", "Report", "logit_noise", "classify", "compare"]


@dataclass
class Mismatch:
    """A prompt's first differing new token, with the evidence that decides tie or bug."""

    prompt: int  # index into the prompts compared
    position: int  # index of the first differing new token
    ours: int | None  # our token there (None: our output stopped here)
    reference: int | None  # the reference's token there (None: it stopped here)
    gap: float  # top logit minus the lower of the two tokens' logits (inf when one output stopped)
    noise: float  # δ: the most two computations of these logits differed, measured on this text

    @property
    def tie(self) -> bool:
        return self.gap <= 2 * self.noise

    def __str__(self) -> str:
        if self.ours is None or self.reference is None:
            return f"prompt {self.prompt}, token {self.position}: BUG, one output stops here and the other does not"
        kind = "tie" if self.tie else "BUG"
        return (f"prompt {self.prompt}, token {self.position}: {kind}, ours {self.ours} vs {self.reference}, "
                f"logit gap {self.gap:.3g} against noise 2δ = {2 * self.noise:.3g}")


@dataclass
class Report:
    """The identity check over a list of prompts: identical, ties (fine) and bugs (not)."""

    prompts: int
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def identical(self) -> int:
        return self.prompts - len(self.mismatches)

    @property
    def ties(self) -> list[Mismatch]:
        return [m for m in self.mismatches if m.tie]

    @property
    def bugs(self) -> list[Mismatch]:
        return [m for m in self.mismatches if not m.tie]

    def verdicts(self) -> list[str]:
        """Per prompt: "same", "tie" or "bug"."""
        out = ["same"] * self.prompts
        for m in self.mismatches:
            out[m.prompt] = "tie" if m.tie else "bug"
        return out

    def __str__(self) -> str:
        head = f"{self.identical}/{self.prompts} identical"
        if self.mismatches:
            n = len(self.ties)
            head += f"; {n} {'tie' if n == 1 else 'ties'}, {len(self.bugs)} {'bug' if len(self.bugs) == 1 else 'bugs'}"
        return "\n".join([head] + [f"  {m}" for m in self.mismatches])


@torch.inference_mode()
def logit_noise(target, ids: torch.Tensor, last: int = 16) -> float:
    """δ: the largest difference between two computations of the logits at the last `last` positions of ids [1, T].

    The reference is one uncached forward over the whole text; against it, the same positions recomputed from a
    cache of the text before them, one token per forward (as plain decoding does) and four per forward (as a
    verification pass does). On the zoo target fp32 gives about 1e-5; bf16 and fp16 about one rounding step of the
    largest logit.
    """
    T = ids.shape[1]
    k = min(last, T - 1)  # positions recomputed: the first one needs a cached token before it
    if k < 1:
        return 0.0  # a one-token text has no cached way to compute it: one forward, no difference to measure
    full = lm.forward(target, ids)[0, T - k:].float()  # [k, V]
    noise = 0.0
    for step in (1, 4):
        cache = lm.new_cache(target)
        lm.forward(target, ids[:, :T - k], cache)
        parts = [lm.forward(target, ids[:, s:min(s + step, T)], cache)[0] for s in range(T - k, T, step)]
        noise = max(noise, (torch.cat(parts).float() - full).abs().max().item())  # [k, V] against [k, V]
    return noise


@torch.inference_mode()
def classify(target, ids: torch.Tensor, ours: list[int], reference: list[int], prompt: int = 0) -> Mismatch | None:
    """The first mismatch between two greedy continuations of ids [1, T], or None if they are identical."""
    if ours == reference:
        return None
    j = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), min(len(ours), len(reference)))
    a = ours[j] if j < len(ours) else None
    b = reference[j] if j < len(reference) else None
    text = torch.cat([ids[0], torch.tensor(reference[:j], dtype=ids.dtype, device=ids.device)])[None]  # [1, T + j]
    noise = logit_noise(target, text)
    if a is None or b is None:
        return Mismatch(prompt, j, a, b, float("inf"), noise)
    logits = lm.forward(target, text)[0, -1].float()  # [V]: the uncached forward's logits at the mismatch
    gap = (logits.max() - torch.minimum(logits[a], logits[b])).item()
    return Mismatch(prompt, j, a, b, gap, noise)


def compare(target, prompts: list[torch.Tensor], outputs: list[list[int]], references: list[list[int]]) -> Report:
    """Check greedy outputs against the reference (the target's plain greedy decoding), prompt by prompt.

    prompts: [1, T] id tensors; outputs, references: the new tokens each decoder emitted for them.
    """
    if not len(prompts) == len(outputs) == len(references):
        raise ValueError(f"compare needs one output and one reference per prompt: got {len(prompts)} prompts, "
                         f"{len(outputs)} outputs, {len(references)} references")
    report = Report(len(prompts))
    for i, (ids, ours, ref) in enumerate(zip(prompts, outputs, references)):
        mismatch = classify(target, ids, list(ours), list(ref), prompt=i)
        if mismatch is not None:
            report.mismatches.append(mismatch)
    return report
