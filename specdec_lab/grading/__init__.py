"""Graders for the exercise notebooks, one module per chapter: ch00 (decoding is memory-bound) to ch12
(drafting a block in one pass), with what they share in `_common`.

Each `check_*` takes the learner's function, runs it on cases the notebook does not show, and either
prints one line that starts with "PASS" or raises `AssertionError` with a hint that names the input
and what went wrong. Where the library computes the right answer, the grader takes it from the library;
its own formulas are the typical mistakes, so that a hint can name the one the learner made. Sampling
checks use fixed seeds and Pearson's chi-square test (`chi_square`), failing below `P_VALUE_MIN`.

The notebooks call `grading.check_x(...)`; every grader is importable from here.
"""

from specdec_lab.grading._common import CLOSE, P_VALUE_MIN, call, check, chi_square, counts_of, fmt, passed
from specdec_lab.grading.ch00 import check_free_tokens, check_gpu_answer, check_memory_bound_ms, check_weight_bytes
from specdec_lab.grading.ch01 import (FOUR_P, FOUR_Q, FOUR_TOKENS, check_accept_or_replace, check_four_token,
                                      check_residual, check_verify_chain)
from specdec_lab.grading.ch02 import (SWEEP_ALPHA, SWEEP_C, SWEEP_GAMMAS, check_crossover_batch, check_expected_tokens,
                                      check_measured_speedup, check_optimal_gamma, check_speedup)
from specdec_lab.grading.ch03 import (check_cache_lengths, check_greedy_mismatches, check_is_exact,
                                      check_speculative_step, check_speculative_step_sampled)
from specdec_lab.grading.ch04 import (MULTI_P, MULTI_Q, check_mask_positions, check_multi_round,
                                      check_tree_forward_compact, check_tree_size, check_verify_tree_greedy)
from specdec_lab.grading.ch05 import check_candidate_tree, check_medusa_head, check_medusa_loss
from specdec_lab.grading.ch06 import check_dynamic_tree, check_eagle_forward, check_expand, check_ttt_unroll
from specdec_lab.grading.ch07 import (check_jacobi_iteration, check_lookahead_mask, check_ngram_draft,
                                      check_pool_update)
from specdec_lab.grading.ch08 import check_sglang_flags, check_summarize, check_switch_off
from specdec_lab.grading.ch09 import check_choose_gamma, check_commit_batch
from specdec_lab.grading.ch10 import check_capstone
from specdec_lab.grading.ch11 import (check_compute_bound, check_draft_vocab_token, check_predicted_speedup,
                                      check_sampled_run)
from specdec_lab.grading.ch12 import (check_block_mask, check_block_propose, check_break_even_c,
                                      check_tau_from_acceptance)

# Chapter 04's case generators and the exact distributions of its wrong rules: tests/test_tree_economics.py
# checks notebook 04's derivations with them (under these names, as before the graders became a package).
from specdec_lab.grading.ch04 import _greedy_tree_case, _random_tree, _two_round_outcomes, rooted_walk  # noqa: E402, F401

__all__ = [
    # shared helpers and tolerances
    "CLOSE", "P_VALUE_MIN", "call", "check", "chi_square", "counts_of", "fmt", "passed",
    # ch00: decoding is memory-bound
    "check_weight_bytes", "check_memory_bound_ms", "check_free_tokens", "check_gpu_answer",
    # ch01: rejection sampling
    "FOUR_TOKENS", "FOUR_P", "FOUR_Q", "check_four_token", "check_residual", "check_accept_or_replace",
    "check_verify_chain",
    # ch02: speedup economics
    "SWEEP_ALPHA", "SWEEP_C", "SWEEP_GAMMAS", "check_expected_tokens", "check_speedup", "check_optimal_gamma",
    "check_crossover_batch", "check_measured_speedup",
    # ch03: draft model and target
    "check_cache_lengths", "check_speculative_step", "check_greedy_mismatches", "check_speculative_step_sampled",
    "check_is_exact",
    # ch04: tree drafts and tree attention
    "MULTI_P", "MULTI_Q", "check_mask_positions", "check_verify_tree_greedy", "check_tree_size", "check_multi_round",
    "check_tree_forward_compact",
    # ch05: Medusa
    "check_medusa_head", "check_medusa_loss", "check_candidate_tree",
    # ch06: EAGLE
    "check_eagle_forward", "check_expand", "check_ttt_unroll", "check_dynamic_tree",
    # ch07: drafting without a drafter
    "check_ngram_draft", "check_jacobi_iteration", "check_pool_update", "check_lookahead_mask",
    # ch08: the showdown
    "check_summarize", "check_switch_off", "check_sglang_flags",
    # ch09: serving
    "check_commit_batch", "check_choose_gamma",
    # ch10: the capstone
    "check_capstone",
    # ch11: a real model on your CPU
    "check_compute_bound", "check_predicted_speedup", "check_draft_vocab_token", "check_sampled_run",
    # ch12: drafting a block in one pass
    "check_block_mask", "check_block_propose", "check_break_even_c", "check_tau_from_acceptance",
]
