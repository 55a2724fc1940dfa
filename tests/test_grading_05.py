"""Chapter 05's graders: they pass right answers and name the mistake in wrong ones."""
import torch.nn.functional as F
from helpers import grader_tests
from torch import nn

from specdec_lab import grading
from specdec_lab.tree import choices_parents


def _head(zero=True, residual=True, silu=True, shared=None):
    class Head(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.linear = shared if shared is not None else nn.Linear(hidden, hidden)
            if zero and shared is None:
                nn.init.zeros_(self.linear.weight)
                nn.init.zeros_(self.linear.bias)

        def forward(self, h):
            z = self.linear(h)
            z = F.silu(z) if silu else z
            return h + z if residual else z

    return Head


def _loss(shift_extra=0):
    def medusa_loss(logits, labels):
        out = []
        for k in range(logits.shape[0]):
            s = k + 2 + shift_extra
            pred = logits[k, :, : logits.shape[2] - s]
            out.append(F.cross_entropy(pred.reshape(-1, pred.shape[-1]), labels[:, s:].reshape(-1)))
        return out

    return medusa_loss


def _tree(transpose=False, parents_off=False):
    def candidate_tree(top, choices):
        tokens = [top[c[-1]][len(c) - 1] if transpose else top[len(c) - 1][c[-1]] for c in choices]
        parents = choices_parents(choices)
        if parents_off:
            parents = [p + 1 if p >= 0 else p for p in parents]
        return tokens, parents

    return candidate_tree


WRONG = [
    (grading.check_medusa_head, _head(zero=False), "zero-initialise"),
    (grading.check_medusa_head, _head(residual=False), "residual"),
    (grading.check_medusa_head, _head(silu=False), "SiLU"),
    (grading.check_medusa_head, _head(shared=nn.Linear(16, 16).requires_grad_(False).apply(
        lambda m: (nn.init.zeros_(m.weight), nn.init.zeros_(m.bias)) if isinstance(m, nn.Linear) else None)),
     "share parameters"),
    (grading.check_medusa_loss, _loss(-1), "label shift of 1"),
    (grading.check_medusa_loss, _loss(+1), "label shift of"),
    (grading.check_candidate_tree, _tree(transpose=True), "transposed"),
    (grading.check_candidate_tree, _tree(parents_off=True), "parents"),
]

RIGHT = [
    (grading.check_medusa_head, _head()),
    (grading.check_medusa_loss, _loss()),
    (grading.check_candidate_tree, _tree()),
]


test_graders = grader_tests(WRONG, RIGHT)
