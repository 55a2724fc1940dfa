"""Drafters: everything that proposes tokens for the target to verify.

Derived in notebooks/03_draft_target.ipynb.

A drafter writes `propose()`; `decoding.generate` calls, for each sequence:

    drafter.start(target, prompt_ids)            once, before the first step (check the pair, reset state)
    tree = drafter.propose(ids, warp, limit)     every step: a DraftTree of at most `limit` tokens after ids
    drafter.commit(ids, accepted)                after verification: ids = the committed text now, of which
                                                 the last `accepted` + 1 tokens are new this step

A stateless drafter (prompt lookup, say) only writes `propose`. A drafter that samples its tokens sets
`tree.q` to the warped distributions it sampled from (`warp.probs`, `warp.sample`); a deterministic one
leaves it None.

Also here: two ways to make a draft model out of the target itself, `early_exit_model` (its first layers)
and `fake_quantized_model` (its weights rounded to 4 bits).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from specdec_lab import checks, lm
from specdec_lab.decoding import Warp
from specdec_lab.tree import DraftTree, branching_parents, compact, tree_depths, tree_mask

__all__ = ["Drafter", "DraftModelDrafter", "early_exit_model", "fake_quantized_model", "fake_quantize"]


class Drafter:
    """Base class: override `propose`; `start` and `commit` do nothing unless the drafter keeps state."""

    def start(self, target, ids: Tensor) -> None:
        """A new sequence begins with prompt ids [1, T]; check compatibility with `target`, reset state."""

    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        """Draft at most `limit` tokens to follow the committed ids [1, T]."""
        raise NotImplementedError

    needs_hidden = False  # True: generate() passes commit() the target's hidden states (Medusa, EAGLE)

    def commit(self, ids: Tensor, accepted: int, path: list[int] | None = None, hidden=None) -> None:
        """The verifier kept `accepted` drafts plus one token of its own; ids [1, T'] is the committed text.

        path: the accepted nodes' indices in the proposed DraftTree (for a chain, 0 .. accepted - 1).
        hidden (only when needs_hidden): HF's tuple of per-layer states, each [m, H], at the m committed
        tokens the target read this pass (the uncached committed ones, then the accepted nodes); the last
        row is the state whose LM head gave this pass's final token.
        """


def _vocab(model) -> int:
    return model.config.get_text_config().vocab_size


class DraftModelDrafter(Drafter):
    """A small model with the target's vocabulary drafts a chain of γ tokens, or a tree.

    Chain (gamma=γ, chapter 03): one cached forward per token. The draft keeps its own KV cache under the
    same invariant as the target's: it holds the committed text except the last token, which `propose`
    feeds first. After a rejection `commit` crops the cache back to len(committed) - 1. When all γ drafts
    are accepted the cache lags one more token (the draft never fed its own last draft), so the next
    `propose` feeds two tokens, that draft and the target's bonus token.

    Tree (branching=[b0, b1, ...], chapter 04): level l gives every frontier node b_l children, the top-b_l
    tokens (greedy) or b_l i.i.d. draws from q (sampling), and each level is ONE draft forward over the
    whole frontier with a tree mask. `commit` keeps the accepted path's K/V by gather. branching=[1] * γ is
    the chain of gamma=γ.

    Context: the draft never reads past its own position table. A draft with a shorter context than the
    target's drafts fewer levels near its end, then none (plain decoding finishes the text); a prompt longer
    than the draft's context is refused in `start`.
    """

    def __init__(self, draft, gamma: int | None = None, branching: list[int] | None = None):
        checks.model(draft, "draft", "DraftModelDrafter takes the draft model itself, e.g. "
                     "AutoModelForCausalLM.from_pretrained(name) or zoo.load_pair('tiny')[1]")
        if branching is not None:
            branching = checks.branching(branching)
            if gamma is not None and gamma != len(branching):
                raise checks.ArgumentError(f"gamma={gamma} and branching={branching} disagree: pass one of them "
                                           "(a chain of γ tokens is branching=[1] * γ)")
        else:
            # γ = 3: near the peak of chapter 03's measured curve for the zoo pair (flat there; fastest γ varies)
            gamma = 3 if gamma is None else gamma
            gamma = checks.integer(gamma, "gamma", "tokens drafted per step", 1, "for plain decoding pass drafter=None")
            branching = [1] * gamma
        self.model, self.branching, self.gamma, self.cache = draft, branching, len(branching), None
        self.context = lm.context_length(draft) or float("inf")  # the draft's position table
        self.tree, self.base = None, 0  # the last proposed tree and the committed length it was drafted after

    def start(self, target, ids: Tensor) -> None:
        vt, vd = _vocab(target), _vocab(self.model)
        if vt != vd:
            raise ValueError(f"target and draft have different vocabularies ({vt} vs {vd} token ids), so their "
                             "token ids cannot be compared: use a draft trained with the target's tokenizer "
                             "(zoo.load_pair returns matching pairs; zoo.check_pair explains a mismatch)")
        if ids.shape[1] > self.context:
            raise ValueError(f"the prompt has {ids.shape[1]} tokens, more than the draft's context of {self.context}: "
                             f"shorten it to {self.context} tokens or fewer")
        if any(b > 1 for b in self.branching):  # a tree: both models read it through a custom mask
            lm.require_custom_masks(target, "tree drafts")
            lm.require_custom_masks(self.model, "tree drafts")
        self.cache = lm.new_cache(self.model)

    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        # a pass emits at most depth + 1 tokens; drafting depth d reads the draft at positions up to T + d - 2,
        # so near the end of a shorter draft context the tree loses its last levels (then drafting stops)
        branching = self.branching[: max(min(limit, self.context - ids.shape[1] + 1), 0)]
        if not branching:
            self.tree = None  # nothing drafted: commit only crops
            return DraftTree.chain([])
        past = lm.cache_len(self.cache)
        assert ids.shape[1] - 2 <= past <= ids.shape[1] - 1 or past == 0, f"draft cache {past}, text {ids.shape[1]}"
        self.base = ids.shape[1]
        if all(b == 1 for b in branching):
            self.tree = self._chain(ids[:, past:], warp, len(branching))
        else:
            self.tree = self._tree(ids[:, past:], warp, branching)
        return self.tree

    def _chain(self, x: Tensor, warp: Warp, n: int) -> DraftTree:
        # x: [1, 1] the pending token; [1, 2] after an all-accepted step; the prompt at first
        tokens, qs = [], []
        for _ in range(n):
            logits = lm.forward_last(self.model, x, self.cache, 1)[:, -1]  # [1, V]
            if warp.greedy:
                x = logits.argmax(-1, keepdim=True)  # [1, 1]
            else:
                q = warp.probs(logits)  # [1, V] the same warping as the target's
                x = warp.sample(q)  # [1, 1]
                qs.append(q)
            tokens.append(x)
        # the cache now holds len(ids) + n - 1 positions: the last draft was never fed
        return DraftTree.chain(torch.cat(tokens, 1)[0].tolist(), torch.cat(qs) if qs else None)  # q: [n, V]

    def _tree(self, x: Tensor, warp: Warp, branching: list[int]) -> DraftTree:
        logits = lm.forward_last(self.model, x, self.cache, 1)[0]  # [1, V] after the last committed token
        tokens, parents, qs, frontier = [], [], [], [-1]  # frontier: the nodes `logits` rows belong to
        for level, b in enumerate(branching):
            if level:  # feed the frontier: one forward, each node sees the text, its ancestors and itself
                m, fed = len(frontier), len(tokens) - len(frontier)  # frontier = the last m nodes
                mask = torch.cat([torch.ones(m, self.base, dtype=torch.bool),
                                  tree_mask(parents)[-m:]], 1)  # [m, base + all nodes]
                positions = torch.full((m,), self.base + level - 1)  # [m] all at this depth
                assert lm.cache_len(self.cache) == self.base + fed
                frontier_ids = torch.tensor([tokens[-m:]], device=x.device)  # [1, m]
                logits = lm.forward(self.model, frontier_ids, self.cache, positions, mask)[0]  # [m, V]
            if warp.greedy:
                kids = logits.topk(b, -1).indices  # [m, b] distinct picks
            else:
                q = warp.probs(logits)  # [m, V]
                kids = torch.multinomial(q, b, replacement=True, generator=warp.generator)  # [m, b] i.i.d.
                qs.append(q.repeat_interleave(b, 0))  # [m*b, V] each child's proposal row
            new = []
            for row, parent in enumerate(frontier):
                for token in kids[row].tolist():
                    new.append(len(tokens))
                    tokens.append(token)
                    parents.append(parent)
            frontier = new
        # the cache holds base + (nodes above the last level): the last level was never fed
        return DraftTree(tokens, parents, torch.cat(qs) if qs else None)

    def commit(self, ids: Tensor, accepted: int, path: list[int] | None = None, hidden=None) -> None:
        if self.tree is not None and not self.tree.is_chain:
            fed = sum(d < self.tree.depth - 1 for d in tree_depths(self.tree.parents))  # the last level never was
            compact(self.cache, self.base, path or [], fed)  # keep the text and the accepted nodes' K/V
        lm.crop(self.cache, ids.shape[1] - 1)  # after a rejection: forget the drafts past the accepted ones
        # all accepted: nothing to crop, the cache holds len(ids) - 2 (one behind)


# ---- drafts made from the target itself -------------------------------------------------------------


def _decoder(model):
    """(the inner decoder with .layers, .embed_tokens, .norm) of a Llama-style causal LM, or a clear error."""
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("layers", "embed_tokens", "norm")):
        raise NotImplementedError(f"{type(model).__name__} is not a Llama-style model (model.model.layers, "
                                  "embed_tokens, norm); early exit is written for those")
    return inner


def early_exit_model(target, layers: int):
    """The target cut after its first `layers` decoder layers, then its final norm and LM head.

    The modules are SHARED with the target (no copy): the result costs about layers / L of a target pass.
    Unless the target was trained with early-exit losses, the intermediate hidden state is not what the
    final norm and LM head expect, and the drafts are poor.
    """
    inner = _decoder(target)
    total = len(inner.layers)
    if not 1 <= layers < total:
        raise ValueError(f"layers must be in [1, {total - 1}] for a target with {total} layers, got {layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    for key in ("layer_types", "mlp_layer_types"):  # per-layer lists must match the new depth
        if isinstance(getattr(config, key, None), list):
            setattr(config, key, getattr(config, key)[:layers])
    with torch.device("meta"):
        model = type(target)(config)  # the skeleton; every module is replaced by the target's below
    model.model.embed_tokens = inner.embed_tokens
    model.model.layers = nn.ModuleList(inner.layers[:layers])
    model.model.norm = inner.norm
    model.model.rotary_emb = inner.rotary_emb
    model.lm_head = target.lm_head
    model.generation_config = copy.deepcopy(target.generation_config)
    return model.eval()


def fake_quantize(weight: Tensor, bits: int = 4, group_size: int = 32) -> Tensor:
    """Round each group of `group_size` input weights to 2**bits levels (symmetric), returned in fp32.

    scale = max|w| / (2**(bits-1) - 1) per group; w -> clamp(round(w / scale)) * scale. The stored int4
    values would take 1/8 of fp32's memory; here we only simulate the rounding error.
    """
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"in_features {in_features} is not a multiple of group_size {group_size}")
    levels = 2 ** (bits - 1) - 1  # 7 for int4: values -7..7
    w = weight.float().reshape(out_features, in_features // group_size, group_size)  # [out, groups, g]
    scale = w.abs().amax(-1, keepdim=True).clamp_min(1e-12) / levels  # [out, groups, 1]
    q = (w / scale).round().clamp(-levels, levels)  # [out, groups, g] integers
    return (q * scale).reshape(out_features, in_features).to(weight.dtype)  # [out, in]


def fake_quantized_model(target, bits: int = 4, group_size: int = 32):
    """A deep copy of the target with every Linear inside its decoder layers fake-quantized.

    Embeddings and the LM head stay in full precision (common practice). The copy still computes in fp32,
    so it runs exactly as fast as the target: on hardware without int4 kernels it is a costly draft.
    """
    model = copy.deepcopy(target)
    with torch.no_grad():
        for layer in _decoder(model).layers:
            for module in layer.modules():
                if isinstance(module, nn.Linear):
                    module.weight.copy_(fake_quantize(module.weight, bits, group_size))
    return model.eval()
