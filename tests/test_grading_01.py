"""Chapter 01's graders: they pass right answers and name the mistake in wrong ones."""
import torch
from helpers import grader_tests

from specdec_lab import grading


def _residual(p, q):
    positive = (p - q).clamp_min(0)
    mass = positive.sum(-1, keepdim=True)
    return torch.where(mass > 0, positive / mass, p)


def _draw(probs, generator):
    return int(torch.multinomial(probs, 1, generator=generator))


def _rule(accept, replacement):
    """A single-position rule from an accept test and a replacement distribution (for wrong variants)."""

    def accept_or_replace(p, q, x, generator=None):
        u = torch.rand((), generator=generator)
        return x if accept(u, p[x], q[x]) else _draw(replacement(p, q), generator)

    return accept_or_replace


_right = _rule(lambda u, px, qx: u * qx < px, _residual)


def _chain(step, bonus=True, stop=True):
    def verify_chain(p, q, draft, generator=None):
        out = []
        for i, x in enumerate(draft):
            out.append(step(p[i], q[i], x, generator))
            if stop and out[-1] != x:
                return out
        return out + ([_draw(p[len(draft)], generator)] if bonus else [])

    return verify_chain


def _answers(**wrong):
    right = {"accept": [0.8, 1, 1, 0], "p_res": [0, 2 / 3, 1 / 3, 0], "alpha": 0.7, "tv": 0.3}

    def four_token_answers():
        return {**right, **wrong}

    return four_token_answers


def _in_place(p, q):
    p -= q
    return _residual(p.clamp_min(0), torch.zeros_like(p))


def _whole_batch(p, q):
    positive = (p - q).clamp_min(0)
    return positive / positive.sum() if positive.sum() > 0 else p


WRONG = [
    (grading.check_four_token, _answers(accept=[0.8, 2, 1, 0]), "caps at 1"),
    (grading.check_four_token, _answers(accept=[1.25, 1, 1, 0]), "the ratio is p over q"),
    (grading.check_four_token, _answers(accept=[0.8, 1, 1, 0.5]), "p(D) = 0"),
    (grading.check_four_token, _answers(p_res=[0, 0.2, 0.1, 0]), "sums to 0.3: did you normalize"),
    (grading.check_four_token, _answers(p_res=[1 / 3, 0, 0, 2 / 3]), "positive part of q - p"),
    (grading.check_four_token, _answers(alpha=0.3), "is the total variation"),
    (grading.check_four_token, _answers(tv=0.6), "half of it"),
    (grading.check_residual, lambda p, q: (p - q).clamp_min(0), "did you normalize?"),
    (grading.check_residual, lambda p, q: (p - q) / (p - q).abs().sum(-1, keepdim=True), "negative entries"),
    (grading.check_residual, lambda p, q: (p - q).clamp_min(0) / (p - q).clamp_min(0).sum(-1, keepdim=True), "NaN"),
    (grading.check_residual, lambda p, q: _residual(q, p), "built from q - p"),
    (grading.check_residual, _whole_batch, "whole batch"),
    (grading.check_residual, _in_place, "in place"),
    (grading.check_accept_or_replace, _rule(lambda u, px, qx: px >= qx, _residual), "accept when p >= q"),
    (grading.check_accept_or_replace, _rule(lambda u, px, qx: u * qx < px, lambda p, q: p), "follow p, not the residual"),
    (grading.check_accept_or_replace, _rule(lambda u, px, qx: u * qx > px, _residual), "must always be accepted"),
    (grading.check_accept_or_replace, lambda p, q, x, generator=None: torch.tensor([x, x]), "one token id"),
    (grading.check_verify_chain, _chain(_right, bonus=False), "bonus token drawn from p[γ] is missing"),
    (grading.check_verify_chain, _chain(_right, stop=False), "stop at the first rejection"),
    (grading.check_verify_chain, _chain(_rule(lambda u, px, qx: u * qx < px, lambda p, q: p)), "not distributed as p[0]"),
    (grading.check_verify_chain, lambda p, q, draft, generator=None: list(draft) + [0], "bonus counts"),
]

RIGHT = [
    (grading.check_four_token, _answers()),
    (grading.check_residual, _residual),
    (grading.check_accept_or_replace, _right),
    (grading.check_verify_chain, _chain(_right)),
]


test_graders = grader_tests(WRONG, RIGHT)
