"""Training uses bf16 autocast only where the CPU does bf16 natively (emulated bf16 is 10-70x slower)."""

import os
from pathlib import Path

import pytest
import torch

from specdec_lab import precision, zoo
from specdec_lab.medusa import MedusaHeads
from specdec_lab.training import train_heads


def cpu_has_native_bf16() -> bool:
    """What this machine's CPU flags promise: AVX512-BF16 or AMX, unless oneDNN is told to stay below them."""
    info = Path("/proc/cpuinfo")
    flags = set(info.read_text().split()) if info.exists() else set()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    capped = isa not in ("ALL", "DEFAULT") and "BF16" not in isa and "AMX" not in isa
    return bool(flags & {"avx512_bf16", "amx_bf16"}) and not capped


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads the CPU flags from /proc/cpuinfo (Linux)")
def test_the_choice_on_this_cpu_follows_its_flags():
    want = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    got = precision.training_dtype("cpu")
    assert got == want, (f"training on this CPU would run in {got}, but its flags say {want}: the matmul probe in "
                         "precision.cpu_bf16_is_native disagrees with the hardware")


def test_explicit_precisions_and_a_clear_error():
    assert precision.training_dtype("cpu", "fp32") == torch.float32
    assert precision.training_dtype("cpu", "bf16") == torch.bfloat16
    assert precision.training_dtype("mps", "auto") == torch.float32
    with pytest.raises(ValueError, match="precision='half'.*'auto'"):
        precision.training_dtype("cpu", "half")


@pytest.mark.parametrize("native", [False, True])
def test_training_takes_the_same_path(monkeypatch, native):
    """train_heads runs its products in bf16 exactly when the probe says bf16 is native (or when forced)."""
    monkeypatch.setattr(precision, "cpu_bf16_is_native", lambda: native)
    target, _, _ = zoo.load_pair("tiny")
    heads = MedusaHeads.for_target(target, 2)
    seen = []
    heads.register_forward_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
    hidden = torch.randn(4, 16, target.config.hidden_size)
    labels = torch.randint(0, target.config.vocab_size, (4, 16))
    train_heads(heads, hidden, labels, steps=1, batch=2, progress=False)
    train_heads(heads, hidden, labels, steps=1, batch=2, progress=False, precision="fp32")
    assert seen == [native, False], f"autocast on in (auto, fp32) runs: {seen}, want {[native, False]}"
