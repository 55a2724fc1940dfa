"""The `specdec-lab` command: `specdec-lab check`, `specdec-lab train-zoo`, ..."""

import argparse
import platform
import sys
from pathlib import Path


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
    from specdec_lab import precision

    kind = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = precision.training_dtype(kind) == torch.bfloat16
    print(f"training      {'bf16 autocast (native here)' if bf16 else 'fp32 (bf16 would be emulated here: slow)'}")
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


def folder(text: str) -> Path:
    """An argparse type: a folder to write in (made if missing), outside the installed package."""
    path, package = Path(text), Path(__file__).resolve().parent
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file: give a folder")
    if path.resolve().is_relative_to(package):
        raise argparse.ArgumentTypeError(f"{text!r} is inside the installed package ({package}): pick a folder "
                                         "outside it (--install is the one way to replace the shipped zoo)")
    return path


def check_train_zoo(parser, args) -> None:
    """The flag combinations train-zoo refuses (parser.error: one line, before anything runs)."""
    if args.measure_only and args.train_only:
        parser.error("--measure-only and --train-only exclude each other: pick one")
    if args.measure_only and args.stage != "all":
        parser.error(f"--measure-only measures the target and draft; --stage {args.stage} trains: pick one")
    if args.card and (args.train_only or args.stage in ("medusa", "eagle")):
        parser.error("--card writes the model card, which this run does not measure: leave --card out, or run "
                     "--measure-only --card DIR afterwards")


def main(argv=None) -> int:
    from specdec_lab import bench as bench_module
    from specdec_lab import train_zoo

    parser = argparse.ArgumentParser(prog="specdec-lab", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="print versions, device, and whether the embedded models load")
    tz = sub.add_parser("train-zoo", help="train the zoo (tokenizer, target, draft, Medusa, EAGLE) into a work "
                        "folder and write its model card", description=train_zoo.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    tz.add_argument("--work", type=folder, default=train_zoo.default_work(), help="folder for resumable "
                    "checkpoints and the trained zoo, <work>/tiny (default: %(default)s)")
    tz.add_argument("--install", action="store_true", help="write into the shipped zoo inside the package (what "
                    "load_pair('tiny') loads), after backing up the files it replaces to <work>/backup-<date>-<time>")
    tz.add_argument("--card", type=folder, metavar="DIR", help="also write the model card (README.md, card.json) "
                    "into DIR")
    tz.add_argument("--measure-only", action="store_true", help="measure and print the card's figures, no "
                    "training; the card is written only with --card DIR or --install")
    tz.add_argument("--train-only", action="store_true", help="train and save the weights, skip measuring")
    tz.add_argument("--threads", type=bench_module.positive_int, default=1,
                    help="CPU threads for training (default 1)")
    tz.add_argument("--stage", choices=["all", "models", "medusa", "eagle"], default="all",
                    help="all (default); models: tokenizer, target, draft; medusa: only the Medusa heads; "
                         "eagle: only the EAGLE-1 and EAGLE-3 drafts")
    bench = sub.add_parser("bench", help="benchmark a method against plain decoding and HF on the prompt suite")
    bench_module.add_arguments(bench)
    args = parser.parse_args(argv)
    if args.cmd == "check":
        return check()
    if args.cmd == "train-zoo":
        check_train_zoo(tz, args)
        try:
            train_zoo.main(args.work, measure_only=args.measure_only, train_only=args.train_only,
                           threads=args.threads, stage=args.stage, install=args.install, card=args.card)
        except KeyboardInterrupt:
            print(f"\ninterrupted: the same command resumes the target and draft from their checkpoints in "
                  f"{args.work}", file=sys.stderr)
            return 130
        return 0
    if args.cmd == "bench":
        import torch

        bench_module.check_arguments(bench, args)
        if args.threads:
            torch.set_num_threads(args.threads)
        try:
            return bench_module.METHODS[args.method](args)
        except KeyboardInterrupt:  # --method all saves what it measured itself; this is the rest
            print("\ninterrupted", file=sys.stderr)
            return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
