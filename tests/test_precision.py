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


# ---- what the real model decodes in (chapter 11, bench --target): a row of a pass must not depend on its neighbours

def int8_dynamic_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Dynamic int8 quantization as torch's quantize_dynamic does it: ONE activation scale for the whole input
    x [n, K] (its largest magnitude / 127), one scale per weight row; y [n, N] = (x_q @ w_q.T) · scales."""
    sx = x.abs().max() / 127                                       # over every row of the pass
    sw = w.abs().amax(1, keepdim=True) / 127                        # [N, 1]
    return (torch.round(x / sx) @ torch.round(w / sw).T) * sx * sw.T


def rows_alone_and_together(linear, x: torch.Tensor) -> float:
    """The most any row of linear(x) [n, N] differs from the same row computed alone, relative to the outputs' size."""
    together = linear(x)
    alone = torch.cat([linear(x[i:i + 1]) for i in range(len(x))])
    return ((together - alone).abs().max() / together.abs().mean()).item()


def test_a_scale_over_the_whole_pass_makes_a_row_depend_on_its_neighbours():
    """The rule the chosen weights must avoid: with one activation scale over the pass, a drafted token with large
    activations changes the verified logits of the tokens before it, so a pass over n tokens is not n steps."""
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(256, 576, generator=gen) / 24, torch.randn(8, 576, generator=gen)  # [N, K], [n, K]
    x[5] *= 8                                                      # one token with large activations
    exact = rows_alone_and_together(lambda z: z @ w.T, x)
    broken = rows_alone_and_together(lambda z: int8_dynamic_linear(z, w), x)
    assert exact < 1e-5, f"fp32 rows should agree to summation order, differ by {exact:.2g}"
    assert broken > 1e-2, f"a pass-wide int8 scale should move a row's output, moved it by only {broken:.2g}"


@pytest.mark.parametrize("shape", [(576, 576), (192, 576), (1536, 576), (576, 1536)])  # SmolLM2-135M's layers
def test_the_chosen_weights_keep_each_row_its_own(shape):
    """In the dtype `decoding_dtype` picks here, row i of an n-token product equals the row computed alone, to the
    product's own rounding: the pass over a draft scores each token as a one-token step would."""
    dtype = precision.decoding_dtype("cpu")
    gen = torch.Generator().manual_seed(0)
    N, K = shape
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(dtype)      # [N, K] as nn.Linear stores it
    x = torch.randn(8, K, generator=gen).to(dtype)                  # [n, K]
    x[5] *= 8
    drift = rows_alone_and_together(lambda z: torch.nn.functional.linear(z, w).float(), x)
    bound = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps  # fp32's summation order; one bf16 rounding
    assert drift <= bound, (f"in {dtype} a row of an 8-token product moved by {drift:.2g} with its neighbours, more "
                            f"than rounding ({bound:.2g}): passes over a draft would not score tokens as steps do")


def test_decoding_dtype_and_the_cpu_name():
    want = torch.bfloat16 if precision.cpu_bf16_is_native() else torch.float32
    assert precision.decoding_dtype("cpu") == want
    name = precision.cpu_name()
    assert f"({'native' if precision.cpu_bf16_is_native() else 'emulated'} bf16" in name and name.endswith(")")
    limits = [f"{k}={os.environ[k]}" for k in precision.ISA_LIMITS if os.environ.get(k)]
    assert all(limit in name for limit in limits), f"{name} does not say the ISA was limited ({limits})"
    assert ("simulated" in name) == bool(limits)
