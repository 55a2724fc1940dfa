"""What the graders of every chapter share: calling the learner's code, reporting, hints, tiny models.

A grader calls the learner's function through `call` (a stub still in place becomes a hint), asserts with
`check(condition, hint)` and ends with `passed(message)`, which prints the line that starts with "PASS".
Sampling checks use fixed seeds (`seeded`) and Pearson's chi-square test (`chi_square`), failing below
`P_VALUE_MIN`. `fmt` prints numbers, lists and tensors shortly, for hints.

`@grader` marks every check_*: in Jupyter a failing grader then shows its hint first and hides its own frames
(a hint shows as two lines; an error raised inside the learner's code keeps only the learner's frames).
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable

import torch
from torch import Tensor

P_VALUE_MIN = 1e-4  # a chi-square test fails below this p-value
CLOSE = 5e-3  # hand-computed answers may be rounded to this absolute tolerance


# ---- statistics and printing ---------------------------------------------------------------------------


def chi_square(counts, probs) -> tuple[float, float]:
    """Pearson's chi-square of observed counts against probabilities: (statistic, p-value).

    Tokens with probability 0 must never be observed (a single one gives p-value 0) and are left out
    of the statistic; the degrees of freedom are the number of tokens with probability > 0, minus 1.
    """
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    support = probs > 0
    if counts[~support].sum() > 0:
        return float("inf"), 0.0
    observed, expected = counts[support], counts.sum() * probs[support] / probs[support].sum()
    stat = ((observed - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    if dof == 0:
        return 0.0, 1.0
    return float(stat), float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def counts_of(tokens, vocab: int) -> Tensor:
    """How often each of the `vocab` token ids occurs in `tokens`: [V] int64."""
    return torch.bincount(torch.as_tensor(tokens, dtype=torch.long).flatten(), minlength=vocab)


def fmt(x, digits: int = 3) -> str:
    """A short printable form of a number, list or tensor, for hints: [0.4, 0.2, 0]."""
    if isinstance(x, Tensor):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v, digits) for v in x) + "]"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def seeded(seed: int) -> torch.Generator:
    """A fresh generator: every grader draws its cases and random numbers from fixed seeds."""
    return torch.Generator().manual_seed(seed)


# ---- calling the learner's code, reporting -------------------------------------------------------------


def call(fn: Callable, *args):
    """fn(*args), with a hint instead of a bare NotImplementedError when a stub is still in place."""
    try:
        return fn(*args)
    except NotImplementedError as e:
        name = getattr(fn, "__name__", "your function")
        stub = str(e).split(":")[0]  # nbtool's stubs say "<function>: your code here"
        if stub and stub != name and " " not in stub and not isinstance(fn, type):  # a class: its own methods
            hint = f"{name} calls {stub}, which is still a stub: finish that exercise first"
        else:
            hint = (f"{name} is not implemented yet: replace the `raise NotImplementedError` line in its cell "
                    "with your code, run that cell, then this one")
        raise AssertionError(hint) from None


def token(fn: Callable, *args) -> int:
    """Call a learner's sampler and insist on one token id."""
    out = call(fn, *args)
    try:
        return int(out)
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"{fn.__name__} should return one token id (an int), got {out!r}") from None


def number(fn: Callable, *args) -> float:
    """Call a learner's formula and insist on one finite-or-infinite real number (NaN is a hint of 0/0)."""
    try:
        out = call(fn, *args)
    except ZeroDivisionError:
        raise AssertionError(f"{fn.__name__}{args} divided by zero") from None
    try:
        return float(out)
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"{fn.__name__}{args} should return one number, got {out!r}") from None


def passed(message: str) -> None:
    print(f"PASS  {message}")


def check(condition: bool, hint: str) -> None:
    if not condition:
        raise AssertionError(hint)


# ---- tiny models (chapters 03 and 07) -------------------------------------------------------------------


class one_thread:
    """Tiny models run fastest on one thread (and two threads crawl on a busy machine)."""

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


def tiny_pair(seed: int = 0):
    """A tiny random Llama target, a noisy copy of it (agrees partly) and an unrelated draft, in fp32."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    def llama(hidden, layers, s):
        torch.manual_seed(s)
        config = LlamaConfig(vocab_size=211, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=256, initializer_range=0.2, eos_token_id=None,
                             bos_token_id=None, pad_token_id=None)
        return LlamaForCausalLM(config).eval()

    with torch.random.fork_rng():
        target = llama(48, 2, seed)
        noisy = copy.deepcopy(target)
        g = seeded(seed + 1)
        with torch.no_grad():
            for p in noisy.parameters():
                p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.05)
        return target, noisy, llama(32, 1, seed + 2)


# ---- how a failing grader looks in Jupyter ----------------------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))  # the grading package: these frames are the grader's own


def _in_grading(tb) -> bool:
    return os.path.dirname(os.path.abspath(tb.tb_frame.f_code.co_filename)) == _HERE


def _learner_frames(tb):
    """The traceback `tb` without the frames of the grading package (the learner's frames stay, in order)."""
    kept = []
    while tb is not None:
        if not _in_grading(tb):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _hint_first(hint: str, name: str):
    """IPython shows what an exception's `_render_traceback_` returns in place of the traceback."""
    red, dim, plain = "\x1b[0;31m", "\x1b[2m", "\x1b[0m"
    return lambda: [f"{red}AssertionError{plain}: {hint}",
                    f"{dim}(found by grading.{name}; the grader's own code is not shown){plain}"]


def grader(fn: Callable) -> Callable:
    """Mark a check_*: its hint (an AssertionError raised by the grader) shows as two lines in Jupyter, hint
    first; any other error keeps the learner's frames only. pytest and plain Python see the same exceptions."""

    @functools.wraps(fn)
    def grade(*args, **kwargs):
        __tracebackhide__ = True  # IPython and pytest skip this frame
        try:
            return fn(*args, **kwargs)
        except AssertionError as e:
            last = e.__traceback__
            while last.tb_next is not None:
                last = last.tb_next
            if _in_grading(last):  # a hint: the grader raised it
                e._render_traceback_ = _hint_first(str(e), fn.__name__)
                raise
            raise e.with_traceback(_learner_frames(e.__traceback__))  # the learner's own assert
        except Exception as e:
            raise e.with_traceback(_learner_frames(e.__traceback__))

    return grade


# ---- a tiny model of any vocabulary (chapters 03 and 04: exact distributions need a small vocabulary) ------


def tiny_llama(vocab: int, hidden: int = 32, layers: int = 1, seed: int = 0, init: float = 0.2):
    """A tiny random Llama in fp32, the same for the same arguments (its weights come from `seed`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128, initializer_range=init, eos_token_id=None,
                             bos_token_id=None, pad_token_id=None)
        return LlamaForCausalLM(config).eval()
