"""Medusa: extra heads on the target's last hidden state guess the tokens after next; verified as a tree.

Derived in notebooks/05_medusa.ipynb.

The target's LM head reads the last hidden state h_t and predicts token t+1. Medusa head k (k = 0, 1, ...)
reads the same h_t and predicts token t+k+2: a residual block h + SiLU(W h + b) (W zero-initialised, so a
fresh head starts as a copy of the target's own next-token prediction), then an LM head. As published (Cai et
al. 2024), each head has its own trainable LM head, initialised from the target's: on the zoo target a copy is
4096 x 256 = 1.05M parameters per head, 16 times its residual block, and the four of them are most of the 8.9 MB
of shipped heads. `MedusaHeads(..., shared_lm_head=True)` (train-heads --lm-head shared) shares the target's
LM head, frozen, instead: the residual block alone then has to move h_t to where that head reads off t+k+2.

The heads never see each other's guesses: head 2 guesses token t+4 without knowing what heads 0 and 1
guessed for t+2 and t+3. So we take each head's top-k and verify a tree of combinations ("choices"):
the path (i0, i1, ...) is head 0's i0-th best token, then head 1's i1-th best under it, and so on.

    heads = MedusaHeads.from_zoo(target)            # trained by `specdec-lab train-zoo`; for your own target:
    heads = MedusaHeads.from_pretrained(target, folder)   # trained by `specdec-lab train-heads --method medusa`
    gen = generate(target, ids, MedusaDrafter(heads), max_new_tokens=64)

The heads' loss (head k scored k + 2 tokens ahead) and their training are in `training` (head_loss, train_heads),
beside the loop that fits them.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec_lab import checks, vocab, weights
from specdec_lab.drafters import Drafter
from specdec_lab.masks import require_custom_masks
from specdec_lab.sampling import Warp
from specdec_lab.tree import DraftTree, choices_parents

__all__ = ["MedusaHead", "MedusaHeads", "MedusaDrafter", "DEFAULT_CHOICES"]

MEDUSA_DIR = Path(__file__).parent / "data" / "zoo" / "tiny" / "medusa"
TOPK = range(1, 11)  # the validation accuracies saved with trained heads: top-1 to top-10, their tree's input

# A hand-made 24-node tree of depth 4 for four heads: wide at the first levels, where the heads are right least
# often, narrow deep down. Heads saved by train-heads or train-zoo carry a tree tuned to their own measured
# accuracies (`tune.medusa_choices`), which MedusaDrafter uses instead; this one is for heads without one.
DEFAULT_CHOICES = [(0,), (1,), (2,), (3,),
                   (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (3, 0),
                   (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 2, 0), (2, 0, 0),
                   (0, 0, 0, 0), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0), (0, 0, 0, 1), (0, 0, 2), (1, 1, 0)]
DEFAULT_CHOICES = sorted(DEFAULT_CHOICES, key=lambda c: (len(c), c))


class MedusaHead(nn.Module):
    """h [.., H] -> h + SiLU(W h + b) [.., H]: the residual block; the LM head is applied by MedusaHeads."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # a fresh head is the identity: it predicts what the target does
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: Tensor) -> Tensor:
        return h + F.silu(self.linear(h))  # [.., H]


class MedusaHeads(nn.Module):
    """K heads over the target's last hidden state; forward(h [.., H]) -> logits [K, .., V] for tokens t+2..t+K+1.

    lm_head: the target's output layer (nn.Linear H -> V). shared_lm_head=True keeps it frozen and shared;
    False gives each head its own trainable copy (the reference design, and what the zoo ships).
    """

    def __init__(self, hidden: int, num_heads: int, lm_head: nn.Module, shared_lm_head: bool = True,
                 draft_vocab: int | None = None):
        super().__init__()
        if num_heads < 1:
            raise checks.ArgumentError(f"num_heads must be >= 1, got {num_heads}")
        self.heads = nn.ModuleList(MedusaHead(hidden) for _ in range(num_heads))  # distinct modules, not [m] * K
        self.choices = None  # the tree tuned for these heads, once loaded with one (from_pretrained)
        self.vocab = lm_head.out_features
        # score only the draft vocabulary d2t [Vd] (specdec_lab.vocab; a shared LM head only), or every token
        self.register_buffer("d2t", None if draft_vocab is None else torch.arange(draft_vocab))
        if draft_vocab is not None and not shared_lm_head:
            raise checks.ArgumentError("a draft vocabulary reads rows of the target's LM head: use shared_lm_head=True")
        if shared_lm_head:
            self.lm_heads = None
            object.__setattr__(self, "_lm_head", lm_head)  # not a submodule: not trained, not saved
            lm_head.requires_grad_(False)
        else:
            self.lm_heads = nn.ModuleList(copy.deepcopy(lm_head).requires_grad_(True) for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def forward(self, h: Tensor, draft: bool = False) -> Tensor:
        """h [.., H] -> logits [K, .., V] (draft=True: [K, .., Vd] over the draft vocabulary, for training)."""
        outs = []
        for k, head in enumerate(self.heads):
            lm_head = self._lm_head if self.lm_heads is None else self.lm_heads[k]
            weight = lm_head.weight if self.d2t is None else self._rows(lm_head)  # [V or Vd, H]
            bias = None if self.d2t is not None else lm_head.bias
            outs.append(F.linear(head(h).to(weight.dtype), weight, bias))  # fp32 heads may read a bf16 head
        logits = torch.stack(outs)  # [K, .., Vd]
        return logits if draft or self.d2t is None else vocab.scatter(logits, self.d2t, self.vocab)  # [K, .., V]

    def _rows(self, lm_head) -> Tensor:
        """The shared head's rows for d2t, [Vd, H], taken once."""
        if getattr(self, "_cut", None) is None or self._cut.dtype != lm_head.weight.dtype:
            self._cut = lm_head.weight.detach()[self.d2t.to(lm_head.weight.device)]
        return self._cut

    def use_vocab(self, tokens: Tensor) -> None:
        """Score only `tokens` [Vd] (token ids) from now on."""
        self.d2t = torch.as_tensor(tokens, dtype=torch.long).sort().values.to(self.heads[0].linear.weight.device)
        self._cut = None

    @classmethod
    def for_target(cls, target, num_heads: int = 4, shared_lm_head: bool = True,
                   draft_vocab: int | None = None) -> MedusaHeads:
        """Fresh (untrained) heads sized for `target`, on its device and dtype."""
        heads = cls(target.config.hidden_size, num_heads, target.get_output_embeddings(), shared_lm_head,
                    draft_vocab)
        return heads.to(device=target.device, dtype=target.dtype)

    @classmethod
    def from_pretrained(cls, target, folder: Path | str) -> MedusaHeads:
        """Heads saved in `folder` (heads.safetensors, config.json) for this target, by `specdec-lab train-heads`
        or `train-zoo`; refused, with what to do, when they were trained for another target."""
        checks.model(target, "target", "pass the target model the heads were trained for")
        meta = weights.read_config(folder, target, "medusa")
        heads = cls.for_target(target, meta["num_heads"], shared_lm_head=not meta.get("own_lm_heads", False),
                               draft_vocab=meta.get("draft_vocab"))
        heads = weights.load(heads, folder, "medusa", target)
        if "choices" in meta:  # the tree tuned for them (heads saved before tuning existed have none)
            heads.choices = [tuple(c) for c in meta["choices"]]
        return heads

    @classmethod
    def from_zoo(cls, target, path: Path | str = MEDUSA_DIR) -> MedusaHeads:
        """The heads shipped with the zoo (trained on the frozen zoo target by `specdec-lab train-zoo`)."""
        checks.model(target, "target", "pass the zoo target: target, draft, tok = zoo.load_pair('tiny')")
        return cls.from_pretrained(target, path)

    def save(self, path: Path | str, meta: dict | None = None) -> None:
        """heads.safetensors (bfloat16: half the bytes) and config.json, the layout from_pretrained reads. Own
        LM heads (shared_lm_head=False) are saved with the heads; a shared one is the target's, never saved."""
        head = self._lm_head if self.lm_heads is None else self.lm_heads[0]
        info = {"num_heads": self.num_heads, "hidden": head.in_features, "vocab": head.out_features,
                "own_lm_heads": self.lm_heads is not None, "draft_vocab": None if self.d2t is None else len(self.d2t)}
        weights.save(self, path, "medusa", {**info, **(meta or {})})


# ---- drafting --------------------------------------------------------------------------------------


class MedusaDrafter(Drafter):
    """Drafts a tree from the heads' top-k lists at the target's last hidden state.

    needs_hidden: generate() hands `commit` the target's hidden states of the tokens it just committed; the
    heads read the last one (the state whose LM-head output was this step's bonus or corrected token, which
    is the next pending token). The first call has no hidden state yet and drafts nothing (the prefill).
    choices: the tree (see module docstring); its depth must not exceed the number of heads. None: the tree
    saved with the heads (`tune.medusa_choices` on their measured accuracies, by train-heads), else DEFAULT_CHOICES.
    Medusa's typical acceptance, a LOSSY opt-in that accepts any candidate the target finds plausible enough, is a
    rule of the verifier: `generate(target, ids, MedusaDrafter(heads), typical=(0.09, 0.3))` (see tree.verify_tree).
    """

    needs_hidden = True

    def __init__(self, heads: MedusaHeads, choices: Sequence[Sequence[int]] | None = None, typical=None):
        checks.instance(heads, MedusaHeads, "heads", "MedusaDrafter.from_zoo(target), or "
                        "MedusaDrafter(MedusaHeads.from_zoo(target))")
        if typical is not None:  # where the setting lived once
            raise checks.ArgumentError(f"typical={typical!r} is a rule of the verifier, not of the drafter: pass it "
                                       "to generate(target, ids, MedusaDrafter(heads), typical=(0.09, 0.3))")
        if choices is None:  # the heads' own tuned tree, if they were saved with one
            choices = heads.choices or DEFAULT_CHOICES
        self.heads, self.choices = heads, checks.choices(choices)
        self.parents = choices_parents(self.choices)
        depth = max(len(c) for c in self.choices)
        if depth > heads.num_heads:
            raise checks.ArgumentError(f"the choices are {depth} deep but there are only {heads.num_heads} heads: "
                                       f"keep paths of at most {heads.num_heads} ranks")
        self.topk = max(max(c) for c in self.choices) + 1
        self.h = None  # [H] the target's last hidden state

    @classmethod
    def from_zoo(cls, target, **kwargs) -> MedusaDrafter:
        """The drafter with the heads shipped for the zoo target (`MedusaHeads.from_zoo`)."""
        return cls(MedusaHeads.from_zoo(target), **kwargs)

    @classmethod
    def from_pretrained(cls, target, folder: Path | str, **kwargs) -> MedusaDrafter:
        """The drafter with heads trained for `target` by `specdec-lab train-heads --method medusa`."""
        return cls(MedusaHeads.from_pretrained(target, folder), **kwargs)

    def start(self, target, ids: Tensor) -> None:
        if target.config.hidden_size != self.heads.heads[0].linear.in_features:
            raise checks.ArgumentError("these Medusa heads were trained for another target (hidden sizes differ): "
                                       "train heads for this one (specdec-lab train-heads --target ...)")
        require_custom_masks(target, "Medusa's tree")
        self.h = None

    @torch.no_grad()
    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        if self.h is None or limit < 1:
            return DraftTree([], [])
        top = self.heads(self.h).topk(self.topk, -1).indices.tolist()  # [K, topk] each head's best tokens
        keep = [i for i, c in enumerate(self.choices) if len(c) <= limit]  # a pass emits <= depth + 1 tokens
        tokens = [top[len(self.choices[i]) - 1][self.choices[i][-1]] for i in keep]
        parents = choices_parents([self.choices[i] for i in keep])
        return DraftTree(tokens, parents)  # q=None: deterministic picks, exact under sampling too

    def commit(self, ids: Tensor, accepted: int, path: list[int], hidden) -> None:
        self.h = hidden[-1][-1]  # [H] the last committed-and-fed position's final hidden state

