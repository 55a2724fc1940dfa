"""This CPU's roofline and the real model's pass on it, in every precision worth trying (chapter 11, section 2).

    python tools/cpu_roofline.py --json results/roofline-cpu.json

Prints, at 1 and 2 threads: the memory bandwidth (a 1 GB read), the rate of a linear layer of SmolLM2-135M at n = 1
to 64 tokens in fp32 and bf16 (bf16 only where native), the ridge points beside an H100's, where one step's time goes
(`measure.step_profile`), v(n) of the real model measured and predicted from those rates, and how far row i of an
8-token pass lies from a one-token step (max |logit difference|, argmax agreement). Timings: the minimum over
interleaved rounds (`measure.best_times`); run it on a quiet machine.
"""
import argparse
import json
import time

import torch

from specdec_lab import measure, precision, zoo

NS = (1, 2, 3, 4, 5, 8, 11, 16, 32, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per timing (default 7)")
    args = parser.parse_args()
    fp32, _ = zoo.load_model("smollm2-135m-instruct", device="cpu")
    dtypes = [torch.float32] + ([torch.bfloat16] if precision.cpu_bf16_is_native() else [])
    models = {torch.float32: fp32}
    if torch.bfloat16 in dtypes:
        models[torch.bfloat16] = zoo.load_model("smollm2-135m-instruct", device="cpu", dtype=torch.bfloat16)[0]
    params = sum(p.numel() for p in fp32.parameters())
    out = {"cpu": precision.cpu_name(), "torch": torch.__version__, "decoding_dtype": str(precision.decoding_dtype("cpu")),
           "date": time.strftime("%Y-%m-%d %H:%M"), "params": params, "threads": {}}
    print(f"{out['cpu']}, torch {torch.__version__}; SmolLM2-135M-Instruct, {params / 1e6:.1f}M parameters")
    for threads in (1, 2):
        run = out["threads"][threads] = {"bandwidth_GBps": measure.bandwidth(threads=threads) / 1e9, "dtypes": {}}
        print(f"\n{threads} thread(s): memory {run['bandwidth_GBps']:.1f} GB/s (H100: 3350)")
        for dt in dtypes:
            name, b, model = str(dt).removeprefix("torch."), dt.itemsize, models[dt]
            rates = measure.product_rates(dtype=dt, threads=threads)
            ms = measure.forward_costs({"target": model}, ns=NS, rounds=args.rounds, threads=threads)
            v = {n: ms["target", n] / ms["target", 1] for n in NS}
            prof = {n: measure.step_profile(model, n=n, threads=threads) for n in (1, 8)}
            bw, ridge = run["bandwidth_GBps"] * 1e9, max(rates.values()) / (run["bandwidth_GBps"] * 1e9)
            pred = measure.predicted_v(params, b, bw, rates, prof[1]["everything else"])
            rows = measure.pass_against_steps(model)
            run["dtypes"][name] = dict(rates_GFLOPs={n: r / 1e9 for n, r in rates.items()}, ridge_flop_per_byte=ridge,
                                       step_ms=ms["target", 1], v=v, v_predicted=pred, profile_ms=prof,
                                       weights_read_ms=1e3 * params * b / bw, row_check=rows)
            print(f"  {name}: products, GFLOP/s at n: " + ", ".join(f"{n}: {r / 1e9:.0f}" for n, r in rates.items()))
            print(f"    ridge point {ridge:.0f} FLOP/byte (H100 bf16: {989e12 / 3.35e12:.0f}); weights read once "
                  f"{1e3 * params * b / bw:.1f} ms; one step {ms['target', 1]:.1f} ms")
            for n, part in prof.items():
                print(f"    a pass over {n}: " + ", ".join(f"{k} {t:.1f} ms" for k, t in part.items()))
            print("    v(n) measured: " + ", ".join(f"{n}: {v[n]:.2f}" for n in NS[1:]))
            print("    v(n) predicted from the rates: " + ", ".join(f"{n}: {p:.2f}" for n, p in pred.items() if n > 1))
            print(f"    an 8-token pass against 8 steps: logits differ by up to {rows['max_logit_diff']:.2g}, "
                  f"argmax equal on {rows['argmax_equal']}/8 rows")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
