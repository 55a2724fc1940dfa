"""The files of trained heads and drafts: <folder>/heads.safetensors or eagle.safetensors (bfloat16) beside a
config.json that records what the module is and which target it was trained for.

    save(module, folder, method, config)       write both (`MedusaHeads.save`, `EagleNet.save`; a draft model's
                                               matrices as int8 with row scales, `draft_models.save_distilled`)
    read_config(folder, target, method)        the config.json, refused for any other target, saying what to do
    load(module, folder, method, target)       the weights into a module built from that config

`fingerprint` is what identifies a target (a name, its `architecture`, sizes, a probe of LM-head weights); the
heads shipped in the package and the ones `specdec-lab train-heads` writes carry it alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specdec_lab import lm

__all__ = ["FILES", "ARCHITECTURE", "save", "read_config", "load", "architecture", "fingerprint"]

FILES = {"medusa": "heads.safetensors", "eagle1": "eagle.safetensors", "eagle3": "eagle.safetensors",
         "draft": "draft.safetensors", "block": "block.safetensors"}
WHAT = {"medusa": "Medusa heads", "eagle1": "EAGLE-1 weights", "eagle3": "EAGLE-3 weights", "draft": "draft model",
        "block": "block drafter weights"}  # for the messages
SCALE, GROUP = ".int8_scale", 64  # an int8 matrix's scales [rows, columns / GROUP, 1] (`save(..., int8=True)`)

# The config fields that decide whether weights trained on a target fit it, read by name (a config's to_dict() differs
# between transformers versions: 5.x moved the rope settings into `rope_parameters` and renamed torch_dtype).
ARCHITECTURE = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "hidden_act", "rms_norm_eps",
                "layer_norm_epsilon", "max_position_embeddings")


def quantize(weight: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric rounding of each `group` weights of a row: (q [rows, columns], integers in -L..L stored as float,
    scale [rows, columns / group, 1]), L = 2**(bits - 1) - 1 and scale = the group's largest |weight| / L; the weight
    is about q * scale, group by group."""
    levels = 2 ** (bits - 1) - 1                                               # 127 for int8, 7 for int4
    w = weight.float().reshape(weight.shape[0], -1, group)                     # [rows, columns / group, group]
    scale = w.abs().amax(-1, keepdim=True).clamp_min(1e-12) / levels           # [rows, columns / group, 1]
    return (w / scale).round().clamp(-levels, levels).reshape(weight.shape), scale


def save(module: nn.Module, folder: Path | str, method: str, config: dict, int8: bool = False) -> None:
    """module's state dict in folder/FILES[method] (bfloat16: half the bytes) and `config` in config.json beside it.
    int8: every matrix as int8, with a float32 scale for each GROUP weights of a row, their largest |weight| / 127
    (about a quarter of float32's bytes; the draft model's, whose layers are the size of the target's own)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in module.state_dict().items():
        v = v.detach()
        if int8 and v.is_floating_point() and v.dim() == 2 and v.shape[1] % GROUP == 0:
            q, scale = quantize(v, 8, GROUP)
            state[k], state[k + SCALE] = q.to(torch.int8), scale
        else:
            state[k] = v.to(torch.bfloat16) if v.is_floating_point() else v  # ids stay ints
    save_file({k: v.contiguous() for k, v in state.items()}, folder / FILES[method])
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load(module: nn.Module, folder: Path | str, method: str, target) -> nn.Module:
    """module with the weights `save` wrote (read as float32), on target's device and dtype, in eval mode."""
    from safetensors.torch import load_file

    state = load_file(Path(folder) / FILES[method])
    scales = {k.removesuffix(SCALE): state.pop(k) for k in [k for k in state if k.endswith(SCALE)]}
    def value(k: str, v: torch.Tensor) -> torch.Tensor:
        if k in scales:  # an int8 matrix [rows, columns]: each group of GROUP columns times its scale
            return (v.float().reshape(*scales[k].shape[:2], GROUP) * scales[k]).reshape(v.shape)
        return v.float() if v.is_floating_point() else v
    module.load_state_dict({k: value(k, v) for k, v in state.items()})
    return module.to(device=target.device, dtype=target.dtype).eval()


def architecture(config) -> dict:
    """The target's architecture as `fingerprint` records it: the ARCHITECTURE fields it has and its rotary
    positions (`lm.rope`), alike under every supported transformers version."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    arch = {k: getattr(config, k) for k in ARCHITECTURE if getattr(config, k, None) is not None}
    if rope := lm.rope(config):
        arch["rope"] = rope
    return json.loads(json.dumps(arch, sort_keys=True, default=str))  # plain JSON values, as read back from a card


def fingerprint(target) -> dict:
    """What identifies the target a module was trained for, recorded in its config.json: a name, its architecture
    (`architecture`: sizes, vocabulary, tying, positions), the hidden and vocabulary sizes, and a probe of 32 LM-head
    weights (the same architecture with other weights: a fine-tune, a random init)."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    w = target.get_output_embeddings().weight  # [V, H]
    rows = torch.linspace(0, w.shape[0] - 1, 8).long().tolist()
    cols = torch.linspace(0, w.shape[1] - 1, 4).long().tolist()
    probe = w.detach()[rows][:, cols].float().flatten().tolist()  # [32]
    name = str(getattr(config, "_name_or_path", "") or config.model_type)
    name = "/".join(Path(name).parts[-2:]) if Path(name).is_dir() else name  # a local folder: its last two parts
    return {"target": name, "architecture": architecture(config), "hidden": config.hidden_size,
            "vocab": config.vocab_size, "probe": [round(x, 6) for x in probe]}


def read_config(folder: Path | str, target, method: str) -> dict:
    """The config.json of `method`'s weights in `folder` ("medusa", "eagle1", "eagle3"), checked against `target`:
    the hidden and vocabulary sizes, and, where it records them (`fingerprint`), the architecture (each field that
    differs is named) and the LM-head probe. A refusal names the command that trains weights for this target."""
    folder, what = Path(folder), WHAT[method]
    train = (f"`specdec-lab train-heads --target <your target> --method {method}` (minutes; for the zoo target "
             f"also `specdec-lab train-zoo --stage {method.rstrip('13')}`)")
    if not (folder / FILES[method]).exists():
        raise FileNotFoundError(f"no {what} in {folder}: train them with {train}")
    meta = json.loads((folder / "config.json").read_text())
    mine = fingerprint(target)
    H, V = mine["hidden"], mine["vocab"]
    trained_for = f"{what} in {folder} were trained for {meta.get('target', 'another target')}"
    if meta["hidden"] != H or meta["vocab"] != V:
        raise ValueError(f"the {what} in {folder} were trained for hidden {meta['hidden']} / vocab "
                         f"{meta['vocab']}, not this target's {H} / {V}: use the target they were trained for, "
                         f"or train {what} for yours with {train}")
    theirs, ours = meta.get("architecture"), mine["architecture"]  # none in an older card: sizes and probe decide
    differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k)) if theirs else []
    if differ:
        says = "; ".join(f"{k}: {theirs.get(k)} there, {ours.get(k)} here" for k in differ)
        raise ValueError(f"the {trained_for}, whose architecture is not this target's ({mine['target']}: {says}): "
                         f"train {what} for it with {train}")
    if "probe" in meta and not torch.allclose(torch.tensor(meta["probe"]), torch.tensor(mine["probe"]),
                                              rtol=2e-2, atol=1e-4):
        raise ValueError(f"the {trained_for}, which has this target's architecture but other weights (its LM "
                         f"head differs): train {what} for this target with {train}")
    return meta
