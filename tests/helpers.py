"""What several test files share: tiny random Llama models, prompts, the exact sampling test, notebook solutions.

* `tiny_llama`, `noisy_copy`, `prompt_ids`: fp32 models small enough for exhaustive tests (a target, an unrelated
  draft, and a draft that is the target with noise added, so acceptance is partial), and seeded prompts.
* Sampling tests: `exact_first_tokens` enumerates the target's own distribution of the first 3 generated tokens
  (every continuation the warp allows: a small vocabulary or a top-k keeps them few); `follows_target` checks seeded
  samples against it with `pooled_chi_square` (Pearson's chi-square, cells with expected count < 5 pooled) at
  P_MIN, and fails on any continuation the target cannot produce. Fixed seeds, so the tests are deterministic.
* `exercise_functions`: what a notebook's exercise cells define (solution or stub), for the graders' tests.
* Grader tests as tables: `@grader_table(WRONG, RIGHT)` over a test that calls `assert_grades`; `stub`,
  `stub_rows` and STUB_HINT for the exercises as they are handed out.

Test files import it as `from helpers import ...` (tests/conftest.py puts this folder on sys.path).
"""
import copy
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_lab import lm
from specdec_lab.grading import chi_square

ROOT = Path(__file__).resolve().parents[1]
P_MIN = 1e-3  # a sampling test fails below this chi-square p-value
RUNS = 3000  # seeded runs per sampling setting
VOCAB = 300


def tiny_llama(vocab=VOCAB, hidden=64, layers=2, seed=0, context=128, init=0.2):
    """A random Llama in fp32 (the same for the same arguments: its weights come from `seed`)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=context, initializer_range=init, eos_token_id=None,
                         bos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def noisy_copy(model, scale, seed):
    """The model with Gaussian noise of `scale` times each weight's std: a draft that agrees partly."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * scale)
    return out


def prompt_ids(seed, n=8, vocab=VOCAB):
    """[1, n] random token ids from `seed`."""
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def exact_first_tokens(target, ids, warp, steps=3) -> dict[tuple[int, ...], float]:
    """P(first `steps` tokens) under plain sampling with `warp`, by enumerating every continuation of nonzero
    probability: {continuation: probability}."""
    conts = torch.zeros(1, 0, dtype=torch.long)  # [m, t] the continuations of length t so far
    probs = torch.ones(1, dtype=torch.float64)  # [m]
    for _ in range(steps):
        seqs = torch.cat([ids.expand(len(conts), -1), conts], 1)  # [m, T + t]
        p = warp.probs(lm.forward(target, seqs)[:, -1]).double()  # [m, V]
        rows, tokens = p.nonzero(as_tuple=True)  # [m'] a continuation and a next token it may take
        conts, probs = torch.cat([conts[rows], tokens[:, None]], 1), probs[rows] * p[rows, tokens]
    return dict(zip(map(tuple, conts.tolist()), probs.tolist()))


def follows_target(samples, exact, what="") -> float:
    """Assert that sampled continuations (token-id lists, each as long as `exact`'s keys) follow `exact`
    (`exact_first_tokens`): none the target gives probability 0, chi-square p-value > P_MIN. Returns the p-value."""
    counts = Counter(tuple(s) for s in samples)
    impossible = sorted(set(counts) - set(exact))
    assert not impossible, f"{what}: generated {impossible[:3]}, continuations the target gives probability 0"
    cells = list(exact)
    pvalue = pooled_chi_square(torch.tensor([counts[c] for c in cells]), torch.tensor([exact[c] for c in cells]))
    print(f"{what}: chi-square p-value {pvalue:.3f} over {len(samples)} samples")
    assert pvalue > P_MIN, f"{what}: the sampled tokens do not follow the target (p-value {pvalue:.2g})"
    return pvalue


def pooled_chi_square(counts, probs, min_expected=5.0):
    """Chi-square p-value with cells of expected count < min_expected pooled into one cell."""
    counts, probs = counts.double(), probs.double()
    expected = counts.sum() * probs
    small = expected < min_expected
    c = torch.cat([counts[~small], counts[small].sum()[None]])
    e = torch.cat([expected[~small], expected[small].sum()[None]])
    return chi_square(c, e / e.sum())[1]


def exercise_functions(notebook: str, folder: str = "solutions") -> dict:
    """Run <folder>/<notebook>'s import cell and its exercise cells (each one right before a grader cell) in a
    fresh namespace and return it: the learner's functions as the solution writes them, or as the exercise
    notebook's stubs (folder="exercises")."""
    import nbformat

    nb = nbformat.read(ROOT / folder / notebook, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    ns: dict = {}
    for i, source in enumerate(code[1:], 1):  # code[0] is the setup cell (pip on Colab, the seed)
        if i == 1 or (i + 1 < len(code) and "grading.check_" in code[i + 1]):
            exec(compile(source, f"{folder}/{notebook}, code cell {i}", "exec"), ns)
    return ns


# ---- grader tests: each file lists its answers, the scaffolding is here ---------------------------------------

STUB_HINT = "not implemented yet"  # what every grader says of an exercise left as it is handed out


def stub(*args):
    """An exercise function as it is handed out."""
    raise NotImplementedError("stub: your code here")


def stub_rows(*checks):
    """A `wrong` row per check that takes one function: given `stub`, it must say STUB_HINT."""
    return [(check, stub, STUB_HINT) for check in checks]


def grader_table(wrong=(), right=()):
    """Parametrize a test(check, answer, hint) that calls `assert_grades` over a table of answers:
    `wrong` rows (check, answer, hint), the check must fail naming the mistake; `right` rows (check, answer), the
    check must pass (hint None). An answer that is a tuple is several arguments."""
    rows = [pytest.param(check, answer, hint, id=f"{check.__name__}-{hint[:24]}") for check, answer, hint in wrong]
    rows += [pytest.param(check, answer, None, id=f"{check.__name__}-passes") for check, answer in right]
    return pytest.mark.parametrize("check, answer, hint", rows)


def assert_grades(check, answer, hint, capsys):
    """check(answer) fails with `hint` (plain text, not a regex) in its message, or with hint None passes: the
    last line it prints starts with PASS."""
    args = answer if isinstance(answer, tuple) else (answer,)
    if hint is None:
        check(*args)
        assert capsys.readouterr().out.splitlines()[-1].startswith("PASS")
    else:
        with pytest.raises(AssertionError, match=re.escape(hint)):
            check(*args)


def grader_tests(wrong=(), right=()):
    """A test over a grader table (`grader_table`), each row through `assert_grades`: a file's whole grader test is
    `test_graders = grader_tests(WRONG, RIGHT)`."""
    @grader_table(wrong, right)
    def test_graders(check, answer, hint, capsys):
        assert_grades(check, answer, hint, capsys)
    return test_graders


# The two sampling settings the loops' own chi-square tests run (test_decoding, test_serving), on the small-vocabulary
# pair below: plain T = 1, and a lower temperature with top-p.
SAMPLING_SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.8)]


def settings_id(settings: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in settings.items())


def small_vocab_pair():
    """A one-layer target over 8 tokens and a noisy copy as its draft: every continuation countable."""
    target = tiny_llama(vocab=8, hidden=16, layers=1, seed=10, init=0.5)
    return target, noisy_copy(target, 0.5, seed=11)
