"""Argument checks shared by every entry point: `generate`, the drafters, `lookahead_generate`, `Warp`, and the
probabilities and token ids that sampling's functions take.

Each check returns the value in the form the code uses (an int, a set of ids, a [1, T] tensor) or raises
`ArgumentError` with one line that names the argument, the value it got and what to pass instead. The
checks run before any model does: a bad setting fails in milliseconds, not after minutes of decoding.
"""

from __future__ import annotations

import numbers
import operator
import reprlib
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

__all__ = ["ArgumentError", "MIN_TEMPERATURE", "SUM_TOL", "show", "integer", "real", "temperature", "top_k", "top_p",
           "eos_ids", "prompt", "model", "instance", "drafter", "typical", "branching", "choices", "generator", "probs",
           "tokens", "proposable"]

# Below this, softmax(logits / T) is argmax in all but name; near 1e-38 logits / T overflows float32 to inf and
# the softmax turns into NaN. So 0 < T < MIN_TEMPERATURE is refused: pass 0 for greedy decoding.
MIN_TEMPERATURE = 1e-4


class ArgumentError(ValueError, TypeError):
    """A bad argument. Both a ValueError and a TypeError, so either `except` clause catches it."""


def show(value) -> str:
    """A short description of `value` for a message: shapes for tensors, names for classes, else a repr."""
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    if isinstance(value, type):
        return f"the class {value.__name__}"
    if isinstance(value, nn.Module):
        name = type(value).__name__
        return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"
    if isinstance(value, (tuple, list)) and any(isinstance(v, (nn.Module, Tensor)) for v in value):
        return f"a {type(value).__name__} of {', '.join(type(v).__name__ for v in value)}"
    return reprlib.repr(value)


def integer(value, name: str, meaning: str, low: int = 1, fix: str = "") -> int:
    """value as an int >= low (numpy ints pass; bools, floats and strings do not)."""
    try:
        ok = not isinstance(value, bool) and operator.index(value) >= low
    except TypeError:
        ok = False
    if not ok:
        raise ArgumentError(f"{name} ({meaning}) must be an int >= {low}, got {show(value)}"
                            + (f"; {fix}" if fix else ""))
    return operator.index(value)


def real(value, name: str, rule: str, ok) -> float:
    """value as a float for which ok(value) holds; `rule` says in words what ok checks."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not ok(float(value)):
        raise ArgumentError(f"{name} must be {rule}, got {show(value)}")
    return float(value)


def temperature(value) -> float:
    """0 (greedy) or a finite T >= MIN_TEMPERATURE."""
    T = real(value, "temperature", ">= 0 (0 = greedy decoding) and finite", lambda t: 0 <= t < float("inf"))
    if 0 < T < MIN_TEMPERATURE:
        raise ArgumentError(f"temperature={value!r} is too small to divide logits by (softmax(logits / T) overflows "
                            f"float32): pass temperature=0 for greedy decoding, or at least {MIN_TEMPERATURE:g}")
    return T


def top_k(value) -> int | None:
    return None if value is None else integer(value, "top_k", "keep the k likeliest tokens", 1,
                                              "None switches top-k off (Hugging Face's top_k=0)")


def top_p(value) -> float | None:
    return None if value is None else real(value, "top_p", "in (0, 1] or None (no top-p)", lambda p: 0 < p <= 1)


def eos_ids(value) -> set[int]:
    """None, one token id or a list of them -> the set of ids that end a generation."""
    if value is None:
        return set()
    items = value.tolist() if isinstance(value, Tensor) else value
    items = items if isinstance(items, (list, tuple, set, frozenset)) else [items]
    try:
        ids = [operator.index(t) for t in items]
    except TypeError:
        ids = None
    if ids is None or any(isinstance(t, bool) for t in items) or any(t < 0 for t in ids):
        raise ArgumentError(f"eos_token_id must be a token id (an int >= 0), a list of them or None, got "
                            f"{show(value)}: pass tok.eos_token_id")
    return set(ids)


def prompt(input_ids, max_new_tokens, vocab: int, context: int | None, device) -> tuple[Tensor, int]:
    """(input_ids as a [1, T] long tensor on `device`, max_new_tokens as an int), checked against the target:
    its vocabulary size and its context (position table; None = unlimited). A [T] tensor or a list is one
    sequence; text, a tokenizer's whole output and batches are refused with what to pass instead."""
    max_new_tokens = integer(max_new_tokens, "max_new_tokens", "tokens to generate", 0)
    if isinstance(input_ids, str):
        raise ArgumentError(f"input_ids is text ({show(input_ids)}): tokenize first: "
                            "tok(text, return_tensors='pt').input_ids")
    if isinstance(input_ids, Mapping):  # transformers' BatchEncoding is a Mapping too
        raise ArgumentError(f"input_ids is a tokenizer's whole output ({type(input_ids).__name__} with keys "
                            f"{list(input_ids)}): pass its .input_ids, tok(text, return_tensors='pt').input_ids")
    if isinstance(input_ids, nn.Module):
        raise ArgumentError(f"input_ids is {show(input_ids)}, a model: the order is generate(target, input_ids, "
                            "drafter, ...)")
    try:
        ids = input_ids if isinstance(input_ids, Tensor) else torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError):
        ids = None
    if ids is not None and ids.numel() == 0 and ids.dim() <= 2:
        raise ArgumentError("the prompt is empty: pass at least one token id (a BOS or EOS token works as a "
                            "start-of-text prompt)")
    if ids is not None and ids.dim() == 2 and ids.shape[0] != 1:
        raise ArgumentError(f"generate decodes one sequence at a time (batch size 1), got input_ids of shape "
                            f"{list(ids.shape)}: loop over the rows")
    if ids is None or ids.dim() not in (1, 2) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ArgumentError(f"input_ids must be token ids, a [T] or [1, T] integer tensor or a list of ints, got "
                            f"{show(input_ids)}")
    ids = ids.reshape(1, -1).long().to(device)  # [1, T]
    T = ids.shape[1]
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ArgumentError(f"input_ids hold ids outside the target's vocabulary [0, {vocab}): min {int(ids.min())}, "
                            f"max {int(ids.max())}; tokenize with the target's tokenizer")
    if context is not None and T > context:
        raise ArgumentError(f"the prompt has {T} tokens, more than the target's context of {context}: keep its "
                            f"last {context - 1} tokens or fewer (ids[:, -{context - 1}:])")
    if context is not None and T + max_new_tokens > context:
        raise ArgumentError(f"{T} prompt tokens + max_new_tokens={max_new_tokens} exceed the target's context of "
                            f"{context}: ask for at most {context - T} new tokens")
    return ids, max_new_tokens


def model(value, name: str, fix: str):
    """value must be a transformers causal LM (a module with a .config)."""
    if isinstance(value, nn.Module) and hasattr(value, "config"):
        return value
    raise ArgumentError(f"{name} must be a causal LM (a transformers model), got {show(value)}: {fix}")


def instance(value, cls: type, name: str, fix: str):
    """value must be an instance of cls (not the class itself, not something else)."""
    if isinstance(value, cls):
        return value
    article = "an" if cls.__name__[0] in "AEIOU" else "a"
    raise ArgumentError(f"{name} must be {article} {cls.__name__}, got {show(value)}: {fix}")


# How to make each drafter, for a message about a class passed where an instance (or a drafter) was meant.
_MAKE = {"DraftModelDrafter": "DraftModelDrafter(draft)", "PromptLookupDrafter": "PromptLookupDrafter()",
         "MedusaDrafter": "MedusaDrafter.from_zoo(target)", "EagleDrafter": "EagleDrafter.from_zoo(target)",
         "MedusaHeads": "MedusaDrafter(heads)", "EagleNet": "EagleDrafter(net)"}


DRAFTER_MEMBERS = ("start", "propose", "commit", "needs_hidden")  # drafters.Drafter


def drafter(value):
    """None or a drafter (drafters.Drafter's four members); a model, a class or heads get what to pass instead."""
    missing = [m for m in DRAFTER_MEMBERS if not hasattr(value, m)]
    if value is None or (not missing and not isinstance(value, type)):
        return value
    if isinstance(value, type):
        raise ArgumentError(f"drafter={value.__name__} is a class: instantiate it: "
                            f"{_MAKE.get(value.__name__, value.__name__ + '(...)')}")
    if isinstance(value, nn.Module) and hasattr(value, "config"):  # Hugging Face's habit: assistant_model=draft
        raise ArgumentError(f"drafter is a model ({type(value).__name__}), not a drafter: wrap the draft model: "
                            "DraftModelDrafter(draft)")
    if hasattr(value, "propose"):
        raise ArgumentError(f"{show(value)} has propose() but lacks {', '.join(missing)}: subclass "
                            "specdec_lab.drafters.Drafter, which provides them")
    fix = _MAKE.get(type(value).__name__, "DraftModelDrafter(draft), PromptLookupDrafter() or None")
    raise ArgumentError(f"drafter must be None or a drafter (an object with propose(ids, warp, limit)), got "
                        f"{show(value)}: pass {fix}")


def typical(value) -> tuple[float, float] | None:
    """Medusa's typical acceptance: None (exact verification) or (threshold in (0, 1], alpha > 0)."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ArgumentError(f"typical must be None (exact) or (threshold, alpha), e.g. (0.09, 0.3), got {value!r}")
    return (real(value[0], "typical's threshold", "in (0, 1]", lambda t: 0 < t <= 1),
            real(value[1], "typical's alpha", "> 0", lambda a: a > 0))


def branching(value) -> list[int]:
    """A tree shape: children per node at each level, e.g. [2, 2, 1, 1]."""
    items = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []
    if not items or any(isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1 for b in items):
        raise ArgumentError(f"branching must be a non-empty list of ints >= 1 (children per node at each level, "
                            f"e.g. [2, 2, 1, 1]; [1] * γ is a chain of γ), got {show(value)}")
    return [int(b) for b in items]


def choices(value) -> list[tuple[int, ...]]:
    """Medusa's tree: a non-empty list of paths of child ranks (ints >= 0), e.g. [(0,), (1,), (0, 0)]."""
    try:
        paths = [tuple(c) for c in value] if not isinstance(value, (str, Tensor)) else []
    except TypeError:
        paths = []
    if not paths or any(not c or any(isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 0 for r in c)
                        for c in paths):
        raise ArgumentError(f"choices must be a non-empty list of paths of child ranks (ints >= 0), e.g. "
                            f"[(0,), (1,), (0, 0)]; medusa.DEFAULT_CHOICES is the default and "
                            f"tree.full_choices([2, 2, 1]) a full tree; got {show(value)}")
    return [tuple(int(r) for r in c) for c in paths]


# ---- probabilities and token ids (sampling's functions take them from anyone) ----------------------------------

# How far (absolute) the sum of a probability row may be from 1. An fp32 softmax over a large
# vocabulary stays well inside it; logits and unnormalized weights do not.
SUM_TOL = 1e-4


def generator(value):
    """None or a torch.Generator (every draw of the course comes from one, so runs repeat)."""
    if value is not None and not isinstance(value, torch.Generator):
        raise ArgumentError(f"generator must be a torch.Generator or None, got {value!r}: "
                            "pass torch.Generator().manual_seed(0)")
    return value


def probs(name: str, x, ndim: int | None = None, shape: str = "[..., V]", size=None) -> Tensor:
    """x as a float tensor of probabilities, or an ArgumentError that says what is wrong with it.

    ndim or size (a full shape) constrain the shape; `shape` names it in the message.
    """
    x = x if isinstance(x, Tensor) else torch.as_tensor(x)
    if not x.is_floating_point():
        raise ArgumentError(f"{name} must hold floating-point probabilities, got dtype {x.dtype}: "
                            "pass a softmax over the vocabulary, not token ids")
    x = x if x.dtype == torch.float32 else x.float()
    if (ndim is not None and x.dim() != ndim) or x.dim() == 0:
        raise ArgumentError(f"{name} must have shape {shape}, got {list(x.shape)}")
    if size is not None and x.shape != tuple(size):
        raise ArgumentError(f"{name} must have shape {list(size)} ({shape}), got {list(x.shape)}")
    if x.numel() == 0:
        if x.shape[-1] == 0:
            raise ArgumentError(f"{name} has shape {list(x.shape)}: the vocabulary dimension is empty")
        return x  # no rows, e.g. q for an empty draft
    sums = x.sum(-1)  # [...]
    low_sum, high_sum = torch.aminmax(sums)
    if float(x.min()) >= 0 and 1 - SUM_TOL <= float(low_sum) and float(high_sum) <= 1 + SUM_TOL:
        return x  # the common case; NaN and inf fail these comparisons and are diagnosed below
    if torch.isnan(x).any():
        raise ArgumentError(f"{name} has NaN entries: the logits it came from hold NaN or inf; check the model")
    if (x < 0).any():
        where = tuple((x < 0).nonzero()[0].tolist())
        raise ArgumentError(
            f"{name} has a negative entry {x[where].item():.4g} at index {list(where)}: probabilities are "
            ">= 0 (logits and log-probabilities are not probabilities)"
        )
    where = tuple(((sums - 1).abs() > SUM_TOL).nonzero()[0].tolist())
    row = f" row {list(where)}" if where else ""
    raise ArgumentError(
        f"{name}{row} sums to {sums[where].item():.6f}, not 1 (tolerance {SUM_TOL:g}): "
        "pass probabilities (a softmax), not logits or unnormalized weights"
    )


def tokens(name: str, tokens, vocab: int, device) -> Tensor:
    """tokens as a 1-D long tensor of ids in [0, vocab)."""
    ids = tokens.tolist() if isinstance(tokens, Tensor) else list(tokens)
    try:
        ids = [operator.index(t) for t in ids]  # ints, numpy ints; not floats, not nested lists
    except TypeError:
        raise ArgumentError(f"{name} must be a 1-D sequence of integer token ids, got {ids}") from None
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise ArgumentError(f"{name} token {t} at position {i} is outside the vocabulary [0, {vocab}): "
                                "use ids of the target's tokenizer")
    return torch.tensor(ids, dtype=torch.long, device=device)


def proposable(q_x: Tensor, tokens: Tensor, what: str) -> None:
    """A drafter cannot propose a token it gives probability 0: that means q does not match the draft."""
    if len(q_x) and float(q_x.min()) <= 0:
        i = int((q_x <= 0).nonzero()[0])
        raise ArgumentError(
            f"q gives the {what} token {tokens[i].item()} (position {i}) probability 0, so it cannot "
            "have been drawn from q: pass the distribution the draft was sampled from"
        )
