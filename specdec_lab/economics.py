"""What speculation buys: tokens per target pass, speedup, the best draft length, and a roofline model
that says when verifying γ+1 tokens stops being free. Derived in notebooks/02_speedup_economics.ipynb.

Units: α = probability that one drafted token is accepted (i.i.d. across positions unless given per
depth); γ = tokens drafted per round; c = cost of one draft token in target decode steps; verify_cost =
cost of one target pass over γ+1 tokens, also in target decode steps (1.0 = verification is free).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real

from specdec_lab import checks

__all__ = ["expected_tokens", "expected_tokens_by_depth", "speedup", "optimal_gamma", "alpha_from_tau",
           "Roofline", "LAUNCH_PER_LAYER", "QWEN25_7B_ON_H100", "tree_nodes", "level_hit_rates",
           "tree_expected_tokens", "tree_speedup"]


# Argument checks (checks.real, checks.integer): each raises checks.ArgumentError naming the argument and what to pass.
PROBABILITY = ("a probability of acceptance, a number in [0, 1]", lambda a: 0 <= a <= 1)
NONNEGATIVE = ("a number >= 0", lambda x: x >= 0)
GAMMA = ("gamma", "tokens drafted per round", 0)  # name, meaning, least value
DRAFT_COST = "c (cost of one draft token, in target decode steps)"


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per target pass] = Σ_{i=0}^{γ} α^i = (1 - α^{γ+1}) / (1 - α); γ + 1 at α = 1."""
    alpha, gamma = checks.real(alpha, "alpha", *PROBABILITY), checks.integer(gamma, *GAMMA)
    return math.fsum(alpha**i for i in range(gamma + 1))  # the sum: exact at α = 1, no 0/0 near it


def expected_tokens_by_depth(alphas: Sequence[float]) -> float:
    """E[tokens per target pass] = 1 + Σ_{i=1}^{γ} Π_{j≤i} α_j, for acceptance α_j at draft depth j."""
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= checks.real(a, "alpha", *PROBABILITY)  # P(the first i drafts are all accepted)
        total += reach
    return total


def speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """S = E[tokens per pass] / (verify_cost + γ·c), against plain decoding's 1 token per target step."""
    c = checks.real(c, DRAFT_COST, *NONNEGATIVE)
    verify_cost = checks.real(verify_cost, "verify_cost (one target pass over γ+1 tokens, in decode steps)",
                              "> 0 (1.0 = verification as cheap as one decode step)", lambda v: v > 0)
    return expected_tokens(alpha, gamma) / (verify_cost + gamma * c)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 32,
                  verify_cost: float | Callable[[int], float] = 1.0) -> int:
    """γ* = argmax_{1≤γ≤max_gamma} S(α, γ, c), or 0 when no γ beats plain decoding (S ≤ 1).

    verify_cost: a number, or a function γ -> cost of verifying γ+1 tokens (see Roofline.verify_cost).
    Ties go to the shorter draft.
    """
    checks.real(alpha, "alpha", *PROBABILITY), checks.real(c, DRAFT_COST, *NONNEGATIVE)
    max_gamma = checks.integer(max_gamma, "max_gamma", "the longest draft to try", 1)
    cost = verify_cost if callable(verify_cost) else (lambda gamma: verify_cost)
    best, best_speedup = 0, 1.0  # γ = 0 is plain decoding
    for gamma in range(1, max_gamma + 1):
        s = speedup(alpha, gamma, c, cost(gamma))
        if s > best_speedup:
            best, best_speedup = gamma, s
    return best


def alpha_from_tau(tau: float, gamma: int) -> float:
    """The α with expected_tokens(α, γ) = τ (bisection): α read back from measured tokens per pass."""
    gamma = checks.integer(gamma, *GAMMA)
    tau = checks.real(tau, "tau (measured tokens per target pass)", f"in [1, γ+1] = [1, {gamma + 1}]",
                      lambda t: 1 <= t <= gamma + 1)
    lo, hi = 0.0, 1.0
    for _ in range(60):  # expected_tokens increases with α
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, gamma) < tau else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Roofline:
    """One model on one accelerator, seen by the roofline: a step takes the longer of its arithmetic and
    its memory reads, plus a fixed overhead. Bytes, seconds, FLOP; efficiency = reachable fraction of peak."""

    params: float  # N, parameters
    bandwidth: float  # BW, bytes per second
    peak_flops: float  # F, FLOP per second (dense, in the weights' dtype)
    bytes_per_param: float = 2.0  # b: 2 for bf16
    kv_bytes_per_token: float = 0.0  # K and V of one token, all layers
    context: int = 1024  # tokens of KV cache each request reads
    efficiency: float = 0.6  # η
    overhead: float = 0.3e-3  # seconds per step: launches, scheduling, sampling

    def step_time(self, batch: int = 1, tokens_per_request: int = 1) -> float:
        """t = max(2·N·B·t_r / (η·F), (N·b + kv·ctx·B) / BW) + overhead, in seconds."""
        compute = 2 * self.params * batch * tokens_per_request / (self.efficiency * self.peak_flops)
        reads = self.params * self.bytes_per_param + self.kv_bytes_per_token * self.context * batch  # bytes
        memory = reads / self.bandwidth
        return max(compute, memory) + self.overhead

    def verify_cost(self, gamma: int, batch: int = 1) -> float:
        """A pass over γ+1 tokens per request, in decode steps: t(B, γ+1) / t(B, 1)."""
        return self.step_time(batch, checks.integer(gamma, *GAMMA) + 1) / self.step_time(batch, 1)

    def speedup(self, alpha: float, gamma: int, c: float, batch: int = 1) -> float:
        """S(B) = E[tokens] · t(B, 1) / (t(B, γ+1) + γ·c·t(B, 1)): the drafts cost c of this batch's step."""
        return speedup(alpha, gamma, c, self.verify_cost(gamma, batch))

    def crossover_batch(self, tokens_per_request: int = 1) -> float:
        """B* where 2·N·B·t_r / (η·F) = (N·b + kv·ctx·B) / BW: above it, extra tokens cost real time."""
        per_request = 2 * self.params * tokens_per_request / (self.efficiency * self.peak_flops)
        per_request -= self.kv_bytes_per_token * self.context / self.bandwidth
        weights = self.params * self.bytes_per_param / self.bandwidth
        return weights / per_request if per_request > 0 else math.inf  # KV reads outgrow the arithmetic


# Kernel launches per decoder layer at batch 1 in eager PyTorch: an assumption (about 10 kernels of about 8 µs
# each), not a measurement. Chapter 00's step estimates and chapter 11's GPU roofline both use it.
LAUNCH_PER_LAYER = 80e-6  # seconds

# The course's roofline example (chapters 02, 04, 08): Qwen2.5-7B (Qwen Team 2024; 7.6B parameters, bf16) on an
# H100 SXM (NVIDIA's data sheet: 3.35 TB/s, 989 dense bf16 TFLOP/s); roofline after Williams et al. 2009.
# KV per token: 28 layers x 2 (K and V) x 4 KV heads x 128 dims x 2 bytes = 57,344 bytes.
QWEN25_7B_ON_H100 = Roofline(params=7.6e9, bandwidth=3.35e12, peak_flops=989e12, bytes_per_param=2,
                             kv_bytes_per_token=57344, context=1024)


# ---- chapter 04: tree drafts ----------------------------------------------------------------------------
# Derived in notebooks/04_tree_attention.ipynb. A static tree is given by its branching: every node of level l
# has branching[l] children (chapter 04's DraftModelDrafter(branching=...)); [1] * γ is the chain of γ drafts.


def tree_nodes(branching: Sequence[int]) -> int:
    """Drafted nodes of the full tree: Σ_l Π_{j≤l} b_j ([2, 2, 1, 1] -> 2 + 4 + 4 + 4 = 14)."""
    total, width = 0, 1
    for b in checks.branching(branching):
        width *= b  # nodes on this level
        total += width
    return total


def level_hit_rates(branching: Sequence[int], hit: float | Sequence[float]) -> list[float]:
    """P(the b_l children of an accepted node hold the target's next token), for each level l.

    hit: a number α = P(the draft's top token is the target's), with b children hitting with probability
    1 - (1 - α)^b (independence: each child a fresh chance α); or the measured top-k hit rates of the draft,
    hit[k-1] = P(the target's token is among the draft's top k), used directly for a level of k children.
    """
    branching = checks.branching(branching)
    if isinstance(hit, Real) and not isinstance(hit, bool):
        alpha = checks.real(hit, "alpha", *PROBABILITY)
        return [1 - (1 - alpha) ** b for b in branching]
    rates = [checks.real(h, "alpha", *PROBABILITY) for h in hit]
    if any(b > len(rates) for b in branching):
        raise checks.ArgumentError(f"branching {branching} needs top-k hit rates up to k = {max(branching)}, "
                                   f"got {len(rates)}: pass {max(branching)} rates (hit[k-1] = P(top k holds the "
                                   "target's token)) or one number α")
    return [rates[b - 1] for b in branching]


def tree_expected_tokens(branching: Sequence[int], hit: float | Sequence[float]) -> float:
    """E[tokens per target pass] = 1 + Σ_d Π_{l≤d} h_l, h_l from `level_hit_rates` (greedy verification).

    Assumes hits at different depths are independent. A chain with hit α gives expected_tokens(α, γ).
    """
    return expected_tokens_by_depth(level_hit_rates(branching, hit))


def tree_speedup(branching: Sequence[int], hit: float | Sequence[float], c: float, s: float = 0.0) -> float:
    """S = E[tokens] / (1 + s·n + c·D): n = tree_nodes, D = depth, in target decode steps.

    The target reads the pending token plus n nodes in one pass costing v(1 + n) ≈ 1 + s·n decode steps (s =
    the extra cost of one verified node, the slope of chapter 04's fit: about 0 in the roofline of a GPU at
    batch 1, larger on a CPU or at large batch); the draft runs one forward per level (its whole frontier at
    once), c decode steps each.
    """
    c = checks.real(c, "c (cost of one draft forward, in target decode steps)", *NONNEGATIVE)
    s = checks.real(s, "s (extra cost of one verified node, in target decode steps)", *NONNEGATIVE)
    return tree_expected_tokens(branching, hit) / (1 + s * tree_nodes(branching) + c * len(branching))
