"""Target/draft model pairs: the embedded `tiny` pair (ships inside the package) and real checkpoints.

    target, draft, tok = load_pair("tiny")        # offline, seconds, any CPU
    target, draft, tok = load_pair("smollm2")     # the same code on a real pair (needs the Hub)

The embedded pair was trained by `specdec-lab train-zoo`; see data/zoo/tiny/README.md (its model card).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

EMBEDDED = {"tiny": Path(__file__).parent / "data" / "zoo" / "tiny"}

# name -> (target, draft) Hugging Face ids; each pair shares one tokenizer.
PAIRS = {
    "smollm2": ("HuggingFaceTB/SmolLM2-360M", "HuggingFaceTB/SmolLM2-135M"),
    "qwen2.5": ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    "gpt2": ("gpt2-large", "gpt2"),
}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_one(name_or_path: str, device: str, dtype: torch.dtype):
    """(model, tokenizer) from a local folder, the local Hub cache, or the Hub; clear error when offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from specdec_lab import lm

    kwargs = lm.dtype_kwargs(dtype)
    if Path(name_or_path).is_dir():
        sources = [dict(local_files_only=True)]
    else:
        sources = [dict(local_files_only=True), dict()]  # the Hub cache first, then the network
    for i, extra in enumerate(sources):
        if extra == {} and not _hub_reachable():
            raise RuntimeError(
                f"cannot load '{name_or_path}': it is not a local folder, not in the Hugging Face cache, and "
                "the Hub is unreachable (offline or HF_HUB_OFFLINE=1). Use the embedded pair, "
                "load_pair('tiny'), which ships inside the package, or download the model on a connected "
                "machine first.")
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a weight-loading bar per model would clutter notebooks
        try:
            tok = AutoTokenizer.from_pretrained(name_or_path, **extra)
            model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs, **extra)
            return model.to(device).eval(), tok
        except OSError:
            if i == len(sources) - 1:
                raise
        finally:
            if bars:
                hf_logging.enable_progress_bar()


def check_pair(target, draft, target_tok, draft_tok) -> None:
    """Speculation compares token ids, so both models must speak the same vocabulary."""
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise ValueError(
            "target and draft use different tokenizers (their vocabularies differ), so the draft's token ids "
            "mean different strings to the target and almost nothing would be accepted. Pick a draft from "
            "the target's own family (same tokenizer), e.g. load_pair('smollm2') or load_pair('tiny').")
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise ValueError(
            f"target and draft share a tokenizer but their output layers differ in size ({vt} vs {vd} logits, "
            "padded vocabularies): p and q must be distributions over the same ids. Slice both models' "
            f"logits to the tokenizer's {len(target_tok)} ids, or pick a pair with equal vocab_size.")


def load_pair(name="tiny", device: str | None = None, dtype: torch.dtype | None = None):
    """Return (target, draft, tokenizer), both models in eval mode on `device`.

    name: "tiny" (embedded, offline), a key of PAIRS, a folder holding target/ and draft/, or a
    (target, draft) tuple of local paths or Hub ids. dtype defaults to float32 (exact comparisons)
    on CPU and bfloat16 for Hub models on a GPU.
    """
    device = device or default_device()
    if isinstance(name, (tuple, list)):
        if len(name) != 2:
            raise ValueError(f"expected (target, draft), got {len(name)} entries: {name!r}")
        target_id, draft_id = map(str, name)
    elif name in EMBEDDED or (Path(name) / "target").is_dir():
        root = EMBEDDED.get(name, Path(name))
        if not (root / "target" / "model.safetensors").exists():
            raise FileNotFoundError(f"the embedded pair is missing from {root}: run `specdec-lab train-zoo`.")
        target_id, draft_id = str(root / "target"), str(root / "draft")
    elif name in PAIRS:
        target_id, draft_id = PAIRS[name]
    else:
        raise ValueError(f"unknown pair {name!r}: use 'tiny', one of {sorted(PAIRS)}, a folder with "
                         "target/ and draft/, or a (target_path, draft_path) tuple.")
    if dtype is None:
        local = Path(target_id).is_dir()
        dtype = torch.bfloat16 if (device.startswith("cuda") and not local) else torch.float32
    target, tok = _load_one(target_id, device, dtype)
    draft, draft_tok = _load_one(draft_id, device, dtype)
    check_pair(target, draft, tok, draft_tok)
    return target, draft, tok
