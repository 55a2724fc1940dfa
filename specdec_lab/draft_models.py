"""Draft models made from the target itself: its first layers (early exit), its weights rounded to 4 bits.

Derived in notebooks/03_draft_target.ipynb (section on self-drafting). Both return an ordinary causal LM that
`drafters.DraftModelDrafter` drafts with; neither needs training.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from specdec_lab import checks

__all__ = ["early_exit_model", "fake_quantized_model", "fake_quantize"]


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
        raise checks.ArgumentError(f"layers must be in [1, {total - 1}] for a target with {total} layers, got {layers}")
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
        raise checks.ArgumentError(f"in_features {in_features} is not a multiple of group_size {group_size}")
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
