"""Chapter 02's graders: they pass right answers and name the mistake in wrong ones."""
import math
import re

import pytest
import torch
from helpers import STUB_HINT, assert_grades, grader_table, grader_tests, stub

from specdec_lab import economics, grading


def _tokens(terms_offset=0, start=0, alpha_one=True):
    def expected_tokens(alpha, gamma):
        if alpha == 1 and alpha_one:
            return gamma + 1 - start + terms_offset
        return (alpha**start - alpha ** (gamma + 1 + terms_offset)) / (1 - alpha)

    return expected_tokens


def _torch_closed_form(alpha, gamma):
    a = torch.tensor(float(alpha))
    return float((1 - a ** (gamma + 1)) / (1 - a))  # NaN at α = 1


def _speedup(cost):
    def speedup(alpha, gamma, c):
        return economics.expected_tokens(alpha, gamma) / cost(gamma, c)

    return speedup


def _right_speedup(alpha, gamma, c):
    return economics.speedup(alpha, gamma, c)


def _letter(x):
    return lambda: x


def _optimal(first=1, stop_offset=1, zero=True, key="speedup"):
    def optimal_gamma(alpha, c, max_gamma=32):
        score = economics.speedup if key == "speedup" else (lambda a, g, c: economics.expected_tokens(a, g))
        best, best_s = (0, 1.0) if zero else (first, score(alpha, first, c))
        for g in range(first, max_gamma + stop_offset):
            if score(alpha, g, c) > best_s:
                best, best_s = g, score(alpha, g, c)
        return best

    return optimal_gamma


def _left_as_stub():
    """expected_tokens as it is handed out, and a speedup that calls it (named as the learner's are)."""
    def expected_tokens(alpha, gamma):
        raise NotImplementedError("expected_tokens: your code here")

    def speedup(alpha, gamma, c):
        return expected_tokens(alpha, gamma) / (1 + gamma * c)

    return expected_tokens, speedup


def _crossover(efficiency=True, kv=True, tokens=True, flops_per_param=2, inf=True, rounded=False):
    def crossover_batch(m, tokens_per_request):
        eta = m.efficiency if efficiency else 1.0
        t = tokens_per_request if tokens else 1
        per_request = flops_per_param * m.params * t / (eta * m.peak_flops)
        if kv:
            per_request -= m.kv_bytes_per_token * m.context / m.bandwidth
        if per_request <= 0 and inf:
            return math.inf
        b = m.params * m.bytes_per_param / m.bandwidth / per_request
        return float(round(b)) if rounded else b

    return crossover_batch


WRONG = [
    (grading.check_expected_tokens, _tokens(start=1), "counts only the accepted drafts"),
    (grading.check_expected_tokens, _tokens(terms_offset=-1), "stops one term early"),
    (grading.check_expected_tokens, _tokens(terms_offset=1), "one term too many"),
    (grading.check_expected_tokens, lambda a, g: 1 / (1 - a) if a < 1 else g + 1, "infinite geometric sum"),
    (grading.check_expected_tokens, lambda a, g: (1 - a ** (g + 1)) / (1 - a), "return γ + 1"),
    (grading.check_expected_tokens, _torch_closed_form, "returned NaN"),
    (grading.check_speedup, (_speedup(lambda g, c: 1 + c), _letter("b")), "divides by 1 + c"),
    (grading.check_speedup, (_speedup(lambda g, c: 1 + (g + 1) * c), _letter("b")), "divides by 1 + (γ+1)·c"),
    (grading.check_speedup, (_speedup(lambda g, c: 1), _letter("b")), "tokens per pass alone"),
    (grading.check_speedup, (_right_speedup, _letter("a")), "does γ = 8 beat γ = 6"),
    (grading.check_speedup, (_right_speedup, _letter("e")), "one letter, a to d"),
    (grading.check_optimal_gamma, _optimal(stop_offset=0), "include it in the search"),
    (grading.check_optimal_gamma, _optimal(zero=False), "return 0, meaning do not speculate"),
    (grading.check_optimal_gamma, _optimal(key="tokens"), "maximize the speedup"),
    (grading.check_optimal_gamma, lambda a, c, m=32: economics.speedup(a, economics.optimal_gamma(a, c, m), c),
     "not its speedup"),
    (grading.check_crossover_batch, _crossover(efficiency=False), "efficiency × peak_flops"),
    (grading.check_crossover_batch, _crossover(kv=False), "reads its KV cache"),
    (grading.check_crossover_batch, _crossover(tokens=False), "tokens_per_request = 5 tokens"),
    (grading.check_crossover_batch, _crossover(flops_per_param=1), "2 FLOPs per parameter"),
    (grading.check_crossover_batch, _crossover(inf=False), "return math.inf"),
    (grading.check_crossover_batch, _crossover(rounded=True), "not rounded"),
    (grading.check_expected_tokens, _left_as_stub()[0], STUB_HINT),
    (grading.check_speedup, (_left_as_stub()[1], _letter("b")), "speedup calls expected_tokens, which is still a stub"),
]

RIGHT = [
    (grading.check_expected_tokens, economics.expected_tokens),
    (grading.check_expected_tokens, lambda a, g: g + 1 if a == 1 else (1 - a ** (g + 1)) / (1 - a)),
    (grading.check_speedup, (_right_speedup, _letter("(B)"))),
    (grading.check_optimal_gamma, economics.optimal_gamma),
    (grading.check_optimal_gamma, _optimal()),
    (grading.check_crossover_batch, lambda m, t: m.crossover_batch(t)),
    (grading.check_crossover_batch, _crossover()),
]


test_graders = grader_tests(WRONG, RIGHT)


def test_sweep_numbers_printed(capsys):
    grading.check_speedup(_right_speedup, _letter("b"))
    out = capsys.readouterr().out
    assert "γ = 4: 2.77 tokens per pass, speedup 2.311" in out
    assert "γ = 6: 3.06 tokens per pass, speedup 2.353" in out and "speedup 2.285" in out


# ---- exercise 5: measured costs and the predicted speedup (timings replaced by fixed numbers) ------------------

REF_C, REF_V = 0.2, {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 1.2}
RUN = {"plain": 1.3, "spec": 1.0, "spread": 0.0, "alpha": 0.8, "tau_full": 3.3}  # measured speedup 1.3


@pytest.fixture
def fixed_timings(monkeypatch):
    """The grader's own measurements and timed run, replaced by fixed numbers: the tests do not time anything."""
    from specdec_lab.grading import ch02

    monkeypatch.setattr(ch02, "_pair", lambda: (None, None, None))
    monkeypatch.setattr(ch02, "_reference_costs", lambda target, draft, ns, pattern: (REF_C, dict(REF_V)))
    monkeypatch.setattr(ch02, "_timed_run", lambda target, draft, tok, gamma: dict(RUN))
    return ch02


def _costs(c=REF_C, v=None, swap=False):
    def measure_costs(target, draft, ns):
        out = (c, dict(v or REF_V))
        return out[::-1] if swap else out

    return measure_costs


def _predict(cost=lambda v, g, c: v[g + 1] + g * c, bonus=True):
    def predict_speedup(alpha, gamma, c, v):
        return (economics.expected_tokens(alpha, gamma) - (0 if bonus else 1)) / cost(v, gamma, c)

    return predict_speedup


MEASURED_WRONG = [(grading.check_measured_speedup, answer, hint) for answer, hint in [
    ((_costs(), _predict(cost=lambda v, g, c: v[g] + g * c)), "v(γ) instead of v(γ+1)"),
    ((_costs(), _predict(bonus=False)), "speedup without the bonus token"),
    ((_costs(), _predict(cost=lambda v, g, c: c + g * v[g + 1])), "c and v swapped"),
    ((_costs(), _predict(cost=lambda v, g, c: 1 + g * c)), "the verification cost is left out"),
    ((_costs(), lambda a, g, c, v: economics.speedup(a, g, c, v[g + 3])), "KeyError"),
    ((_costs(swap=True), _predict()), "c and v swapped"),
    ((_costs(c=1 / REF_C), _predict()), "inverted"),
    ((_costs(c=REF_C * 1.6), _predict()), "MINIMUM over many repeats (not the mean"),
    ((_costs(v={n: x * 1.5 if n > 1 else 1.0 for n, x in REF_V.items()}), _predict()), "v(2) = 1.58"),
    ((_costs(v={n: x * 1.1 for n, x in REF_V.items()}), _predict()), "v(1) = 1.1"),
    ((_costs(v={1: 1.0}), _predict()), "a key for every n"),
    ((stub, stub), STUB_HINT),
    ((stub, _predict()), STUB_HINT),
]]


@grader_table(MEASURED_WRONG)
def test_measured_speedup_graded(fixed_timings, check, answer, hint, capsys):
    assert_grades(check, answer, hint, capsys)


def test_measured_speedup_passes_right_answers(fixed_timings, capsys):
    grading.check_measured_speedup(_costs(), _predict())
    grading.check_measured_speedup(_costs(c=REF_C * 1.2, v={n: 1 + (x - 1) / 1.2 for n, x in REF_V.items()}),
                                   lambda a, g, c, v: economics.speedup(a, g, c, v[g + 1]))
    out = capsys.readouterr().out
    assert out.count("PASS") == 2 and "measured 1.30x" in out


def test_verification_is_not_free_when_it_was_measured_dear(fixed_timings, monkeypatch):
    """The tolerance applies to v(n) - 1: v(5) = 1.05 ("verification is free") fails against a measured 1.3,
    which a tolerance on v itself (a quarter either way: 1.04 to 1.63) would let pass."""
    dear = {1: 1.0, 2: 1.1, 3: 1.17, 4: 1.23, 5: 1.3}
    monkeypatch.setattr(fixed_timings, "_reference_costs", lambda target, draft, ns, pattern: (REF_C, dict(dear)))
    with pytest.raises(AssertionError, match=re.escape("v(5) = 1.05")):
        grading.check_measured_speedup(_costs(v={**dear, 5: 1.05}), _predict())
    assert not fixed_timings._v_accepted(1.05, [1.3, 1.3, 1.3])
    assert fixed_timings._v_accepted(1.3, [1.3, 1.3, 1.3]) and fixed_timings._v_accepted(1.35, [1.28, 1.3, 1.31])


def test_measured_speedup_tolerance_follows_the_spread(fixed_timings, monkeypatch):
    """A c that fails where the grader's own measurements agree passes where they spread as widely."""
    wide = iter([(REF_C, dict(REF_V)), (REF_C * 1.5, dict(REF_V)), (REF_C, dict(REF_V))])
    with pytest.raises(AssertionError, match="MINIMUM"):
        grading.check_measured_speedup(_costs(c=REF_C * 1.4), _predict())
    monkeypatch.setattr(fixed_timings, "_reference_costs", lambda target, draft, ns, pattern: next(wide))
    grading.check_measured_speedup(_costs(c=REF_C * 1.4), _predict())


def test_measured_speedup_checks_the_run(fixed_timings, monkeypatch):
    """Costs within tolerance whose prediction lands above the clock beyond the margin the grader measured."""
    slow = {n: 3.0 if n > 1 else 1.0 for n in REF_V}  # the grader's own v(n)
    monkeypatch.setattr(fixed_timings, "_timed_run", lambda *a: dict(RUN, plain=0.5))  # measured 0.5x
    monkeypatch.setattr(fixed_timings, "_reference_costs", lambda target, draft, ns, pattern: (REF_C, dict(slow)))
    low = _costs(c=REF_C / 1.249, v={n: 1 + (x - 1) / 1.249 for n, x in slow.items()})  # just inside the cost tolerance
    with pytest.raises(AssertionError, match="too high for this run"):
        grading.check_measured_speedup(low, _predict())
    grading.check_measured_speedup(_costs(c=REF_C, v=slow), _predict())
