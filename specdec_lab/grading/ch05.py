"""Chapter 05's graders (exercises/05_medusa.ipynb): Medusa heads and their candidate tree.

1. `check_medusa_head`: a head is h + SiLU(W h + b), the identity while W and b are zero, and two heads share
   no parameters; with trained weights it must equal the library's `medusa.MedusaHead` holding the same ones.
2. `check_medusa_loss`: head k at position t is scored against labels[:, t + k + 2] (`training.head_loss`); a
   loss matching another shift gets a hint naming the shift.
3. `check_candidate_tree`: each node (a path of ranks) takes its head's ranked token, its parent is the path
   one shorter (`tree.choices_parents`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec_lab.grading._common import call, check, grader, passed, seeded
from specdec_lab.medusa import MedusaHead
from specdec_lab.training import head_loss
from specdec_lab.tree import choices_parents


@grader
def check_medusa_head(Head: Callable[[int], torch.nn.Module]) -> None:
    """Exercise 05.1: Head(hidden) maps h [.., H] to h + SiLU(W h + b), with W and b zero at initialisation."""
    head = call(Head, 16)
    check(isinstance(head, torch.nn.Module), f"Head(16) should return an nn.Module, got {type(head).__name__}")
    h = torch.randn(3, 5, 16, generator=seeded(0))  # [B, T, H]
    out = call(head, h)
    check(isinstance(out, Tensor) and out.shape == h.shape,
          f"the head must keep the shape [B, T, H] = {list(h.shape)}, got {getattr(out, 'shape', out)}")
    check(not torch.allclose(out, torch.zeros_like(h), atol=1e-6), "a fresh head returns zeros: the output lacks "
          "the residual; return h + SiLU(W h + b)")
    check(torch.allclose(out, h, atol=1e-6), "a fresh head must return h unchanged (zero-initialise the Linear's "
          "weight AND bias): it then starts from the target's own prediction instead of noise")
    linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    check(len(linears) == 1 and linears[0].in_features == linears[0].out_features == 16,
          "the residual block has one Linear(hidden, hidden); the LM head is applied after it, not inside")
    with torch.no_grad():
        linears[0].weight.copy_(torch.randn(16, 16, generator=seeded(1)) * 0.3)
        linears[0].bias.copy_(torch.randn(16, generator=seeded(2)) * 0.3)
    with torch.random.fork_rng():  # building a Linear draws from the global generator: leave it as it was
        reference = MedusaHead(16)
    reference.linear = linears[0]  # the library's head with the learner's trained weights
    want = reference(h)
    out = call(head, h)
    if not torch.allclose(out, want, atol=1e-5):
        check(not torch.allclose(out, F.silu(linears[0](h)), atol=1e-5),
              "the output lacks the residual: return h + SiLU(W h + b), not SiLU(W h + b)")
        check(not torch.allclose(out, h + linears[0](h), atol=1e-5), "apply SiLU to W h + b before adding h")
        check(False, "with trained weights the head should return h + SiLU(W h + b)")
    a, b = call(Head, 16), call(Head, 16)
    check(a.state_dict().keys() == b.state_dict().keys() and all(
        x.data_ptr() != y.data_ptr() for x, y in zip(a.parameters(), b.parameters())),
        "two heads must not share parameters (build a new Linear in each Head)")
    passed("exercise 1: a Medusa head is h + SiLU(W h + b), the identity at initialisation")


@grader
def check_medusa_loss(medusa_loss: Callable[[Tensor, Tensor], list]) -> None:
    """Exercise 05.2: per-head cross-entropy, head k at position t against labels[:, t + k + 2]."""
    g = seeded(3)
    logits = torch.randn(3, 2, 11, 13, generator=g)  # [K, B, T, V]
    labels = torch.randint(0, 13, (2, 11), generator=g)  # [B, T]
    got = call(medusa_loss, logits, labels)
    check(isinstance(got, (list, tuple)) and len(got) == 3,
          f"medusa_loss should return one loss per head (a list of 3 here), got {got!r}")
    got = [float(x) for x in got]
    _, want = head_loss(logits, labels)
    for k in range(3):
        if abs(got[k] - want[k]) > 1e-4:
            for shift in (0, 1, k + 1, k + 3):
                pred = logits[k, :, : 11 - shift] if shift else logits[k]
                wrong = F.cross_entropy(pred.reshape(-1, 13), labels[:, shift:].reshape(-1)).item()
                check(abs(got[k] - wrong) > 1e-4, f"head {k}: your loss matches a label shift of {shift}; head k "
                      f"predicts the token k + 2 places ahead (the target's own head predicts 1 ahead), so "
                      f"position t is scored against labels[:, t + {k + 2}]")
            check(False, f"head {k}: loss {got[k]:.4f}, expected {want[k]:.4f} (mean cross-entropy over the positions "
                  f"that have a label, t < T - {k + 2})")
    passed("exercise 2: head k is trained on the token k + 2 positions ahead")


@grader
def check_candidate_tree(candidate_tree: Callable) -> None:
    """Exercise 05.3: candidate_tree(top, choices) -> (tokens, parents) from each head's top-k list."""
    top = [[11, 12, 13], [21, 22, 23], [31, 32, 33]]  # head k's ranked guesses
    cases = [[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)],
             [(0,), (1,), (2,), (0, 0), (2, 1), (2, 1, 2)],
             [(0,), (0, 0), (0, 0, 0)]]
    for choices in cases:
        got = call(candidate_tree, top, choices)
        check(isinstance(got, (tuple, list)) and len(got) == 2, f"return (tokens, parents), got {got!r}")
        tokens, parents = [list(map(int, x)) for x in got]
        want_tokens = [top[len(c) - 1][c[-1]] for c in choices]
        want_parents = choices_parents(choices)
        if tokens != want_tokens:
            check(tokens != [top[c[-1]][len(c) - 1] for c in choices], f"choices {choices}: the tokens look "
                  "transposed: a path of length d + 1 ends at head d, so its token is top[d][rank]")
            check(False, f"choices {choices}: tokens {tokens}, expected {want_tokens} (node (i0, .., id) takes head "
                  "d's id-th best token)")
        check(parents == want_parents, f"choices {choices}: parents {parents}, expected {want_parents} (the parent "
              "of path c is the index of path c[:-1] in choices, -1 for a one-element path)")
    passed("exercise 3: each node takes its head's ranked token; its parent is the path one shorter")
