"""Chapter 12's graders: they pass right answers and name the mistake in wrong ones."""
import math

import torch
from helpers import grader_tests, stub_rows

from specdec_lab import economics, grading
from specdec_lab.grading.ch12 import reference_break_even, reference_mask


def _mask(rows="placeholders", root=True, itself=True, before=True, after=False, dtype=torch.bool, keys="all"):
    """block_mask as a learner might write it; each keyword is one typical mistake."""
    def block_mask(n_ctx, gamma):
        k = gamma - 1
        pairs = torch.ones(k, n_ctx, dtype=torch.bool)
        if not root:
            pairs[:, -1] = False
        own = torch.ones(k, k, dtype=torch.bool) if after else torch.ones(k, k, dtype=torch.bool).tril()
        if not itself:
            own &= ~torch.eye(k, dtype=torch.bool)
        if not before:
            own &= torch.eye(k, dtype=torch.bool)
        mask = torch.cat([pairs, own], 1) if keys == "all" else own
        if rows == "with root":
            mask = torch.ones(k + 1, n_ctx + k, dtype=torch.bool).tril(n_ctx - 1)
        return mask.to(dtype)
    return block_mask


def _propose(greedy="rows", q_form="softmax", temperature=True, draw="independent", q_rows="own"):
    """block_propose as a learner might write it; each keyword is one typical mistake."""
    def block_propose(logits, temperature_):
        if temperature_ == 0:
            if greedy == "first row":
                return [int(logits[0].argmax())] * logits.shape[0], None
            if greedy == "with q":
                return logits.argmax(-1).tolist(), torch.softmax(logits, -1)
            return logits.argmax(-1).tolist(), None
        z = logits / temperature_ if temperature else logits
        q = torch.softmax(z, -1)  # [γ, V]
        if q_rows == "first":
            q = q[:1].expand_as(q)
        if draw == "argmax":
            tokens = q.argmax(-1)
        elif draw == "shared uniform":  # one uniform for every depth: right marginals, dependent draws
            u = torch.rand(1)
            tokens = (q.cumsum(-1) < u).sum(-1).clamp(max=q.shape[1] - 1)
        elif draw == "untempered":
            tokens = torch.multinomial(torch.softmax(logits, -1), 1)[:, 0]
        else:
            tokens = torch.multinomial(q, 1)[:, 0]
        if q_form == "log":
            q = torch.log_softmax(z, -1)
        return tokens.tolist(), q
    return block_propose


def _break_even(inf=True, sign=1, gamma_in=True, v_in=True):
    def break_even_c(tau_block, tau_chain, gamma, v=1.0):
        g = gamma if gamma_in else 1
        den = g * tau_block - tau_chain
        if inf and den <= 0:
            return math.inf
        return (v if v_in else 1.0) * sign * (tau_chain - tau_block) / den
    return break_even_c


def _tau(kind="right"):
    def tau_from_acceptance(rates):
        if kind == "sum":
            return 1 + sum(rates)
        if kind == "no one":
            return sum(math.prod(rates[:k]) for k in range(1, len(rates) + 1))
        if kind == "power":
            return 1 + sum(a ** (k + 1) for k, a in enumerate(rates))
        if kind == "shifted":
            return 1 + sum(math.prod(rates[:k]) for k in range(len(rates)))
        total, reach = 1.0, 1.0
        for a in rates:
            reach *= a
            total += reach
        return total
    return tau_from_acceptance


def test_reference_mask_is_the_causal_forwards_last_rows():
    for n, gamma in [(5, 4), (3, 2), (4, 1)]:
        full = torch.ones(n + gamma - 1, n + gamma - 1, dtype=torch.bool).tril()
        assert torch.equal(reference_mask(n, gamma), full[n:])


def test_reference_break_even_makes_the_two_speedups_equal():
    for tau_b, tau_e, gamma, v in [(2.0, 2.6, 4, 1.0), (1.9, 2.5, 3, 1.4)]:
        c = reference_break_even(tau_b, tau_e, gamma, v)
        assert math.isclose(tau_b / (v + c), tau_e / (v + gamma * c), rel_tol=1e-12)
        assert tau_b / (v + 1.1 * c) > tau_e / (v + gamma * 1.1 * c)  # above c*, the block is faster


WRONG = [
    (grading.check_block_mask, _mask(rows="with root"), "one row per PLACEHOLDER"),
    (grading.check_block_mask, _mask(keys="placeholders"), "the columns are every key"),
    (grading.check_block_mask, _mask(root=False), "the last pair (the root)"),
    (grading.check_block_mask, _mask(itself=False), "must see itself"),
    (grading.check_block_mask, _mask(before=False), "placeholders BEFORE it"),
    (grading.check_block_mask, _mask(after=True), "sees placeholders after it"),
    (grading.check_block_mask, _mask(dtype=torch.float32), "return a bool mask"),
    (grading.check_block_propose, _propose(greedy="first row"), "every depth got depth 1's top token"),
    (grading.check_block_propose, _propose(greedy="with q"), "return q = None"),
    (grading.check_block_propose, _propose(temperature=False), "divide the logits by the temperature"),
    (grading.check_block_propose, _propose(q_form="log"), "q holds log-probabilities"),
    (grading.check_block_propose, _propose(q_rows="first"), "every row of q is depth 1's"),
    (grading.check_block_propose, _propose(draw="argmax"), "not its argmax"),
    (grading.check_block_propose, _propose(draw="untempered"), "do not follow q[0]"),
    (grading.check_block_propose, _propose(draw="shared uniform"), "must be INDEPENDENT"),
    (grading.check_break_even_c, _break_even(inf=False), "return math.inf"),
    (grading.check_break_even_c, _break_even(sign=-1), "the difference is turned round"),
    (grading.check_break_even_c, _break_even(gamma_in=False), "Is γ missing?"),
    (grading.check_break_even_c, _break_even(v_in=False), "leaves out v"),
    (grading.check_tau_from_acceptance, _tau("sum"), "adds the rates"),
    (grading.check_tau_from_acceptance, _tau("no one"), "add the token the target emits itself"),
    (grading.check_tau_from_acceptance, _tau("power"), "raises each rate to its depth"),
    (grading.check_tau_from_acceptance, _tau("shifted"), "depth k's own rate included"),
    *stub_rows(grading.check_block_mask, grading.check_block_propose, grading.check_break_even_c,
               grading.check_tau_from_acceptance),
]

RIGHT = [
    (grading.check_block_mask, _mask()),
    (grading.check_block_mask, reference_mask),
    (grading.check_block_mask, lambda n, g: torch.ones(n + g - 1, n + g - 1, dtype=torch.bool).tril()[n:]),
    (grading.check_block_propose, _propose()),
    (grading.check_break_even_c, _break_even()),
    (grading.check_break_even_c, reference_break_even),
    (grading.check_tau_from_acceptance, _tau()),
    (grading.check_tau_from_acceptance, economics.expected_tokens_by_depth),
]


test_graders = grader_tests(WRONG, RIGHT)
