"""v(n) and c of a 7-8B target and its 1B draft, measured on this device and set beside the roofline's prediction.

    python tools/gpu_costs.py --device cuda --out results/gpu-check/cuda/costs.json     # ~2 minutes on one GPU
    python tools/gpu_costs.py --device cpu  --out /tmp/costs.json                        # dry run: scaled down

The models are randomly initialised from the exact configs below (written out here, so nothing comes from the
Hub): timing a forward pass needs the shapes, not trained weights. Target: Llama-3.1-8B (Meta 2024); draft:
Llama-3.2-1B (Meta 2024), which shares its tokenizer and vocabulary (128,256 ids), as a draft must.

    v(n) = one cached n-token target forward / one cached 1-token target forward     (chapter 02)
    c    = one cached 1-token draft forward  / one cached 1-token target forward

both from specdec_lab.measure.forward_costs, at batch 1 and 8, in bf16. On a CPU the full models would take
hours, so --device cpu scales them down (fewer layers, narrower widths, same vocabulary) and says so in the
JSON: a dry run of the script, not a measurement of these models.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec_lab import economics, lm, measure, zoo  # noqa: E402

# config.json of meta-llama/Llama-3.1-8B and meta-llama/Llama-3.2-1B, the fields that set the shapes.
LLAMA31_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                  max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192))
LLAMA32_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=64, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                  max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                  rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192))
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
            vocab_size=1000)  # --tiny (the tests): both models this narrow, 2 and 1 layers

# Data-sheet figures (dense bf16, no sparsity) for the roofline: name fragment -> (label, bytes/s, FLOP/s).
# Matched against torch.cuda.get_device_name in this order (so "H100 PCIe" is found before "H100").
HARDWARE = [("H200", "H200 SXM", 4.8e12, 989e12), ("H100 PCIe", "H100 PCIe", 2.0e12, 756e12),
            ("H100", "H100 SXM", 3.35e12, 989e12), ("A100-SXM4-80GB", "A100 80GB SXM", 2.039e12, 312e12),
            ("A100", "A100 40GB", 1.555e12, 312e12), ("L4", "L4", 0.3e12, 121e12),
            ("A10G", "A10G", 0.6e12, 70e12), ("T4", "T4 (fp16)", 0.32e12, 65e12)]
REFERENCE = "H100"  # the course's example (economics.QWEN25_7B_ON_H100), used where the device has no entry


def scaled(config: dict, layers: int, width: float) -> dict:
    """`config` with `layers` layers and widths times `width` (heads scaled, head_dim kept)."""
    heads = max(1, round(config["num_attention_heads"] * width))
    kv = max(1, round(config["num_key_value_heads"] * width))
    if heads % kv:
        raise ValueError(f"--width {width}: {heads} heads do not split into {kv} KV groups; try 0.25, 0.5 or 1")
    return dict(config, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                hidden_size=heads * config["head_dim"], intermediate_size=round(config["intermediate_size"] * width))


def build(config: dict, device: str, dtype: torch.dtype):
    """A randomly initialised LlamaForCausalLM with `config`, made directly on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    with torch.device(device):
        # a deep copy: LlamaConfig writes into the rope_scaling dict it is given
        model = AutoModelForCausalLM.from_config(LlamaConfig(**copy.deepcopy(config)), **lm.dtype_kwargs(dtype))
    return model.eval()


def weights_read(model) -> int:
    """Parameters a decode step reads: all but an untied input embedding (a lookup reads B·n rows of it)."""
    total = sum(p.numel() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return total if emb is head else total - emb.numel()


def kv_bytes(config: dict, dtype: torch.dtype) -> int:
    """K and V of one token, all layers: layers x 2 x kv_heads x head_dim x bytes."""
    size = torch.finfo(dtype).bits // 8
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config["head_dim"] * size


def hardware(device: str) -> tuple[str | None, tuple]:
    """(the device's label or None, (label, bandwidth, flops) of the roofline to predict with)."""
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else ""
    table = {key: (label, bw, fl) for key, label, bw, fl in HARDWARE}
    for key in table:
        if key in name:
            return table[key][0], table[key]
    return None, table[REFERENCE]


def roofline_prediction(models: dict, configs: dict, device: str, dtype, ns, batches, context: int) -> dict:
    """v(n) and c at each batch from economics.Roofline, for the models as built."""
    found, (label, bandwidth, flops) = hardware(device)
    lines = {role: economics.Roofline(params=weights_read(models[role]), bandwidth=bandwidth, peak_flops=flops,
                                      bytes_per_param=torch.finfo(dtype).bits / 8, context=context,
                                      kv_bytes_per_token=kv_bytes(configs[role], dtype))
             for role in ("target", "draft")}
    t, d = lines["target"], lines["draft"]
    predicted = {str(b): dict(v={str(n): t.step_time(b, n) / t.step_time(b, 1) for n in ns},
                              c=d.step_time(b, 1) / t.step_time(b, 1),
                              target_step_ms=1e3 * t.step_time(b, 1), draft_step_ms=1e3 * d.step_time(b, 1))
                 for b in batches}
    here = torch.cuda.get_device_name(device) if device.startswith("cuda") else device
    note = (f"the roofline of this GPU ({label})" if found else
            f"no roofline figures for {here}: the prediction is for an {label}, for reference only")
    return dict(hardware=found, predicted_for=label, note=note, bandwidth_bytes_per_s=bandwidth, peak_flops=flops,
                efficiency=t.efficiency, overhead_s=t.overhead, params_read=dict(target=t.params, draft=d.params),
                kv_bytes_per_token=dict(target=t.kv_bytes_per_token, draft=d.kv_bytes_per_token),
                batches=predicted)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:1, cpu (a scaled-down dry run)")
    ap.add_argument("--out", type=Path, help="write the JSON here (folders made); default: print only")
    ap.add_argument("--layers", type=int, help="target layers (the draft keeps half as many, at least 1); "
                                               "default: 32 on a GPU, 2 on a CPU")
    ap.add_argument("--width", type=float, help="widths times this (heads scaled, head_dim kept); "
                                                "default: 1 on a GPU, 0.25 on a CPU")
    ap.add_argument("--tiny", action="store_true", help="64-wide models with a 1,000-id vocabulary (the tests)")
    ap.add_argument("--rounds", type=int, help="timed rounds; the minimum is kept (default: 20 on a GPU, 3 on a CPU)")
    ap.add_argument("--context", type=int, default=128, help="cached tokens before the timed ones (default 128)")
    ap.add_argument("--ns", default="1,2,4,8,16,32,64", help="new tokens per timed target forward")
    ap.add_argument("--batches", default="1,8", help="requests per forward")
    args = ap.parse_args(argv)
    try:
        device = zoo.check_device(args.device)
    except ValueError as e:
        ap.error(f"--device: {e}")
    ns = sorted({int(n) for n in args.ns.split(",")} | {1})
    batches = [int(b) for b in args.batches.split(",")]
    gpu = device.startswith("cuda")
    dtype = torch.bfloat16

    layers = args.layers or (LLAMA31_8B["num_hidden_layers"] if gpu else 2)
    width = args.width or (1.0 if gpu else 0.25)
    if args.tiny:
        layers, width = 2, None
        configs = dict(target=dict(LLAMA31_8B, **TINY, num_hidden_layers=2),
                       draft=dict(LLAMA32_1B, **TINY, num_hidden_layers=1))
    else:
        draft_layers = max(1, layers * LLAMA32_1B["num_hidden_layers"] // LLAMA31_8B["num_hidden_layers"])
        configs = dict(target=scaled(LLAMA31_8B, layers, width), draft=scaled(LLAMA32_1B, draft_layers, width))
    exact = configs["target"] == LLAMA31_8B and configs["draft"] == LLAMA32_1B
    rounds = args.rounds or (20 if gpu else 3)

    t0 = time.perf_counter()
    models = {role: build(cfg, device, dtype) for role, cfg in configs.items()}  # target first: forward_costs
    print(f"built target ({sum(p.numel() for p in models['target'].parameters()) / 1e9:.2f}B) and draft "
          f"({sum(p.numel() for p in models['draft'].parameters()) / 1e9:.2f}B parameters) on {device} in bf16 "
          f"in {time.perf_counter() - t0:.0f} s" + ("" if exact else "  [SCALED DOWN: a dry run]"), flush=True)

    measured = {}
    for b in batches:
        t1 = time.perf_counter()
        times = measure.forward_costs(models, ns=ns, context=args.context, rounds=rounds, batch=b)
        c, v = measure.cost_ratios(times)
        measured[str(b)] = dict(v={str(n): x for n, x in v.items()}, c=c,
                                ms=dict(target={str(n): times[("target", n)] for n in ns}, draft=times[("draft", 1)]))
        print(f"batch {b}: timed in {time.perf_counter() - t1:.0f} s", flush=True)
    roofline = roofline_prediction(models, configs, device, dtype, ns, batches, args.context)

    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    result = dict(
        what="v(n) and c measured with specdec_lab.measure.forward_costs on randomly initialised bf16 models, "
             "beside economics.Roofline's prediction for the same models",
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), torch=torch.__version__,
        transformers=__import__("transformers").__version__, device=device, device_name=name,
        dtype="bfloat16", threads=1,  # forward_costs times on one torch thread
        scaled=not exact, scale=None if exact else dict(tiny=args.tiny, target_layers=layers, width=width,
                                                        why="a dry run: the full models are too slow on a CPU"),
        models=dict(target="Llama-3.1-8B config (random weights)", draft="Llama-3.2-1B config (random weights)"),
        configs=configs, params={role: sum(p.numel() for p in m.parameters()) for role, m in models.items()},
        context=args.context, rounds=rounds, pattern="loop", ns=ns, batches=batches,
        measured=measured, roofline=roofline, seconds=round(time.perf_counter() - t0, 1))

    print(f"\n{'':>6}" + "".join(f" | batch {b}: measured  roofline" for b in batches))
    for n in ns:
        print(f"v({n:>2})" + "".join(f" | {measured[str(b)]['v'][str(n)]:16.2f}  {roofline['batches'][str(b)]['v'][str(n)]:8.2f}"
                                     for b in batches))
    print(f"{'c':>6}" + "".join(f" | {measured[str(b)]['c']:16.3f}  {roofline['batches'][str(b)]['c']:8.3f}"
                                for b in batches))
    print(f"roofline: {roofline['note']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
