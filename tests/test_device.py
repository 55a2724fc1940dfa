"""The device checks that tools/gpu_check.sh runs first: SPECDEC_DEVICE, forward_costs at batch > 1, the GPU cost
script and the check script's own arguments run on any CPU; the CUDA tests skip where no GPU is visible."""
import importlib.util
import json
import math
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, tiny_llama
from specdec_lab import bench, identity, lm, measure, zoo
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run tools/gpu_check.sh on one)")
CHECK = ROOT / "tools" / "gpu_check.sh"


def _gpu_costs():
    spec = importlib.util.spec_from_file_location("gpu_costs", ROOT / "tools" / "gpu_costs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- SPECDEC_DEVICE: how the check runs the notebooks on a device ---------------------------------------------

def test_specdec_device_is_honoured(monkeypatch):
    monkeypatch.delenv("SPECDEC_DEVICE", raising=False)
    best = "cuda" if torch.cuda.is_available() else "cpu"
    assert zoo.default_device() == best
    monkeypatch.setenv("SPECDEC_DEVICE", "")
    assert zoo.default_device() == best, "an empty SPECDEC_DEVICE means unset"
    monkeypatch.setenv("SPECDEC_DEVICE", "cpu")
    assert zoo.default_device() == "cpu"
    target, draft, tok = zoo.load_pair("tiny")  # no device given: the notebooks' call
    assert target.device.type == draft.device.type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine: the variable still wins
    assert zoo.default_device() == "cpu", "SPECDEC_DEVICE=cpu must override a visible GPU"
    monkeypatch.delenv("SPECDEC_DEVICE")
    assert zoo.default_device() == "cuda"


@pytest.mark.parametrize("value, words", [("gpu0", ["SPECDEC_DEVICE='gpu0'", "is not a device", "use cpu"]),
                                          ("cuda", ["SPECDEC_DEVICE='cuda'", "is not available here"])])
def test_specdec_device_is_checked(value, words, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SPECDEC_DEVICE", value)
    for call in (zoo.default_device, lambda: zoo.load_pair("tiny")):
        with pytest.raises(ValueError) as err:
            call()
        for word in words:
            assert word in str(err.value), str(err.value)


# ---- forward_costs at batch B ----------------------------------------------------------------------------------

def test_forward_costs_at_batch_8(monkeypatch):
    target, draft = tiny_llama(vocab=4000, hidden=128, context=512), tiny_llama(vocab=4000, hidden=64, seed=1,
                                                                                context=512)
    shapes = []
    forward = lm.forward
    monkeypatch.setattr(measure.lm, "forward", lambda model, ids, cache=None: shapes.append(ids.shape) or
                        forward(model, ids, cache))
    times = measure.forward_costs({"target": target, "draft": draft}, ns=[1, 4, 64], context=32, rounds=2, batch=8)
    assert {s[0] for s in shapes} == {8}, f"every forward should carry the batch of 8 requests, got {set(shapes)}"
    assert set(times) == {("target", 1), ("target", 4), ("target", 64), ("draft", 1)}
    assert all(0 < ms < 10_000 and math.isfinite(ms) for ms in times.values()), times
    c, v = measure.cost_ratios(times)
    assert v[1] == 1 and c > 0
    assert v[64] > 2, f"64 x 8 tokens through a 4,000-id LM head cost only {v[64]:.2f} x 8 tokens"
    with pytest.raises(ValueError, match="batch=0"):
        measure.forward_costs({"target": target}, batch=0)


# ---- tools/gpu_costs.py ---------------------------------------------------------------------------------------

def test_gpu_costs_configs_are_exact():
    """The full configs build (on the meta device: no memory) into models of the published sizes."""
    gc = _gpu_costs()
    assert gc.scaled(gc.LLAMA31_8B, 32, 1.0) == gc.LLAMA31_8B and gc.scaled(gc.LLAMA32_1B, 16, 1.0) == gc.LLAMA32_1B
    target, draft = gc.build(gc.LLAMA31_8B, "meta", torch.bfloat16), gc.build(gc.LLAMA32_1B, "meta", torch.bfloat16)
    assert sum(p.numel() for p in target.parameters()) == 8_030_261_248  # Llama-3.1-8B
    assert sum(p.numel() for p in draft.parameters()) == 1_235_814_400  # Llama-3.2-1B (tied embeddings)
    assert gc.weights_read(draft) == 1_235_814_400 and gc.weights_read(target) == 8_030_261_248 - 128256 * 4096
    assert gc.kv_bytes(gc.LLAMA31_8B, torch.bfloat16) == 32 * 2 * 8 * 128 * 2
    assert gc.LLAMA31_8B["rope_scaling"] == dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                 high_freq_factor=4.0, original_max_position_embeddings=8192), \
        "building a model must leave the written-out configs as they are"


def test_gpu_costs_tiny_writes_json(tmp_path):
    out = tmp_path / "deep" / "costs.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_costs.py"), "--device", "cpu", "--tiny",
                          "--rounds", "1", "--ns", "1,2,8", "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    for key in ("timestamp", "torch", "device", "device_name", "dtype", "configs", "measured", "roofline", "scaled"):
        assert key in result, f"costs.json lacks {key!r}"
    assert result["scaled"] is True and result["scale"]["tiny"] and result["dtype"] == "bfloat16"
    assert result["device"] == "cpu" and result["batches"] == [1, 8]
    assert result["configs"]["target"]["hidden_size"] == 64 and result["configs"]["draft"]["num_hidden_layers"] == 1
    for b in ("1", "8"):
        measured, predicted = result["measured"][b], result["roofline"]["batches"][b]
        assert set(measured["v"]) == set(predicted["v"]) == {"1", "2", "8"}
        assert measured["v"]["1"] == predicted["v"]["1"] == 1.0
        assert measured["c"] > 0 and 0 < predicted["c"] <= 1
    assert result["roofline"]["hardware"] is None and "for reference only" in result["roofline"]["note"]
    assert "SCALED DOWN" in run.stdout and "v( 8)" in run.stdout


def test_gpu_costs_bad_device():
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_costs.py"), "--device", "tpu", "--tiny"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "'tpu' is not a device" in run.stderr, run.stderr


# ---- tools/gpu_check.sh: its arguments (the full run is the check itself) ------------------------------------

def test_gpu_check_help():
    run = subprocess.run(["bash", str(CHECK), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.startswith("usage: bash tools/gpu_check.sh [--device cuda|cpu]")
    for word in ("notebooks 00, 03 and 04", "bench", "gpu_costs.py", "results/gpu-check/DEVICE"):
        assert word in run.stdout, run.stdout


@pytest.mark.parametrize("argv, words", [(["--device", "tpu"], ["--device 'tpu'", "cuda", "cpu"]),
                                         (["--device"], ["--device needs a value"]),
                                         (["--fast"], ["unknown argument '--fast'", "usage"])])
def test_gpu_check_bad_arguments(argv, words):
    run = subprocess.run(["bash", str(CHECK), *argv], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and run.stdout == "", "a bad argument must stop the check before any step"
    for word in words:
        assert word in run.stderr, run.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_check_without_a_gpu_stops_at_once(tmp_path):
    run = subprocess.run(["bash", str(CHECK), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "'cuda' is not available here" in run.stderr, run.stderr
    assert "===" not in run.stdout and not (tmp_path / "out").exists()


# ---- on a GPU ------------------------------------------------------------------------------------------------

@cuda
def test_specdec_device_on_cuda(monkeypatch):
    monkeypatch.setenv("SPECDEC_DEVICE", "cuda:0")
    assert zoo.default_device() == "cuda:0"
    monkeypatch.setenv("SPECDEC_DEVICE", f"cuda:{torch.cuda.device_count()}")
    with pytest.raises(ValueError, match="numbered from 0"):
        zoo.default_device()


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, None])  # None: the GPU's own half precision (gpu_dtype)
def test_zoo_decodes_on_cuda_identically(dtype):
    """Chain and tree drafts on the GPU emit the target's greedy tokens (ties allowed in half precision)."""
    dtype = dtype or zoo.gpu_dtype("cuda")
    target, draft, tok = zoo.load_pair("tiny", device="cuda", dtype=dtype)
    assert target.device.type == "cuda" and target.dtype == dtype
    ids = bench.suite_prompts(tok)[::17][:3]
    ids = [x.to("cuda") for x in ids]
    ref = [generate(target, x, None, max_new_tokens=32).tokens for x in ids]
    for make in (lambda: DraftModelDrafter(draft, 3), lambda: DraftModelDrafter(draft, branching=[2, 2, 1, 1])):
        report = identity.compare(target, ids, [generate(target, x, make(), max_new_tokens=32).tokens for x in ids],
                                  ref)
        assert not report.bugs, f"{dtype}: {report}"


@cuda
def test_forward_costs_on_cuda():
    target = tiny_llama(vocab=4000, hidden=128, context=512).to("cuda")
    times = measure.forward_costs({"target": target}, ns=[1, 8], context=32, rounds=3, batch=8)
    assert all(0 < ms < 1000 for ms in times.values()), times
