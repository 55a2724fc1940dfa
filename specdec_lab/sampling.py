"""Token probabilities, the sampling settings target and drafter share (`Warp`), and exact verification.

Derived in notebooks/01_rejection_sampling.ipynb.

Every function takes probabilities over the last dimension (V, the vocabulary) and checks them (`checks.probs`):
entries must be finite and non-negative and each row must sum to 1 within `checks.SUM_TOL`.
All randomness comes from the `generator` argument (a `torch.Generator`), so runs are reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec_lab import checks

def probs_from_logits(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """softmax(logits / T) restricted to the top-k tokens, then to the top-p nucleus; T = 0 is greedy.

    Apply the same call to target and draft logits so the accept test compares like with like.
    Temperature 0 returns a one-hot row on the argmax (top-k and top-p change nothing there).
    """
    temperature, top_k, top_p = checks.temperature(temperature), checks.top_k(top_k), checks.top_p(top_p)
    logits = logits.float()  # [..., V]
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()  # [..., V]
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # [..., 1] the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))  # ties with the k-th are kept
    probs = torch.softmax(logits / temperature, dim=-1)  # [..., V]
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # [..., V]
        mass_above = sorted_probs.cumsum(-1) - sorted_probs  # [..., V] mass of the tokens ranked above
        drop_sorted = mass_above >= top_p  # [..., V] the nucleus already holds top_p without this token
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # [..., V] back to vocabulary order
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)  # [..., V]
    return probs


def residual(p: Tensor, q: Tensor) -> Tensor:
    """normalize(max(p - q, 0)) over the last dim; p itself where p - q has no positive mass.

    The replacement distribution after a rejected draft. When p <= q everywhere (p == q, or the
    mass rounds to zero) a rejection cannot happen, and returning p keeps the result a valid
    distribution that never puts mass where p has none.
    """
    p = checks.probs("p", p)
    q = checks.probs("q", q, shape="the shape of p", size=p.shape)
    return _residual(p, q)


def verify_chain(
    p: Tensor, q: Tensor | None, draft: Sequence[int] | Tensor, generator: torch.Generator | None = None,
    draws: list[float] | None = None,
) -> list[int]:
    """Keep the drafts that pass u * q(x) < p(x) up to the first failure, then emit one more token.

    p: [γ+1, V] target probabilities at the γ draft positions and at the bonus position.
    q: [γ, V] the distributions the drafts were sampled from, or None for a deterministic drafter
       (q is then one-hot on each draft: accept with probability p(x), replace from p without x).
    draft: γ token ids.
    Returns 1 to γ+1 tokens: the accepted drafts, then the replacement drawn from residual(p_n, q_n)
    at the first rejection n, or the bonus token drawn from p_γ when all γ drafts pass.
    draws: a list that receives the γ uniforms u of the accept test (for showing a round; None: not kept).
    """
    p = checks.probs("p", p, ndim=2, shape="[γ+1, V]")  # [γ+1, V]
    vocab = p.shape[1]
    draft = checks.tokens("draft", draft, vocab, p.device)  # [γ]
    gamma = len(draft)
    if p.shape[0] != gamma + 1:
        raise checks.ArgumentError(f"p must have γ+1 = {gamma + 1} rows for {gamma} drafts, got shape {list(p.shape)}")
    if q is None:
        q = F.one_hot(draft, vocab).float()  # [γ, V]
    else:
        q = checks.probs("q", q, shape="[γ, V]", size=(gamma, vocab))  # [γ, V]
    rows = torch.arange(gamma, device=p.device)
    p_x, q_x = p[rows, draft], q[rows, draft]  # [γ], [γ] probability of each draft under p and q
    checks.proposable(q_x, draft, "draft")
    u = torch.rand(gamma, generator=generator, device=p.device)  # [γ]
    if draws is not None:
        draws += u.tolist()
    passed = (u * q_x < p_x).tolist()  # [γ] the accept test at every position
    n = 0
    while n < gamma and passed[n]:  # walk left to right, stop at the first rejection
        n += 1
    last = p[gamma] if n == gamma else _residual(p[n], q[n])  # [V]
    return draft[:n].tolist() + [int(torch.multinomial(last, 1, generator=generator))]


def verify_candidates(
    p: Tensor,
    candidates: Sequence[int] | Tensor,
    q: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[int | None, int]:
    """Multi-round rejection sampling over sibling candidates: the emitted token is distributed as p.

    p: [V] target probabilities at the parent node. candidates: k token ids.
    q: [V] the distribution the candidates were drawn from, independently (with replacement);
       None when they are distinct deterministic picks (the drafter's top-k, say).
    Round i tests candidate i against the current target with the single-position rule; on
    rejection the target becomes residual(target, q_i) (q_i = q, or one-hot on candidate i when q is
    None). Returns (i, candidate i) for the first accepted one, or (None, a draw from the final
    target) when all are rejected.
    """
    p = checks.probs("p", p, ndim=1, shape="[V]")  # [V]
    vocab = p.shape[0]
    cands = checks.tokens("candidates", candidates, vocab, p.device)  # [k]
    k = len(cands)
    if q is None:
        if len(set(cands.tolist())) < k:
            raise checks.ArgumentError(f"with q=None the candidates must be distinct, got {cands.tolist()}")
        qs = F.one_hot(cands, vocab).float()  # [k, V] round i proposes candidate i for sure
    else:
        q = checks.probs("q", q, shape="[V]", size=p.shape)  # [V]
        qs = q.expand(k, vocab)  # [k, V] every candidate was drawn from the same q
    q_x = qs[torch.arange(k, device=p.device), cands]  # [k] probability each candidate was proposed with
    checks.proposable(q_x, cands, "candidate")
    u = torch.rand(k, generator=generator, device=p.device)  # [k]
    for i, (x, bound) in enumerate(zip(cands.tolist(), (u * q_x).tolist())):
        if bound < p[x]:  # u * q(x) < p(x), with p the target of this round
            return i, x
        p = _residual(p, qs[i])  # [V] what this round could not emit
    return None, int(torch.multinomial(p, 1, generator=generator))


@dataclass
class Warp:
    """The sampling settings the target and the drafter share, and the generator every draw comes from.

    Lives here, with the rules it applies, so that drafters (which sample) and the loop (which verifies) both
    take it from below them.

    `probs(logits)` turns logits into the distribution to sample from (temperature 0: one-hot argmax).
    Applying the same Warp to both models keeps p and q comparable (the accept test needs that).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None

    def __post_init__(self):
        self.temperature = checks.temperature(self.temperature)
        self.top_k, self.top_p = checks.top_k(self.top_k), checks.top_p(self.top_p)
        self.generator = checks.generator(self.generator)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: Tensor) -> Tensor:
        """[..., V] logits -> [..., V] probabilities, warped."""
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)

    def sample(self, probs: Tensor) -> Tensor:
        """[B, V] probabilities -> [B, 1] token ids drawn with the shared generator."""
        return torch.multinomial(probs, 1, generator=self.generator)


# ---- helpers ---------------------------------------------------------------------------------


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """residual() without the input checks, for callers that already checked."""
    positive = (p - q).clamp_min(0.0)  # [..., V]
    mass = positive.sum(-1, keepdim=True)  # [..., 1]
    return torch.where(mass > 0, positive / mass, p)  # [..., V] (the 0/0 branch is never selected)
