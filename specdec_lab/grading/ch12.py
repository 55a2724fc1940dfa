"""Chapter 12's graders (exercises/12_block_drafting.ipynb): a block of drafts from one forward.

1. `check_block_mask`: what each placeholder may attend to in the block's one forward, bool [γ - 1, n_ctx + γ - 1]:
   every pair (the root, the last of them, included), the placeholders before it and itself. Hints for a row for
   the root, columns for the placeholders only, a placeholder blind to itself, to the root or to the placeholders
   before it, one that sees those after it, a float mask.
2. `check_block_propose`: the block's proposal from its γ rows of logits. Greedy: each row's top-1, q None. Sampled:
   q = softmax(logits / T) row by row, each depth's token drawn from its own row (a chi-square per depth), and the
   path through the course's verifier (`sampling.verify_chain`) distributed as the target's (a chi-square over
   every continuation of a small Markov target): a draw that reuses one uniform for every depth has the right
   marginals and fails there.
3. `check_break_even_c`: c* = v (τ_e - τ_b) / (γ τ_b - τ_e), math.inf when γ τ_b <= τ_e; at c* the two speedups of
   chapter 02's formula are equal. Hints for the difference turned round, γ left out, v left out, no inf.
4. `check_tau_from_acceptance`: 1 + Σ_k Π_{i<=k} a_i (`economics.expected_tokens_by_depth`) on given rates, then on
   the conditional acceptance measured from seeded chains of a tiny random pair: exactly 1 + the mean accepted
   drafts of the rounds that drafted all γ. Hints for a sum without the product, a missing 1, a_k^k, Π_{i<k}.

The library is the reference where it has the formula (`economics.expected_tokens_by_depth`, `eagle.BlockDrafter`'s
way of drawing); the hints come from the wrong versions the graders compute beside it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import torch
from torch import Tensor

from specdec_lab import economics
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.grading._common import (P_VALUE_MIN, call, check, chi_square, fmt, grader, number, one_thread,
                                         passed, seeded, tiny_pair)
from specdec_lab.sampling import verify_chain


# ---- exercise 12.1: the block's mask ---------------------------------------------------------------------------


def reference_mask(n_ctx: int, gamma: int) -> Tensor:
    """bool [γ - 1, n_ctx + γ - 1]: placeholder j (row j) sees the n_ctx pairs and placeholders 0..j."""
    rows = torch.arange(gamma - 1)[:, None]  # [γ - 1, 1]
    keys = torch.arange(n_ctx + gamma - 1)[None, :]  # [1, n_ctx + γ - 1]
    return keys < n_ctx + rows + 1  # the causal mask's last γ - 1 rows


MASK_CASES = [(5, 4), (1, 2), (3, 3), (7, 5), (2, 6), (4, 1)]  # (n_ctx, γ): γ = 1 has no placeholder


@grader
def check_block_mask(block_mask: Callable[[int, int], Tensor]) -> None:
    """Exercise 12.1: block_mask(n_ctx, gamma) -> bool [γ - 1, n_ctx + γ - 1], True where a placeholder may attend."""
    for n, gamma in MASK_CASES:
        case = f"block_mask({n}, {gamma})"
        got = call(block_mask, n, gamma)
        want = reference_mask(n, gamma)
        check(isinstance(got, Tensor), f"{case} should return a torch tensor, got {type(got).__name__}")
        shape = tuple(got.shape)
        check(shape != (gamma, n + gamma - 1), f"{case} has shape {list(shape)}: one row per PLACEHOLDER, "
              f"γ - 1 = {gamma - 1} rows (the root is the last pair; its row is the causal mask's, as in EAGLE's "
              "forward)")
        check(shape != (gamma - 1, gamma - 1), f"{case} has shape {list(shape)}: the columns are every "
              f"key of the forward, the {n} pairs first and then the {gamma - 1} placeholders")
        if gamma == 1:
            check(shape == (0, n), f"{case} has shape {list(shape)}: γ = 1 drafts only the root's guess, so there "
                  f"is no placeholder: shape [0, {n}]")
        check(shape == tuple(want.shape), f"{case} has shape {list(shape)}, expected [γ - 1, n_ctx + γ - 1] = "
              f"{list(want.shape)}")
        check(got.dtype == torch.bool, f"{case} has dtype {got.dtype}: return a bool mask (True = may attend). "
              "scaled_dot_product_attention ADDS a float mask to the scores, so 1.0 and 0.0 would not mask anything")
        if torch.equal(got, want):
            continue
        ph = got[:, n:]  # [γ - 1, γ - 1] placeholders among themselves
        check(bool(got[:, :n - 1].all()) if n > 1 else True, f"{case}: a placeholder must see every pair of the "
              f"context (columns 0..{n - 1}): they hold what the target verified")
        check(bool(got[:, n - 1].all()), f"{case}: no placeholder sees column {n - 1}, the last pair (the root): "
              "its output is the block's first guess and the placeholders continue right after it")
        check(bool(ph.diagonal().all()), f"{case}: a placeholder must see itself (the diagonal), as every query of a "
              "causal forward does")
        check(not bool(ph.triu(1).any()), f"{case}: placeholder j sees placeholders after it (above the diagonal); "
              "it may read only those before it, as the training unroll's mask (`ttt_mask`) allows")
        check(bool(ph.tril().all()), f"{case}: placeholder j must also see the placeholders BEFORE it (below the "
              "diagonal): in training, step j at position p read steps 1..j at positions p - j + 1..p")
        check(False, f"{case} = {got.int().tolist()}, expected {want.int().tolist()}")
    passed(f"exercise 1: each placeholder sees the pairs, the root included, and the placeholders up to itself, on "
           f"{len(MASK_CASES)} shapes")


# ---- exercise 12.2: the block's proposal ----------------------------------------------------------------------

PROPOSE_RUNS = 4000  # seeded proposals of the sampled check
MARKOV_V = 5  # the Markov target's vocabulary: every continuation of 3 tokens countable (125 cells)


def _markov(seed: int = 3) -> Tensor:
    """A small Markov target: P[a, b] = p(next token b | previous token a), [V, V]."""
    return torch.softmax(torch.randn(MARKOV_V, MARKOV_V, generator=seeded(seed)) * 1.2, -1)


def _proposal(fn: Callable, logits: Tensor, temperature: float) -> tuple[list[int], Tensor | None]:
    got = call(fn, logits.clone(), temperature)
    check(isinstance(got, (tuple, list)) and len(got) == 2, f"block_propose should return (tokens, q), got {got!r}")
    tokens, q = got
    gamma = logits.shape[0]
    try:
        tokens = [int(t) for t in torch.as_tensor(tokens).reshape(-1).tolist()]
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"tokens should be γ token ids (a list or a [γ] tensor), got {tokens!r}") from None
    check(len(tokens) == gamma, f"logits has γ = {gamma} rows, one per depth; you returned {len(tokens)} tokens")
    return tokens, q


@grader
def check_block_propose(block_propose: Callable[[Tensor, float], tuple]) -> None:
    """Exercise 12.2: block_propose(logits [γ, V], temperature) -> (tokens [γ], q [γ, V] or None when greedy)."""
    g = seeded(12)
    for gamma, V in [(4, 10), (2, 7), (1, 5)]:  # greedy: each depth's top-1
        logits = torch.randn(gamma, V, generator=g) * 2
        tokens, q = _proposal(block_propose, logits, 0.0)
        want = logits.argmax(-1).tolist()
        check(tokens != [want[0]] * gamma or gamma == 1 or want == [want[0]] * gamma, "greedy: every depth got "
              "depth 1's top token; row j of logits is depth j + 1's own guess: take each row's argmax")
        check(tokens == want, f"greedy, logits of shape {[gamma, V]}: tokens {tokens}, expected each row's argmax "
              f"{want} (argmax over the vocabulary, dim -1)")
        check(q is None, "greedy: return q = None: a deterministic drafter's tokens are verified by matching the "
              "target's argmax, and the verifier treats q None as one-hot on each token")
    logits = torch.randn(3, MARKOV_V, generator=g) * 1.5  # [γ, V] the block's three depths
    for T in (1.0, 0.7, 1.5):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            _, q = _proposal(block_propose, logits, T)
        check(isinstance(q, Tensor) and tuple(q.shape) == tuple(logits.shape), f"at temperature {T}, q should be "
              f"a [γ, V] = {list(logits.shape)} tensor: the distribution each depth's token was drawn from, got "
              f"{getattr(q, 'shape', q)!r}")
        want = torch.softmax(logits / T, -1)
        if not torch.allclose(q.float(), want, atol=1e-5):
            check(not torch.allclose(q.float(), torch.log_softmax(logits / T, -1), atol=1e-5), f"T = {T}: q holds "
                  "log-probabilities; the verifier needs probabilities (softmax)")
            check(not torch.allclose(q.float(), torch.softmax(logits, -1), atol=1e-5), f"T = {T}: q is "
                  "softmax(logits): divide the logits by the temperature first")
            check(not torch.allclose(q.float(), want[:1].expand_as(want), atol=1e-5), f"T = {T}: every row of q "
                  "is depth 1's; row j is softmax(logits[j] / T), each depth its own")
            check(False, f"T = {T}: q = {fmt(q)}, expected softmax(logits / T) row by row = {fmt(want)}")
    T, P = 0.7, _markov()
    q_want = torch.softmax(logits / T, -1)  # [γ, V]
    gen, drawn, paths = seeded(21), [], []
    with torch.random.fork_rng(), one_thread():
        torch.manual_seed(5)
        for _ in range(PROPOSE_RUNS):
            tokens, q = _proposal(block_propose, logits, T)
            drawn.append(tokens)
            root = 0  # the pending token: the target's rows are p(. | the token before)
            p = P[[root] + tokens]  # [γ + 1, V] the target at each depth given the drafts before it, and the bonus
            out = verify_chain(p, q.float(), tokens, gen)  # accepted drafts, then one corrected or bonus token
            while len(out) < 3:  # the next rounds go on from the target's own distribution
                out.append(int(torch.multinomial(P[out[-1]], 1, generator=gen)))
            paths.append(tuple(out[:3]))
    drawn = torch.tensor(drawn)  # [runs, γ]
    for j in range(3):
        counts = torch.bincount(drawn[:, j], minlength=MARKOV_V)
        pvalue = chi_square(counts, q_want[j])[1]
        check(pvalue > P_VALUE_MIN, f"T = {T}: depth {j + 1}'s tokens over {PROPOSE_RUNS} proposals do not follow "
              f"q[{j}] (chi-square p-value {pvalue:.2g}; counts {counts.tolist()}, expected "
              f"{fmt(q_want[j] * PROPOSE_RUNS, 4)}): draw each depth's token from its own row of q "
              "(torch.multinomial(q[j], 1)), not its argmax")
    exact = {}
    for a in range(MARKOV_V):  # the target's own joint of the first 3 tokens after the pending token 0
        for b in range(MARKOV_V):
            for c in range(MARKOV_V):
                exact[(a, b, c)] = float(P[0, a] * P[a, b] * P[b, c])
    cells = list(exact)
    seen = Counter(paths)
    pvalue = chi_square(torch.tensor([seen[c] for c in cells]), torch.tensor([exact[c] for c in cells]))[1]
    check(pvalue > P_VALUE_MIN, f"T = {T}: each depth's tokens follow its q, but the verified text does not follow "
          f"the target (chi-square p-value {pvalue:.2g} over {PROPOSE_RUNS} runs): the draws of different depths "
          "must be INDEPENDENT (one torch.multinomial per row, or one call on the [γ, V] q), never one shared "
          "uniform: then q[j] is no longer the probability of depth j's token given the draws before it")
    passed(f"exercise 2: greedy takes each depth's top-1; sampled, depth j is drawn from q[j] = softmax(logits[j] / T) "
           f"on its own, and the verified text follows the target (chi-square p-value {pvalue:.3f})")


# ---- exercise 12.3: the break-even draft cost --------------------------------------------------------------------


def reference_break_even(tau_block: float, tau_chain: float, gamma: int, v: float = 1.0) -> float:
    """c above which τ_b / (v + c) > τ_e / (v + γ c): v (τ_e - τ_b) / (γ τ_b - τ_e); inf when γ τ_b <= τ_e."""
    den = gamma * tau_block - tau_chain
    return math.inf if den <= 0 else v * (tau_chain - tau_block) / den


BREAK_EVEN_CASES = [  # (τ_b, τ_e, γ, v)
    (2.0, 2.6, 4, 1.0), (1.9, 2.5, 3, 1.4), (1.8, 3.0, 4, 1.3), (2.2, 2.2, 4, 1.0), (2.4, 2.2, 3, 1.2),
    (1.2, 3.8, 3, 1.0), (1.5, 3.0, 2, 1.1), (2.0, 2.0, 1, 1.0),
]


@grader
def check_break_even_c(break_even_c: Callable[..., float]) -> None:
    """Exercise 12.3: break_even_c(tau_block, tau_chain, gamma, v=1.0) -> the c above which the block is faster."""
    for tau_b, tau_e, gamma, v in BREAK_EVEN_CASES:
        case = f"break_even_c({tau_b}, {tau_e}, {gamma}, v={v})"
        want = reference_break_even(tau_b, tau_e, gamma, v)
        try:
            got = number(break_even_c, tau_b, tau_e, gamma, v)
        except AssertionError as e:
            if "divided by zero" in str(e):
                check(False, f"{case} divided by zero: there γ·τ_b = τ_e, and the block can never be faster (it "
                      "would need c > (something) / 0): return math.inf when γ·τ_b <= τ_e")
            raise
        if want == math.inf:
            check(got == math.inf, f"{case} = {got:.4g}: here γ·τ_b = {gamma * tau_b:.4g} <= τ_e = {tau_e}, so "
                  "τ_b (v + γc) > τ_e (v + c) holds for no c >= 0: the block can never win; return math.inf")
            continue
        if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            continue
        check(got != math.inf, f"{case} = inf, but here γ·τ_b = {gamma * tau_b:.4g} > τ_e = {tau_e}: the block wins "
              f"once c > {want:.4g}. Is γ missing? The chain pays γ draft forwards (γ c), the block one (c), so the "
              "test is on γ τ_b - τ_e")
        check(not math.isclose(got, -want, rel_tol=1e-9), f"{case} = {got:.4g}: the difference is turned round; "
              "the block must make up τ_e - τ_b, so c* = v (τ_e - τ_b) / (γ τ_b - τ_e)")
        check(not math.isclose(got, want / v, rel_tol=1e-9) or v == 1, f"{case} = {got:.4g} leaves out v: both "
              "rounds pay the same verify pass v, and c* scales with it")
        wrong = tau_b - tau_e
        check(wrong == 0 or not math.isclose(got, v * (tau_e - tau_b) / wrong, rel_tol=1e-9), f"{case} = {got:.4g} "
              "leaves out γ: the chain pays γ draft forwards (γ c), the block one (c); the denominator is γ τ_b - τ_e")
        check(False, f"{case} = {got:.4g}, expected {want:.4g} = v (τ_e - τ_b) / (γ τ_b - τ_e)")
    got = number(break_even_c, 2.0, 2.6, 4)  # v left at its default
    check(math.isclose(got, reference_break_even(2.0, 2.6, 4), rel_tol=1e-9), f"break_even_c(2.0, 2.6, 4) = "
          f"{got:.4g}: v defaults to 1.0 (free verification)")
    tau_b, tau_e, gamma, v = BREAK_EVEN_CASES[1]
    c = number(break_even_c, tau_b, tau_e, gamma, v)
    chain, block = tau_e / (v + gamma * c), tau_b / (v + c)
    passed(f"exercise 3: c* = v (τ_e - τ_b) / (γ τ_b - τ_e), inf when γ τ_b <= τ_e; at τ_b {tau_b}, τ_e {tau_e}, "
           f"γ {gamma}, v {v}: c* = {c:.4f}, where both speedups are {chain:.4f} and {block:.4f}")


# ---- exercise 12.4: τ from conditional acceptance by depth ------------------------------------------------------


def acceptance_by_depth(gens, gamma: int) -> tuple[list[float], float]:
    """(a_1..a_γ, 1 + mean accepted) over the rounds of `gens` (Generation objects) that drafted all γ tokens:
    a_k = P(depth k accepted | depths 1..k-1 accepted), the share of rounds that got past depth k among those that
    got to it."""
    accepted = [a for g in gens for a, d in zip(g.accept_lengths, g.draft_lengths) if d == gamma]
    reach = [sum(a >= k for a in accepted) for k in range(gamma + 1)]  # rounds whose first k drafts passed
    rates = [reach[k] / reach[k - 1] if reach[k - 1] else 0.0 for k in range(1, gamma + 1)]
    return rates, 1 + sum(accepted) / len(accepted)


@grader
def check_tau_from_acceptance(tau_from_acceptance: Callable[[list[float]], float]) -> None:
    """Exercise 12.4: tau_from_acceptance([a_1, ..., a_γ]) -> 1 + Σ_k Π_{i<=k} a_i."""
    for rates in ([0.8, 0.6, 0.4], [0.7] * 5, [0.9, 0.5, 0.7, 0.2], [1.0, 1.0, 1.0], [0.0, 0.9], [0.65], []):
        case = f"tau_from_acceptance({rates})"
        got = number(tau_from_acceptance, list(rates))
        want = economics.expected_tokens_by_depth(rates)
        if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            continue
        check(not math.isclose(got, 1 + sum(rates), rel_tol=1e-9), f"{case} = {got:.4g} adds the rates: a round "
              "reaches depth k only if depths 1..k-1 were all accepted, so term k is the product a_1 ... a_k")
        check(not math.isclose(got, want - 1, rel_tol=1e-9, abs_tol=1e-12), f"{case} = {got:.4g} counts only the "
              "accepted drafts: add the token the target emits itself in every pass (the 1)")
        check(not math.isclose(got, 1 + sum(a ** (k + 1) for k, a in enumerate(rates)), rel_tol=1e-9),
              f"{case} = {got:.4g} raises each rate to its depth: the rates differ by depth, term k is the "
              "product a_1 ... a_k of the first k")
        shifted = 1 + sum(math.prod(rates[:k]) for k in range(len(rates)))
        check(not math.isclose(got, shifted, rel_tol=1e-9), f"{case} = {got:.4g}: the product of term k runs over "
              "i <= k, depth k's own rate included")
        check(False, f"{case} = {got:.4g}, expected 1 + Σ_k Π_(i<=k) a_i = {want:.4g}")
    target, noisy, _ = tiny_pair(3)
    gamma, g = 4, seeded(4)
    with one_thread():
        prompts = [torch.randint(0, target.config.vocab_size, (1, 8), generator=g) for _ in range(4)]
        gens = [generate(target, ids, DraftModelDrafter(noisy, gamma), max_new_tokens=48) for ids in prompts]
    rates, want = acceptance_by_depth(gens, gamma)
    got = number(tau_from_acceptance, rates)
    check(math.isclose(got, want, rel_tol=1e-9), f"on rates measured from {len(prompts)} greedy runs "
          f"({fmt(rates)}), you give {got:.4g}; those rounds emitted {want:.4g} tokens each on average")
    tau = sum(len(x.tokens) for x in gens) / sum(x.target_calls for x in gens)
    passed(f"exercise 4: τ = 1 + Σ_k Π_(i<=k) a_i; on measured rates {fmt(rates)} it gives {got:.3f}, the mean tokens "
           f"of the rounds that drafted all {gamma} (τ over every pass, the prompt's included: {tau:.3f})")
