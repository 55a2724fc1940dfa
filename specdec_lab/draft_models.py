"""Draft models made from the target itself: its first layers (early exit), its weights rounded to 4 bits, and a
few of its layers trained to draft (distilled).

Derived in notebooks/03_draft_target.ipynb (section on self-drafting). Each returns an ordinary causal LM that
`drafters.DraftModelDrafter` (or Hugging Face's assisted generation) drafts with. The first two need no training;
`distilled_draft` is trained by `specdec-lab train-heads --method draft` (`training.draft_objective`): its layers start
as copies of the target's first ones and learn to predict the target's next-token distribution, while the
embedding stays the target's, shared and frozen, and the LM head reads the target's rows for a draft vocabulary.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec_lab import checks, vocab, weights

__all__ = ["early_exit_model", "fake_quantized_model", "fake_quantize", "DraftHead", "distilled_draft", "trained_part",
           "save_distilled", "load_distilled"]


def _decoder(model):
    """(the inner decoder with .layers, .embed_tokens, .norm) of a Llama-style causal LM, or a clear error."""
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("layers", "embed_tokens", "norm")):
        raise NotImplementedError(f"{type(model).__name__} is not a Llama-style model (model.model.layers, "
                                  "embed_tokens, norm); early exit is written for those")
    return inner


def _cut(target, layers: int):
    """A skeleton of the target's class with `layers` decoder layers (on the meta device: no weights yet)."""
    total = len(_decoder(target).layers)
    if not 1 <= layers < total:
        raise checks.ArgumentError(f"layers must be in [1, {total - 1}] for a target with {total} layers, got {layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    for key in ("layer_types", "mlp_layer_types"):  # per-layer lists must match the new depth
        if isinstance(getattr(config, key, None), list):
            setattr(config, key, getattr(config, key)[:layers])
    with torch.device("meta"):
        model = type(target)(config)  # the skeleton; every module is replaced by the caller
    model.generation_config = copy.deepcopy(target.generation_config)
    return model


def early_exit_model(target, layers: int):
    """The target cut after its first `layers` decoder layers, then its final norm and LM head.

    The modules are SHARED with the target (no copy): the result costs about layers / L of a target pass.
    Unless the target was trained with early-exit losses, the intermediate hidden state is not what the
    final norm and LM head expect, and the drafts are poor.
    """
    inner = _decoder(target)
    model = _cut(target, layers)
    model.model.embed_tokens = inner.embed_tokens
    model.model.layers = nn.ModuleList(inner.layers[:layers])
    model.model.norm = inner.norm
    model.model.rotary_emb = inner.rotary_emb
    model.lm_head = target.lm_head
    return model.eval()


def fake_quantize(weight: Tensor, bits: int = 4, group_size: int = 32) -> Tensor:
    """Round each group of `group_size` input weights to 2**bits levels (symmetric), returned in fp32.

    scale = max|w| / (2**(bits-1) - 1) per group; w -> clamp(round(w / scale)) * scale. The stored int4
    values would take 1/8 of fp32's memory; here we only simulate the rounding error.
    """
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise checks.ArgumentError(f"in_features {in_features} is not a multiple of group_size {group_size}")
    q, scale = weights.quantize(weight, bits, group_size)  # [out, in] integers (-7..7 for int4), [out, groups, 1]
    return (q.reshape(*scale.shape[:2], group_size) * scale).reshape(out_features, in_features).to(weight.dtype)


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


class DraftHead(nn.Module):
    """A distilled draft's LM head: the target's own head (shared, frozen, not saved), scoring only the draft
    vocabulary d2t [Vd] when it has one (`vocab`: on SmolLM2-135M the full head costs more than four of its layers).
    forward: states [.., H] -> logits [.., V], -inf outside the draft vocabulary; `small`: logits [.., Vd]."""

    def __init__(self, lm_head: nn.Linear, d2t: Tensor | None = None):
        super().__init__()
        self._head = [lm_head]  # in a list: not a submodule, so neither trained nor saved with the draft
        self.out_features = lm_head.out_features
        self.register_buffer("d2t", None if d2t is None else torch.as_tensor(d2t, dtype=torch.long))
        self._rows = None

    def use_vocab(self, tokens: Tensor) -> None:
        """Score only `tokens` [Vd] (token ids) from now on."""
        self.d2t = torch.as_tensor(tokens, dtype=torch.long).sort().values.to(self._head[0].weight.device)
        self._rows = None

    def small(self, h: Tensor) -> Tensor:
        weight = self._head[0].weight  # [V, H]
        if self.d2t is not None:
            if self._rows is None or self._rows.dtype != weight.dtype:
                self._rows = weight.detach()[self.d2t.to(weight.device)]  # [Vd, H], taken once
            weight = self._rows
        return F.linear(h.to(weight.dtype), weight)  # [.., Vd]

    def forward(self, h: Tensor) -> Tensor:
        small = self.small(h)
        return small if self.d2t is None else vocab.scatter(small, self.d2t, self.out_features)  # [.., V]


def distilled_draft(target, layers: int, d2t: Tensor | None = None):
    """A draft model of the target's own kind: copies of its first `layers` decoder layers and of its final norm
    (`trained_part`: what trains), its token embedding (the target's, shared) and a `DraftHead` over the target's
    LM head.
    Untrained, it is `early_exit_model(target, layers)` with its own copies of the layers; `train-heads --method
    draft` trains it (`training.draft_objective`), `load_distilled` loads a trained one."""
    inner = _decoder(target)
    model = _cut(target, layers)
    model.model.embed_tokens = inner.embed_tokens
    model.model.layers = nn.ModuleList(copy.deepcopy(inner.layers[j]) for j in range(layers))
    model.model.norm = copy.deepcopy(inner.norm)
    model.model.rotary_emb = inner.rotary_emb
    model.lm_head = DraftHead(target.get_output_embeddings(), d2t)
    return model.eval()


def trained_part(draft) -> nn.Module:
    """What a distilled draft trains and saves: its layers, its final norm, its draft vocabulary."""
    return nn.ModuleDict({"layers": draft.model.layers, "norm": draft.model.norm, "head": draft.lm_head})


def save_distilled(draft, folder, meta: dict) -> None:
    """draft.safetensors (the trained part only; its matrices int8 with a scale per 64 weights of a row, the norms
    bfloat16: a layer of SmolLM2-135M takes 3.8 MB, not 7.1) and config.json (`weights.save`)."""
    head = draft.lm_head
    info = {"layers": len(draft.model.layers), "draft_vocab": None if head.d2t is None else len(head.d2t),
            "stored": "int8 matrices, a scale per 64 weights of a row"}
    weights.save(trained_part(draft), folder, "draft", {**info, **meta}, int8=True)


def load_distilled(target, folder):
    """The distilled draft saved in `folder` for this target (refused, with what to do, for any other target)."""
    meta = weights.read_config(folder, target, "draft")
    d2t = None if meta.get("draft_vocab") is None else torch.zeros(meta["draft_vocab"], dtype=torch.long)
    draft = distilled_draft(target, meta["layers"], d2t)
    weights.load(trained_part(draft), folder, "draft", target)
    draft.lm_head._rows = None  # the loaded d2t picks the rows
    return draft.eval()
