"""EAGLE, EAGLE-2, EAGLE-3: a one-layer draft that extrapolates the target's FEATURES, not its tokens.

Derived in notebooks/06_eagle.ipynb.

The target's LM head reads a feature f_t (its last hidden state) and predicts token t+1. EAGLE's draft reads
the pair (f_t, token t+1), where token t+1 is the token the target actually picked, and predicts f_{t+1};
the target's own frozen LM head turns that into a guess for token t+2. Feeding the predicted feature back
(with the drafted token) extends the guess, one cheap decoder layer per token:

    x_t   = fc([embed(token_{t+1}), f_t])          2H -> H   (the target's frozen embedding)
    o_t   = DecoderLayer(x_0 .. x_t)               one layer: RMSNorm, attention with RoPE, SwiGLU MLP
    token_{t+2} ~ lm_head(o_t)                     (the target's frozen LM head; EAGLE-3 adds a norm)

EAGLE-1: f_t is the target's last hidden state; training regresses o_t onto f_{t+1} (SmoothL1, weight 1.0)
plus cross-entropy of lm_head(o_t) against the target's own choice (weight 0.1), with noise on the inputs.
EAGLE-2: the same draft, drafting a DYNAMIC tree: expand the best nodes, score every node by its cumulative
draft log-probability, keep the best `budget` nodes (see `EagleDrafter`).
EAGLE-3: f_t is fuse([h_low, h_mid, h_high]) (3H -> H) of three target layers; no feature loss, only tokens;
trained with "training-time test": a few unrolled steps that feed the draft's own outputs back in, so the
draft learns to continue from its own (imperfect) features, as it must when drafting (step i weighs 0.8^i).
Either version may score only a draft vocabulary, the target's most frequent tokens (`vocab`; EAGLE-3 does,
and FR-Spec does it for EAGLE-2): exact all the same. The losses and the training-time test are in `training`
(eagle_loss, unroll), beside the loop that fits the draft.

    drafter = EagleDrafter.from_zoo(target, version=1, dynamic=True)   # trained by `specdec-lab train-zoo`
    gen = generate(target, ids, drafter, max_new_tokens=64)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec_lab import checks, lm, vocab, weights
from specdec_lab.drafters import CHAINS_ONLY, Drafter
from specdec_lab.masks import require_custom_masks
from specdec_lab.ragged import Ragged
from specdec_lab.sampling import Warp
from specdec_lab.tree import DraftTree, TreeBuilder

__all__ = ["RMSNorm", "DraftLayer", "EagleNet", "EagleDrafter", "BlockNet", "BlockDrafter", "rope", "fuse_layers",
           "expand_step", "select_nodes", "EAGLE_DIR"]

EAGLE_DIR = Path(__file__).parent / "data" / "zoo" / "tiny"  # eagle1/ and eagle3/ live here


# ---- the draft's decoder layer, written out ----------------------------------------------------------


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: Tensor, positions: Tensor, theta: float = 10000.0) -> Tensor:
    """Rotary embedding of x [B, heads, n, d] at explicit positions [n], or [B, n] per row (a ragged batch,
    chapter 09) (rotate-half layout, as Llama)."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)  # [d/2]
    angles = positions.to(x.device, torch.float32)[..., None] * inv_freq  # [n, d/2] or [B, n, d/2]
    if angles.dim() == 3:
        angles = angles[:, None]  # [B, 1, n, d/2]: the same angles for every head
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)  # [.., n, d]
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)  # [B, heads, n, d]
    return x * cos + half * sin


# The draft's own cache is `lm.new_cache()`: a one-layer Hugging Face cache, grown by `lm.append` and rolled back by
# `lm.keep` like the target's (keys and values [B, heads, L, d]). KVCache is the name chapter 06's notebook and
# exercise import for it: the same function, kept so they run unchanged.
KVCache = lm.new_cache


class DraftLayer(nn.Module):
    """One pre-norm Llama-style decoder layer with an explicit mask over [cached + new] positions."""

    def __init__(self, hidden: int, heads: int, mlp: int):
        super().__init__()
        if hidden % heads:
            raise checks.ArgumentError(f"hidden {hidden} is not a multiple of heads {heads}")
        self.heads, self.d = heads, hidden // heads
        self.attn_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate, self.up = nn.Linear(hidden, mlp, bias=False), nn.Linear(hidden, mlp, bias=False)
        self.down = nn.Linear(mlp, hidden, bias=False)

    def forward(self, x: Tensor, positions: Tensor, mask: Tensor | None = None, cache=None) -> Tensor:
        """x [B, n, H] at positions [n] or [B, n]; mask bool [n, L + n] or [B, 1, n, L + n] (True = may attend;
        None = causal) over the L cached positions then the n new ones. The new keys/values are appended to `cache`."""
        B, n, H = x.shape
        qkv = self.qkv(self.attn_norm(x)).view(B, n, 3, self.heads, self.d)  # [B, n, 3, h, d]
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x [B, h, n, d]
        q, k = rope(q, positions), rope(k, positions)
        if cache is not None:
            k, v = lm.append(cache, k, v)  # [B, h, L + n, d]
        L = k.shape[2] - n
        if mask is None:  # causal: everything cached, then the new tokens in order
            mask = torch.ones(n, L + n, dtype=torch.bool, device=x.device).tril(L)  # [n, L + n]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(x.device))  # [B, h, n, d]
        x = x + self.o(a.transpose(1, 2).reshape(B, n, H))  # [B, n, H]
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))  # [B, n, H]


def fuse_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layer for a target of `num_layers` layers, as indices into HF's
    hidden_states (i = output of layer i; num_layers = the last, after the final norm): (2, 4, 8) for the
    8-layer zoo target. The high one is the last state itself: on a model this shallow the final layer
    still adds much of what the LM head reads (EAGLE-3 takes L - 3 on deep models)."""
    return (max(1, round(num_layers / 4)), max(1, num_layers // 2), num_layers)


class EagleNet(nn.Module):
    """The draft network: fc over [embedding of the next token, feature], one DraftLayer, the target's LM head.

    version 1: feature = the target's last hidden state (after its final norm, what its LM head reads);
    the output o_t is itself a predicted feature, read directly by the LM head.
    version 3: the feature of a committed position is fuse([h_low, h_mid, h_high]) (3H -> H); for drafted
    positions it is the draft's own output; a trainable norm sits before the frozen LM head.
    The target's embedding and LM head are used, frozen, and neither saved nor trained.
    draft_vocab: score only that many tokens, those of `d2t` (a buffer, saved; set by `use_vocab`).
    """

    def __init__(self, target, version: int = 1, heads: int = 4, mlp: int = 512, layers: Sequence[int] | None = None,
                 draft_vocab: int | None = None):
        super().__init__()
        if version not in (1, 3):
            raise checks.ArgumentError(f"version must be 1 (EAGLE-1/2) or 3 (EAGLE-3), got {version!r}")
        config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
        H = config.hidden_size
        self.version, self.hidden, self.num_heads, self.mlp = version, H, heads, mlp
        self.layers = tuple(layers or fuse_layers(config.num_hidden_layers)) if version == 3 else ()
        self.fuse = nn.Linear(3 * H, H, bias=False) if version == 3 else None
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layer = DraftLayer(H, heads, mlp)
        self.out_norm = RMSNorm(H) if version == 3 else None
        self.register_buffer("d2t", None if draft_vocab is None else torch.arange(draft_vocab))  # [Vd] token ids
        embed, head = target.get_input_embeddings(), target.get_output_embeddings()
        embed.requires_grad_(False)
        head.requires_grad_(False)
        object.__setattr__(self, "_embed", embed)  # not submodules: not trained, not saved
        object.__setattr__(self, "_lm_head", head)

    def true_feature(self, states: Sequence[Tensor]) -> Tensor:
        """The feature of committed positions from the target's hidden states (HF's tuple, each [.., H])."""
        return self.combine([states[-1]] if self.version == 1 else [states[i] for i in self.layers])

    def combine(self, picked: Sequence[Tensor]) -> Tensor:
        """Version 1: the last hidden state itself; version 3: fuse([h_low, h_mid, h_high]), 3H -> H."""
        return picked[0] if self.version == 1 else self.fuse(torch.cat(list(picked), -1))  # [.., H]

    def forward(self, feature: Tensor, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,
                cache=None) -> Tensor:
        """feature [B, n, H] and the next tokens [B, n] at positions [n] -> outputs o [B, n, H]."""
        return self.layer(self.inputs(feature, tokens), positions, mask, cache)  # [B, n, H]

    def inputs(self, feature: Tensor, tokens: Tensor) -> Tensor:
        """The layer's inputs for pairs: fc([embed(token); feature]), [B, n, 2H] -> [B, n, H]."""
        return self.fc(torch.cat([self._embed(tokens).to(feature.dtype), feature], -1))

    def use_vocab(self, tokens: Tensor) -> None:
        """Score only `tokens` [Vd] (token ids) from now on: the draft vocabulary."""
        self.d2t = torch.as_tensor(tokens, dtype=torch.long).sort().values.to(self.fc.weight.device)
        self._rows = None

    def draft_logits(self, out: Tensor) -> Tensor:
        """Draft outputs [.., H] -> logits [.., Vd] over the draft vocabulary (Vd = V without one), through the
        target's frozen LM head or its rows for d2t."""
        out = out if self.out_norm is None else self.out_norm(out)
        weight = self._lm_head.weight  # [V, H]
        if self.d2t is not None:
            if getattr(self, "_rows", None) is None or self._rows.dtype != weight.dtype:
                self._rows = weight.detach()[self.d2t.to(weight.device)]  # [Vd, H], taken once
            weight = self._rows
        return F.linear(out.to(weight.dtype), weight)  # an fp32 draft may read a bf16 target's head

    def logits(self, out: Tensor) -> Tensor:
        """Draft outputs [.., H] -> logits [.., V]: the draft vocabulary's scattered back, -inf elsewhere."""
        small = self.draft_logits(out)  # [.., Vd]
        return small if self.d2t is None else vocab.scatter(small, self.d2t, self._lm_head.out_features)

    def to_draft(self, labels: Tensor) -> Tensor:
        """Token ids [..] -> draft indices [..], -100 (ignored by the loss) for tokens outside the draft vocabulary."""
        return labels if self.d2t is None else vocab.to_draft(labels, self.d2t, self._lm_head.out_features)

    # ---- the zoo's files ----

    def save(self, path: Path | str, meta: dict | None = None) -> None:
        """eagle.safetensors (bfloat16) and config.json, the layout `from_zoo` reads."""
        info = {"version": self.version, "hidden": self.hidden, "heads": self.num_heads, "mlp": self.mlp,
                "layers": list(self.layers), "vocab": self._lm_head.out_features,
                "draft_vocab": None if self.d2t is None else len(self.d2t)}
        weights.save(self, path, f"eagle{self.version}", {**info, **(meta or {})})

    @classmethod
    def from_pretrained(cls, target, folder: Path | str) -> EagleNet:
        """A draft saved in `folder` (eagle.safetensors, config.json) for this target, by `specdec-lab
        train-heads` or `train-zoo`; refused, with what to do, when it was trained for another target."""
        checks.model(target, "target", "pass the target model the draft was trained for")
        folder, version = Path(folder), 1
        if (folder / "eagle.safetensors").exists():
            version = json.loads((folder / "config.json").read_text())["version"]
        meta = weights.read_config(folder, target, f"eagle{version}")
        net = cls(target, version, meta["heads"], meta["mlp"], meta["layers"] or None, meta.get("draft_vocab"))
        return weights.load(net, folder, f"eagle{version}", target)

    @classmethod
    def from_zoo(cls, target, version: int = 1, root: Path | str = EAGLE_DIR) -> EagleNet:
        """The draft shipped with the zoo for `target` (root/eagle1 or root/eagle3)."""
        checks.model(target, "target", "pass the zoo target: target, draft, tok = zoo.load_pair('tiny')")
        if version not in (1, 3):
            raise checks.ArgumentError(f"version must be 1 (EAGLE-1, also used by EAGLE-2) or 3 (EAGLE-3), got "
                                       f"{version!r}")
        folder = Path(root) / f"eagle{version}"
        if not (folder / "eagle.safetensors").exists():  # the zoo's own message: its drafts come from train-zoo
            weights.read_config(folder, target, f"eagle{version}")
        return cls.from_pretrained(target, folder)


# ---- EAGLE-2's dynamic tree, one step at a time ---------------------------------------------------------


def expand_step(scores: Tensor, logp: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """One EAGLE-2 expansion: frontier scores [m] and the frontier's next-token log-probs [m, V] -> candidates.

    Every frontier node offers its top-k tokens; a child's score is its parent's score plus its own
    log-probability (the cumulative log-prob of its path). Returns the m * k candidates best first, as
    (parent rows [m*k], tokens [m*k], scores [m*k]); the first k of them are the next frontier.
    """
    top = logp.topk(k, -1)  # values, indices: [m, k]
    cand = (scores[:, None] + top.values).reshape(-1)  # [m*k] cumulative scores
    order = cand.argsort(descending=True, stable=True)  # [m*k] best first (ties: the earlier candidate)
    rows = torch.div(order, k, rounding_mode="floor")  # [m*k] which frontier node is the parent
    return rows, top.indices.reshape(-1)[order], cand[order]


def select_nodes(scores: Sequence[float], parents: Sequence[int], budget: int) -> list[int]:
    """The `budget` best nodes by score, in index order (parents before children): a connected subtree.

    A child's cumulative log-prob is at most its parent's, and ties go to the lower index (the parent), so
    every kept node's parent is kept too.
    """
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:budget]
    keep = sorted(order)
    kept = set(keep)
    assert all(parents[i] < 0 or parents[i] in kept for i in keep), "selection is not a subtree"
    return keep


# ---- drafting ----------------------------------------------------------------------------------------------


class EagleDrafter(Drafter):
    """Drafts with an EagleNet: a chain, a static tree (branching), or EAGLE-2's dynamic tree.

    Its own KV cache holds only pairs built from TRUE target features: `commit` crops away whatever the last
    draft added, then feeds the pairs (feature of position p, committed token p+1) of the positions the
    target just read. The last of them predicts the feature of the pending token, from which the tree grows:
    level l is one forward over the frontier (each node's input = its parent's predicted feature and its own
    token, at position n_true + l, seeing the true pairs, its ancestors and itself). Children are the draft's
    top-k tokens (q=None: distinct deterministic picks, exact under sampling too).

    branching: static tree shape ([1] * γ = a chain; default [1, 1, 1, 1]). dynamic=True: EAGLE-2 with
    `topk` children per expanded node and `topk` nodes kept per level, `depth` levels, and the best `budget`
    nodes overall by cumulative draft log-probability. The defaults (top-4, 8 levels, 24 nodes: the size of
    Medusa's tree in chapter 05) gave the zoo draft the highest τ of the settings notebook 06 tries.
    EAGLE-2 with the top-k, depth and budget tuned for this target on this device: `tune.auto_eagle(target, net)`.
    """

    needs_hidden = True

    def __init__(self, net: EagleNet, branching: Sequence[int] | None = None, dynamic: bool = False,
                 topk: int = 4, depth: int = 8, budget: int = 24):
        checks.instance(net, EagleNet, "net", "EagleDrafter.from_zoo(target, version=1), or "
                        "EagleDrafter(EagleNet.from_zoo(target))")
        if dynamic and branching is not None:
            raise checks.ArgumentError("pass branching (a static tree) or dynamic=True (EAGLE-2's tree), not both")
        if isinstance(dynamic, str):  # "auto" was a setting once
            raise checks.ArgumentError(f"dynamic={dynamic!r}: pass True (EAGLE-2's tree) or False (a static tree); "
                                       "the tree tuned for this device: drafter, pick = tune.auto_eagle(target, net)")
        self.net, self.dynamic = net, bool(dynamic)
        self.branching = checks.branching([1, 1, 1, 1] if branching is None else branching)
        self.topk = checks.integer(topk, "topk", "children per expanded node")
        self.depth = checks.integer(depth, "depth", "levels of the dynamic tree")
        self.budget = checks.integer(budget, "budget", "nodes kept in the dynamic tree")
        self.cache, self.n_true, self.root = lm.new_cache(), 0, None
        self.gamma = len(self.branching)  # a chain's length (generate_batch drafts chains)

    @classmethod
    def from_zoo(cls, target, version: int = 1, dynamic: bool = False, **kwargs) -> EagleDrafter:
        """The drafter with the draft shipped for the zoo target: version 1 (EAGLE-1; dynamic=True is
        EAGLE-2's tree) or 3 (EAGLE-3)."""
        return cls(EagleNet.from_zoo(target, version), dynamic=dynamic, **kwargs)

    @classmethod
    def from_pretrained(cls, target, folder: Path | str, dynamic: bool = False, **kwargs) -> EagleDrafter:
        """The drafter with a draft trained for `target` by `specdec-lab train-heads --method eagle1|eagle3`
        (dynamic=True: EAGLE-2's tree)."""
        return cls(EagleNet.from_pretrained(target, folder), dynamic=dynamic, **kwargs)

    def start(self, target, ids: Tensor) -> None:
        H = target.config.get_text_config().hidden_size
        if H != self.net.hidden:
            raise checks.ArgumentError(f"this EAGLE draft was built for hidden size {self.net.hidden}, the target has "
                                       f"{H}: train one for this target")
        require_custom_masks(target, "EAGLE's drafts")  # the target reads every draft through a tree mask
        self.cache, self.n_true, self.root = lm.new_cache(), 0, None

    @torch.no_grad()
    def commit(self, ids: Tensor, accepted: int, path: list[int], hidden) -> None:
        """Replace the drafted nodes in the cache by the true pairs of the positions the target just read."""
        lm.keep(self.cache, self.n_true)  # drop the drafted nodes: their features were predictions
        x = self._true_pairs(ids, hidden)  # [1, m, H]
        out = self.net.layer(x, torch.arange(self.n_true, self.n_true + x.shape[1]), None, self.cache)  # [1, m, H]
        self.n_true += x.shape[1]
        self.root = out[0, -1]  # [H] the predicted feature of the pending token

    def _true_pairs(self, ids: Tensor, hidden) -> Tensor:
        """The layer's inputs [1, m, H] for the pairs of the positions the target just read whose next token is
        committed: (feature of position p, token p + 1)."""
        m = min(hidden[0].shape[0], ids.shape[1] - 1 - self.n_true)  # rows whose next token is committed
        feature = self.net.true_feature([h[:m] for h in hidden])[None].to(self.net.fc.weight.dtype)  # [1, m, H]
        return self.net.inputs(feature, ids[:, self.n_true + 1: self.n_true + 1 + m])  # tokens [1, m]

    @torch.no_grad()
    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        if self.root is None or limit < 1:
            return DraftTree([], [])  # the prefill pass drafts nothing
        assert lm.cache_len(self.cache) == self.n_true == ids.shape[1] - 1, "the draft cache must hold true pairs only"
        if self.dynamic:
            return self._dynamic(min(self.depth, limit))
        return self._static(self.branching[:limit])

    def _feed(self, grower: TreeBuilder, out: Tensor, scores: bool = True) -> tuple[Tensor, Tensor]:
        """One forward over the frontier: each node reads its parent's output (a row of the last forward's
        `out` [m', H]) and its own token, at position n_true + depth. Returns (outputs [m, H], log-probs [m, V]);
        scores=False: logits instead (a static tree only ranks them)."""
        rows = [grower.rows[i] for i in grower.frontier]  # [m] its parent's row in `out`
        tokens, positions, mask = grower.feed()  # [m], [m], [m, n_true + fed + m]
        ids = torch.tensor([tokens], device=out.device)  # [1, m]
        out = self.net(out[rows][None], ids, positions, mask, self.cache)[0]  # [m, H]
        logits = self.net.logits(out)  # [m, V]
        return out, F.log_softmax(logits.float(), -1) if scores else logits  # [m, H], [m, V]

    def _static(self, branching: list[int]) -> DraftTree:
        grower, out = TreeBuilder(self.n_true), self.root[None]  # out: the frontier's outputs [m, H]
        logits = self.net.logits(out)  # [1, V] after the pending token
        for level, b in enumerate(branching):
            if level:
                out, logits = self._feed(grower, out, scores=False)
            grower.grow_each(logits.topk(b, -1).indices.tolist())  # [m, b] distinct picks per frontier node
        return grower.tree()

    def pool(self, depth: int) -> tuple[list[int], list[int], list[float]]:
        """EAGLE-2's candidate pool `depth` levels deep: (tokens, parents, cumulative log-probs) of every
        candidate proposed, in the order proposed (parents first). Each level expands the `topk` best
        candidates of the level before (one forward over them) into their top-k children."""
        grower, out, scores = TreeBuilder(self.n_true), self.root[None], []  # every candidate ever proposed
        logp = F.log_softmax(self.net.logits(out).float(), -1)  # [1, V] after the pending token
        for level in range(depth):
            if level:
                out, logp = self._feed(grower, out)  # [m, H], [m, V]
            base = torch.tensor([0.0 if i < 0 else scores[i] for i in grower.frontier], device=logp.device)  # [m]
            rows, tokens, sc = expand_step(base, logp, self.topk)  # m * k candidates, best first
            new = grower.grow(rows.tolist(), tokens.tolist())
            scores += sc.tolist()
            grower.frontier = new[:self.topk]  # keep the k best of this depth for expansion
        return grower.tokens, grower.parents, scores

    def _dynamic(self, depth: int) -> DraftTree:
        tokens, parents, scores = self.pool(depth)
        keep = select_nodes(scores, parents, self.budget)  # best `budget` of the pool, parents first
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree([tokens[i] for i in keep], [-1 if parents[i] < 0 else index[parents[i]] for i in keep])

    # ---- batched (chapter 09): an EAGLE-1 chain per row, its cache a `Ragged` of each row's TRUE pairs ----

    def start_batch(self, target, texts: list[list[int]]) -> None:
        if self.dynamic or any(b > 1 for b in self.branching):
            raise checks.ArgumentError(f"this EagleDrafter drafts a tree ({'dynamic' if self.dynamic else self.branching}). "
                                       + CHAINS_ONLY)
        self.start(target, torch.tensor([texts[0]]))  # the size and mask checks
        self.rows, self.roots, self.row_true = Ragged(lm.new_cache(), len(texts)), None, [0] * len(texts)

    @torch.no_grad()
    def propose_batch(self, texts: list[list[int]], gammas: list[int], warp: Warp
                      ) -> list[tuple[list[int], Tensor | None]]:
        n = max(gammas)
        if self.roots is None or n == 0:
            return [([], None)] * len(texts)  # the prefill pass drafts nothing
        out, tokens = self.roots, []  # [B, 1, H] the predicted feature of each row's pending token
        for level in range(n):
            if level:  # feed each row's last draft with the feature that predicted it, at position n_true + level - 1
                ids, positions, mask = self.rows.block(tokens[-1][:, None].tolist(), out.device)
                out = self.net(out, ids, positions, mask[:, None], self.rows.cache)  # [B, 1, H]
            tokens.append(self.net.logits(out[:, -1]).argmax(-1))  # [B] top-1: deterministic (q = None)
        tokens = torch.stack(tokens, 1).tolist()  # [B, n]
        return [(tokens[b][:g], None) for b, g in enumerate(gammas)]

    @torch.no_grad()
    def commit_batch(self, texts: list[list[int]], alive: list[int], hidden) -> None:
        self.rows.keep([self.row_true[b] for b in alive], alive)  # drop the drafted nodes: only true pairs stay
        if not alive:
            return
        texts, hidden, n_true = [texts[b] for b in alive], [hidden[b] for b in alive], [self.row_true[b] for b in alive]
        # the pairs whose next token is committed: the positions the target read, up to the pending token
        m = [min(s[0].shape[0], len(t) - 1 - k) for s, t, k in zip(hidden, texts, n_true)]
        width, weight = max(m), self.net.fc.weight
        feature = torch.zeros(len(alive), width, self.net.hidden, dtype=weight.dtype, device=weight.device)  # [B',w,H]
        for b, s in enumerate(hidden):
            if m[b]:
                feature[b, width - m[b]:] = self.net.true_feature([h[: m[b]] for h in s]).to(feature)
        tokens = [t[k + 1: k + 1 + j] for t, k, j in zip(texts, n_true, m)]  # the token after each of those positions
        ids, positions, mask = self.rows.block(tokens, weight.device)
        out = self.net(feature, ids, positions, mask[:, None], self.rows.cache)  # [B', width, H]
        self.row_true, self.roots = [k + j for k, j in zip(n_true, m)], out[:, -1:]  # roots [B', 1, H]


# ---- a block drafter: gamma tokens from one forward (chapter 12; the PARD and DFlash idea) ----------------------


class BlockNet(EagleNet):
    """EAGLE-1's draft with learned placeholder vectors, one per depth: after the true pairs, the root pair's output
    predicts the first draft (as EAGLE's), and the placeholders for depths 2, 3, ... after it predict the next
    tokens, ALL IN ONE FORWARD: each placeholder sees the true pairs, the root and the placeholders before it
    (causal), never a drafted token. The tokens it proposes at different depths do not read each other; placeholder
    j learns what the position j tokens ahead should hold. Trained with EAGLE's training-time-test mask
    (`training.unroll`), placeholder j as the input of step j: step j at position p is the depth-j guess of root
    p - j. `depths` placeholders draft up to depths + 1 tokens per pass."""

    def __init__(self, target, heads: int = 4, mlp: int = 512, draft_vocab: int | None = None, depths: int = 3):
        super().__init__(target, 1, heads, mlp, None, draft_vocab)
        self.placeholder = nn.Parameter(torch.randn(depths, self.hidden) * 0.02)  # [depths, H]

    def save(self, path: Path | str, meta: dict | None = None) -> None:
        """block.safetensors (bfloat16) and config.json."""
        info = {"hidden": self.hidden, "heads": self.num_heads, "mlp": self.mlp, "vocab": self._lm_head.out_features,
                "draft_vocab": None if self.d2t is None else len(self.d2t), "depths": len(self.placeholder)}
        weights.save(self, path, "block", {**info, **(meta or {})})

    @classmethod
    def from_pretrained(cls, target, folder: Path | str) -> BlockNet:
        """A block drafter saved in `folder` for this target by `specdec-lab train-heads --method block`."""
        checks.model(target, "target", "pass the target model the block drafter was trained for")
        meta = weights.read_config(folder, target, "block")
        net = cls(target, meta["heads"], meta["mlp"], meta.get("draft_vocab"), meta["depths"])
        return weights.load(net, folder, "block", target)

    def placeholders(self, depth: Tensor, positions: Tensor, mask: Tensor | None = None, cache=None,
                     batch: int = 1) -> Tensor:
        """Placeholders of depths [n] (0: the second token drafted) at positions [n] -> outputs [batch, n, H]
        (mask None: causal after the cache)."""
        x = self.placeholder[depth].expand(batch, len(depth), self.hidden)  # [B, n, H]
        return self.layer(x, positions, mask, cache)


class BlockDrafter(EagleDrafter):
    """Drafts a chain of gamma tokens with a BlockNet in ONE forward per round (EAGLE's chain of gamma takes gamma):
    the forward that reads the pairs the target just verified carries gamma - 1 placeholders after them, so the last
    pair's output (the root) and the placeholders' outputs are the block's gamma guesses. Greedy: each depth's top-1.
    Sampling: depth j's token is drawn from q_j = the warped softmax of its own logits, independently of the other
    depths (no depth reads a drafted token), so q_j is exactly the probability it was proposed with, given
    everything drawn before it: the accept test min(1, p / q_j) and the residual keep the target's distribution.
    The cache keeps the true pairs; the placeholders are cropped at the next commit."""

    def __init__(self, net: BlockNet, gamma: int = 4):
        checks.instance(net, BlockNet, "net", "BlockDrafter(BlockNet(target)), trained by train-heads --method block")
        gamma, most = checks.integer(gamma, "gamma", "tokens drafted per pass"), len(net.placeholder) + 1
        if gamma > most:
            raise checks.ArgumentError(f"gamma must be at most {most}: this block drafter has placeholders for "
                                       f"{most} tokens per pass; train one with more (Recipe ttt_steps) for longer")
        super().__init__(net, [1] * gamma)

    def start_batch(self, target, texts: list[list[int]]) -> None:
        raise checks.ArgumentError("BlockDrafter has no batched form yet (EagleDrafter's would draft token by token): "
                                   "decode one prompt at a time with generate()")

    @torch.no_grad()
    def commit(self, ids: Tensor, accepted: int, path: list[int], hidden) -> None:
        """One forward: the true pairs of the positions the target just read, then the placeholders after them."""
        lm.keep(self.cache, self.n_true)  # drop last round's placeholders
        pairs = self._true_pairs(ids, hidden)  # [1, m, H]
        m = pairs.shape[1]
        x = torch.cat([pairs, self.net.placeholder[None, : self.gamma - 1].to(pairs.dtype)], 1)  # [1, m + gamma - 1, H]
        positions = torch.arange(self.n_true, self.n_true + x.shape[1])  # placeholders right after the pairs
        out = self.net.layer(x, positions, None, self.cache)  # [1, m + gamma - 1, H] causal after the cache
        self.n_true += m
        self.block = out[0, m - 1:]  # [gamma, H] the root pair's output, then placeholder j's for depth j + 1
        self.root = self.block[0]

    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        if self.root is None or limit < 1:
            return DraftTree([], [])  # the prefill pass drafts nothing
        logits = self.net.logits(self.block[: min(self.gamma, limit)])  # [n, V] no depth read a drafted token
        if warp.greedy:
            return DraftTree.chain(logits.argmax(-1).tolist())  # [n] each depth's top-1
        q = warp.probs(logits.float())  # [n, V] depth j's proposal; its draw depends on no other draw, so q[j] is the
        return DraftTree.chain(warp.sample(q)[:, 0].tolist(), q)  # probability the accept test needs: exact
