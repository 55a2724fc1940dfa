"""specdec_lab.economics against reference tables, edge cases, brute force, errors.

The reference tables are worked examples of the formulas of Leviathan et al. (2023) and Chen et al. (2023) and of
chapter 02's roofline of Qwen2.5-7B on an H100, printed to 2 decimals; each value must round to the printed one.
Notebook 02 prints the same tables (sections 1 to 4).
"""

import math
import random
from pathlib import Path

import matplotlib
import nbformat
import pytest

from specdec_lab import economics
from specdec_lab.checks import ArgumentError
from specdec_lab.economics import (QWEN25_7B_ON_H100, Roofline, alpha_from_tau, expected_tokens,
                                   expected_tokens_by_depth, optimal_gamma, speedup)


def printed(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


# ---- reference table: tokens per pass for a = 0.5, 0.7, 0.8, 0.9 (one column each), k = 1..8 -----------------
TOKENS_TABLE = {
    0.5: "1.50 1.75 1.88 1.94 1.97 1.98 1.99 2.00",
    0.7: "1.70 2.19 2.53 2.77 2.94 3.06 3.14 3.20",
    0.8: "1.80 2.44 2.95 3.36 3.69 3.95 4.16 4.33",
    0.9: "1.90 2.71 3.44 4.10 4.69 5.22 5.70 6.13",
}


@pytest.mark.parametrize("a", sorted(TOKENS_TABLE))
def test_tokens_per_pass_table(a):
    got = " ".join(printed(expected_tokens(a, k)) for k in range(1, 9))
    assert got == TOKENS_TABLE[a], f"tokens per pass at a={a}, k=1..8: got {got}, expected {TOKENS_TABLE[a]}"


def test_hand_case():
    assert printed(expected_tokens(0.8, 3), 3) == "2.952"


# ---- reference table: speedup at a = 0.8 for k = 1..10, one column per c, and the best k -------------------
SPEEDUP_TABLE = {
    0.05: "1.71 2.22 2.57 2.80 2.95 3.04 3.08 3.09 3.08 3.05",
    0.15: "1.57 1.88 2.04 2.10 2.11 2.08 2.03 1.97 1.90 1.83",
}


@pytest.mark.parametrize("c", sorted(SPEEDUP_TABLE))
def test_speedup_table(c):
    got = " ".join(printed(speedup(0.8, k, c)) for k in range(1, 11))
    assert got == SPEEDUP_TABLE[c], f"speedup at a=0.8, c={c}, k=1..10: got {got}, expected {SPEEDUP_TABLE[c]}"


def test_best_k():
    assert optimal_gamma(0.8, 0.05, max_gamma=10) == 8
    assert optimal_gamma(0.8, 0.15, max_gamma=10) == 5
    assert optimal_gamma(0.8, 0.05) == 8 and optimal_gamma(0.8, 0.15) == 5  # the curves have one peak


# ---- reference table: acceptance falling with depth, a0 = 0.9, decay 0.85, c = 0.1 -------------------------
DEPTH_TABLE = {1: ("1.90", "1.73"), 2: ("2.59", "2.16"), 3: ("3.04", "2.34"), 4: ("3.28", "2.35"),
               5: ("3.40", "2.27"), 6: ("3.45", "2.15"), 7: ("3.46", "2.04"), 8: ("3.47", "1.93")}


@pytest.mark.parametrize("k", sorted(DEPTH_TABLE))
def test_depth_decay_table(k):
    alphas = [0.9 * 0.85**i for i in range(k)]
    tokens = expected_tokens_by_depth(alphas)
    got = (printed(tokens), printed(tokens / (1 + k * 0.1)))
    assert got == DEPTH_TABLE[k], f"depth-decaying acceptance at k={k}: got {got}, expected {DEPTH_TABLE[k]}"


def test_by_depth_with_a_constant_rate_is_the_geometric_sum():
    for a in (0.0, 0.3, 0.77, 1.0):
        for k in range(0, 12):
            assert expected_tokens_by_depth([a] * k) == pytest.approx(expected_tokens(a, k), rel=1e-12)


# ---- reference table: Qwen2.5-7B on an H100 (chapter 02's roofline), a = 0.8, k = 4, c = 0.05 --------------
BATCH_TABLE = {1: ("4.85", "4.85", "2.80"), 4: ("4.91", "4.91", "2.80"), 16: ("5.12", "5.12", "2.80"),
               64: ("5.96", "8.50", "2.07"), 128: ("7.08", "16.69", "1.31"), 256: ("9.32", "33.09", "0.90")}


@pytest.mark.parametrize("batch", sorted(BATCH_TABLE))
def test_roofline_batch_table(batch):
    m = QWEN25_7B_ON_H100
    decode, verify = m.step_time(batch, 1), m.step_time(batch, 5)
    got = (printed(decode * 1e3), printed(verify * 1e3), printed(m.speedup(0.8, 4, 0.05, batch)))
    assert got == BATCH_TABLE[batch], f"batch {batch}: got {got} (decode ms, verify ms, speedup), expected " \
                                      f"{BATCH_TABLE[batch]}"


def test_roofline_example_parameters():
    m = QWEN25_7B_ON_H100
    assert m.params * m.bytes_per_param == pytest.approx(15.2e9)
    assert m.kv_bytes_per_token == 28 * 2 * 4 * 128 * 2
    assert printed(expected_tokens(0.8, 4)) == "3.36"


def test_crossover_batch_is_where_compute_meets_memory():
    m = QWEN25_7B_ON_H100
    b = m.crossover_batch(5)
    assert 16 < b < 64  # the reference table: free at 16, not at 64
    compute = 2 * m.params * b * 5 / (m.efficiency * m.peak_flops)
    memory = (m.params * m.bytes_per_param + m.kv_bytes_per_token * m.context * b) / m.bandwidth
    assert compute == pytest.approx(memory, rel=1e-12)
    assert m.verify_cost(4, math.floor(b)) == pytest.approx(1.0)
    assert m.verify_cost(4, math.ceil(b) + 1) > 1.0
    assert m.crossover_batch(1) > m.crossover_batch(5)
    long_context = Roofline(params=1e9, bandwidth=1e12, peak_flops=1e15, kv_bytes_per_token=1e6, context=10**5)
    assert long_context.crossover_batch(1) == math.inf  # KV reads grow faster than arithmetic: never compute-bound


def test_speedup_below_one_at_large_batch():
    m = QWEN25_7B_ON_H100
    assert m.speedup(0.8, 4, 0.05, 128) > 1 > m.speedup(0.8, 4, 0.05, 256)
    # the best draft shortens as the batch grows: at batch 256 only γ = 1 still gains a little
    best = [optimal_gamma(0.8, 0.05, 16, lambda g, b=b: m.verify_cost(g, b)) for b in (1, 64, 128, 256)]
    assert best == [8, 3, 1, 1], best
    assert 1 < m.speedup(0.8, 1, 0.05, 256) < 1.25


# ---- edge cases -----------------------------------------------------------------------------------------------


def test_alpha_one_and_zero():
    for k in range(0, 20):
        assert expected_tokens(1.0, k) == k + 1  # every draft accepted, plus the bonus token
        assert expected_tokens(0.0, k) == 1.0  # nothing accepted: the target's own token only
        assert speedup(1.0, k, 0.0) == k + 1
        assert speedup(0.0, k, 0.1) == pytest.approx(1 / (1 + 0.1 * k))
    assert expected_tokens(1 - 1e-12, 8) == pytest.approx(9, rel=1e-9)  # no 0/0 cancellation near 1
    assert optimal_gamma(1.0, 0.0, max_gamma=12) == 12
    assert optimal_gamma(0.0, 0.05) == 0  # nothing is accepted: do not speculate
    assert optimal_gamma(0.3, 0.4) == 0  # break-even for γ = 1 is α > c (times verify_cost)


def test_closed_form():
    for a in (0.1, 0.5, 0.9, 0.99):
        for k in (0, 1, 4, 31):
            assert expected_tokens(a, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a), rel=1e-12)


def test_optimal_gamma_against_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        a, c, m = rng.random(), rng.random() * 0.5, rng.randint(1, 40)
        v = 1 + rng.random() if rng.random() < 0.5 else 1.0
        scores = [1.0] + [speedup(a, g, c, v) for g in range(1, m + 1)]
        want = max(range(m + 1), key=lambda g: (scores[g], -g))  # the largest, the shortest among ties
        if want and scores[want] <= 1.0:
            want = 0
        assert optimal_gamma(a, c, m, v) == want, (a, c, m, v)


def test_optimal_gamma_with_a_verify_cost_per_gamma():
    cost = {g: 1 + 0.2 * g for g in range(1, 17)}
    want = max(range(1, 17), key=lambda g: speedup(0.9, g, 0.02, cost[g]))
    assert optimal_gamma(0.9, 0.02, 16, cost.__getitem__) == want
    assert optimal_gamma(0.9, 0.02, 16, cost.__getitem__) < optimal_gamma(0.9, 0.02, 16)


def test_alpha_from_tau_inverts_expected_tokens():
    for a in (0.0, 0.2, 0.55, 0.9, 1.0):
        for k in (1, 3, 8):
            assert alpha_from_tau(expected_tokens(a, k), k) == pytest.approx(a, abs=1e-9)


# ---- errors with messages --------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda: expected_tokens(1.2, 4), r"alpha must be a probability of acceptance, a number in \[0, 1\], got 1.2"),
    (lambda: expected_tokens(-0.1, 4), r"alpha .* in \[0, 1\], got -0.1"),
    (lambda: expected_tokens(float("nan"), 4), r"alpha .* in \[0, 1\], got nan"),
    (lambda: expected_tokens("0.8", 4), r"alpha .* got '0.8'"),
    (lambda: expected_tokens(0.8, -1), r"gamma \(tokens drafted per round\) must be an int >= 0, got -1"),
    (lambda: expected_tokens(0.8, 2.5), r"gamma .* int >= 0, got 2.5"),
    (lambda: expected_tokens_by_depth([0.9, 1.5]), r"alpha .* got 1.5"),
    (lambda: speedup(0.8, 4, -0.05), r"c \(cost of one draft token.*\) must be a number >= 0, got -0.05"),
    (lambda: speedup(0.8, 4, 0.05, verify_cost=0), r"verify_cost .* must be > 0 .*, got 0"),
    (lambda: speedup(0.8, -2, 0.05), r"gamma .* got -2"),
    (lambda: optimal_gamma(1.5, 0.05), r"alpha .* got 1.5"),
    (lambda: optimal_gamma(0.8, -1), r"c \(cost .* got -1"),
    (lambda: optimal_gamma(0.8, 0.05, max_gamma=0), r"max_gamma \(the longest draft to try\) .* int >= 1, got 0"),
    (lambda: alpha_from_tau(6.0, 4), r"tau .* must be in \[1, γ\+1\] = \[1, 5\], got 6.0"),
    (lambda: QWEN25_7B_ON_H100.verify_cost(-1), r"gamma .* got -1"),
    (lambda: economics.tree_speedup([2, 1], 0.8, 0.05, s=-1), r"s \(extra cost of one verified node.*, got -1"),
])
def test_errors_say_what_is_wrong(call, match):
    """Every bad argument raises checks.ArgumentError (a ValueError and a TypeError), naming it and its value."""
    with pytest.raises(ArgumentError, match=match):
        call()


def test_public_api():
    assert {"expected_tokens", "speedup", "optimal_gamma"} <= set(economics.__all__)
    assert "notebooks/02_speedup_economics.ipynb" in economics.__doc__


# ---- the notebook derives the same functions ------------------------------------------------------------------


def test_notebook_derivations_agree_with_the_library(capsys):
    """Run notebooks/02's derivation cells (sections 1 to 4, no plots) and compare what they define."""
    matplotlib.use("Agg")
    nb = nbformat.read(Path(__file__).resolve().parents[1] / "notebooks" / "02_speedup_economics.ipynb", as_version=4)
    end = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## 5."))
    cells = [c.source for c in nb.cells[:end] if c.cell_type == "code"][1:]  # without the setup cell
    ns = {"torch": __import__("torch")}
    for source in cells:
        if not source.startswith("# NBVAL_IGNORE_OUTPUT"):
            exec(compile(source, "notebooks/02", "exec"), ns)
    rng = random.Random(1)
    for _ in range(500):
        a, g, c = rng.choice([0.0, 1.0, rng.random()]), rng.randint(0, 20), rng.random() * 0.4
        assert ns["expected_tokens"](a, g) == pytest.approx(expected_tokens(a, g), rel=1e-9, abs=1e-12)
        assert ns["speedup"](a, g, c) == pytest.approx(speedup(a, g, c), rel=1e-9, abs=1e-12)
        alphas = [rng.random() for _ in range(g)]
        assert ns["expected_tokens_by_depth"](alphas) == pytest.approx(expected_tokens_by_depth(alphas), rel=1e-12)
        if c > 0.01:  # c = 0: float ties between long drafts
            assert ns["optimal_gamma"](a, c) == optimal_gamma(a, c), (a, c)
    m = QWEN25_7B_ON_H100
    for batch in (1, 7, 64, 300):
        for t in (1, 2, 5, 9):
            assert ns["step_time"](batch, t) == pytest.approx(m.step_time(batch, t), rel=1e-12)
        assert ns["crossover_batch"](batch % 9 + 1) == pytest.approx(m.crossover_batch(batch % 9 + 1), rel=1e-12)
    assert "True" in capsys.readouterr().out
