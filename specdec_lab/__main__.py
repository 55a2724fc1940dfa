"""The `specdec-lab` command: `specdec-lab check`, `specdec-lab train-zoo`, ..."""

import argparse
import platform
import sys


def check() -> int:
    """Print versions, the device, and whether the embedded models load."""
    import importlib.metadata as md

    import torch

    print(f"python        {platform.python_version()} ({sys.executable})")
    for pkg in ["specdec-lab", "torch", "transformers", "tokenizers", "numpy", "nbval"]:
        try:
            print(f"{pkg:<13} {md.version(pkg)}")
        except md.PackageNotFoundError:
            print(f"{pkg:<13} NOT INSTALLED")
    if torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name(0)})"
    elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        device = "mps"
    else:
        device = f"cpu ({torch.get_num_threads()} threads)"
    print(f"device        {device}")
    try:
        from specdec_lab import zoo

        target, draft, tok = zoo.load_pair("tiny")
        n_t = sum(p.numel() for p in target.parameters())
        n_d = sum(p.numel() for p in draft.parameters())
        print(f"zoo 'tiny'    loads: target {n_t / 1e6:.2f}M params, draft {n_d / 1e6:.2f}M params, "
              f"vocab {len(tok)}")
    except Exception as e:  # report, do not crash: this is a diagnostic
        print(f"zoo 'tiny'    does not load: {type(e).__name__}: {e}")
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specdec-lab", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="print versions, device, and whether the embedded models load")
    tz = sub.add_parser("train-zoo", help="train the embedded tokenizer, target and draft; write the model card")
    tz.add_argument("--work", default="zoo-work", help="folder for resumable checkpoints (default ./zoo-work)")
    tz.add_argument("--measure-only", action="store_true", help="re-measure the card's figures, no training")
    tz.add_argument("--train-only", action="store_true", help="train and save the weights, skip measuring")
    tz.add_argument("--threads", type=int, default=1, help="CPU threads for training (default 1)")
    tz.add_argument("--stage", choices=["all", "models", "medusa", "eagle"], default="all",
                    help="all (default); models: tokenizer, target, draft; medusa: only the Medusa heads; "
                         "eagle: only the EAGLE-1 and EAGLE-3 drafts")
    bench = sub.add_parser("bench", help="benchmark a method against plain decoding and HF on the prompt suite")
    from specdec_lab import bench as bench_module

    bench_module.add_arguments(bench)
    args = parser.parse_args(argv)
    if args.cmd == "check":
        return check()
    if args.cmd == "train-zoo":
        from pathlib import Path

        from specdec_lab import train_zoo

        train_zoo.main(Path(args.work), measure_only=args.measure_only, train_only=args.train_only,
                       threads=args.threads, stage=args.stage)
        return 0
    if args.cmd == "bench":
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        return bench_module.METHODS[args.method](args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
