"""Chapter 00's graders: the solution passes, the exercise's stubs and typical unit slips fail with a hint."""
import pytest
from helpers import exercise_functions, grader_tests

from specdec_lab import grading

NOTEBOOK = "00_setup_and_models.ipynb"
GRADERS = {  # grader -> the exercise functions it takes, in order
    grading.check_weight_bytes: ["weight_bytes"],
    grading.check_memory_bound_ms: ["memory_bound_ms"],
    grading.check_free_tokens: ["free_tokens"],
    grading.check_gpu_answer: ["h200_floor_ms"],
}


@pytest.fixture
def solution():
    return exercise_functions(NOTEBOOK)


def test_the_solution_passes(solution, capsys):
    for check, names in GRADERS.items():
        check(*(solution[name] for name in names))
    out = capsys.readouterr().out
    assert out.count("PASS") == len(GRADERS), out


def test_the_stubs_fail_with_the_not_implemented_hint():
    stubs = exercise_functions(NOTEBOOK, "exercises")
    for check, names in GRADERS.items():
        with pytest.raises(AssertionError, match=f"{names[0]} is not implemented yet"):
            check(*(stubs[name] for name in names))


def test_a_solution_on_top_of_a_stub_names_the_stub(solution):
    solution["weight_bytes"] = exercise_functions(NOTEBOOK, "exercises")["weight_bytes"]
    with pytest.raises(AssertionError, match="memory_bound_ms calls weight_bytes, which is still a stub"):
        grading.check_memory_bound_ms(solution["memory_bound_ms"])


WRONG = [
    (grading.check_weight_bytes, lambda n, b: n, "0.5 times the right value. Check your units: bytes per parameter"),
    (grading.check_weight_bytes, lambda n, b: 8 * n * b, "expected 1.61e+10"),
    (grading.check_memory_bound_ms, lambda n, b, gbs: n * b / (gbs * 1e9), "milliseconds vs seconds"),
    (grading.check_memory_bound_ms, lambda n, b, gbs: 1e3 * n * b / gbs, "GB/s is 1e9 bytes per second"),
    (grading.check_memory_bound_ms, lambda n, b, gbs: 1e3 * n / (gbs * 1e9), "bytes read per step"),
    (grading.check_free_tokens, lambda f, bw, b: f * 1e12 * b / (bw * 1e9), "2 FLOPs per parameter"),
    (grading.check_free_tokens, lambda f, bw, b: f * b / (2 * bw * 1e9), "TFLOP/s is 1e12 FLOP per second"),
    (grading.check_free_tokens, lambda f, bw, b: f * 1e12 * b / (2 * bw * 1e12), "GB/s vs TB/s"),
    (grading.check_gpu_answer, lambda: 70.6e9 * 2 / 4.8e12, "milliseconds vs seconds"),
    (grading.check_gpu_answer, lambda: 1e3 * 70.6e9 * 4 / 4.8e12, "bytes per parameter"),
    (grading.check_gpu_answer, lambda: "29.4 ms", "return a number of milliseconds"),
]


test_graders = grader_tests(WRONG)
