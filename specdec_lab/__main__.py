"""The `specdec-lab` command: `specdec-lab check`, `train-zoo`, `train-heads`, `bench`.

Every flag is checked here, as it is parsed and before any model loads (the argparse types below wrap
`specdec_lab.checks`, the one place the package checks its arguments).
"""

import argparse
import os
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
            dev = ' (only the tests need it: pip install "specdec-lab[dev]")' if pkg == "nbval" else ""
            print(f"{pkg:<13} NOT INSTALLED{dev}")
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
    for name, spec in zoo.MODELS.items():  # the real models: converted, installed, or how to install them
        if (zoo.model_folder(name) / "config.json").exists():
            state = f"ready in {zoo.model_folder(name)}"
        elif zoo.shipped_gguf(spec) is not None:
            state = "installed (zoo.load_model converts it on first use, about 30 s)"
        else:
            state = f"not installed: {spec['install']}"
        print(f"model         {name}: {state}")
    return 0


def bench_arguments(parser) -> None:
    """The flags of `specdec-lab bench`; each is checked when parsed, before any model loads."""
    from specdec_lab import zoo

    named = ", ".join(f"{k} ({t.split('/')[-1]} with {d.split('/')[-1]})" for k, (t, d) in zoo.PAIRS.items())
    parser.add_argument("--method", choices=sorted(METHODS), default="all", help="all: every method, greedy "
                        "and sampled (chapter 08, the default); draft: the draft model against HF (chapter 03)")
    parser.add_argument("--pair", default="tiny", type=pair_name, help="model pair for zoo.load_pair: tiny "
                        f"(embedded, the default), {named} (docs/real-models.md says why each), or a "
                        "folder holding target/ and draft/")
    parser.add_argument("--device", type=device_name, help="cpu, cuda, mps ... (default: cuda when available, "
                        "else cpu)")
    parser.add_argument("--dtype", type=dtype_name, help="float32, bfloat16 or float16 (default: float32 on a CPU "
                        "and for local folders, the GPU's half precision for Hub models; with --target, bfloat16 "
                        "where the hardware does it natively, else float32). In half precision a greedy mismatch at "
                        "a near-tie of the target's logits is reported as a tie, not a bug")
    parser.add_argument("--temperatures", type=temperature_list, help="comma-separated; 0 = greedy (default 0,0.7)")
    parser.add_argument("--json", type=output_file, help="write the results here as JSON (with the run's settings "
                        "and versions); missing folders are created")
    parser.add_argument("--csv", type=output_file, help="write the results here as CSV; missing folders are created")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--gamma", type=positive_int, default=3, help="draft tokens per target pass (default 3: "
                        "the best for the zoo pair on a 2-core CPU, see notebook 03)")
    parser.add_argument("--target", choices=sorted(zoo.MODELS), help="a real chat model instead of a pair: its "
                        "held-out chat prompts in its template, its heads and its draft model (train-heads; else its "
                        "first layers, untrained)")
    parser.add_argument("--category", choices=["code", "edit", "doc", "chat", "rewrite"],
                        help="only this prompt category (code, edit, doc: the pair's suite; chat, code, rewrite: "
                        "--target's)")
    parser.add_argument("--limit", type=positive_int, help="only the first N prompts (with --target the categories "
                        "take turns: 12 gives 4 of each)")
    parser.add_argument("--naive", action="store_true", help="also time the loop without KV caches (--method draft)")
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--auto", action="store_true", help="also run the settings tuned for this device (chapter 08): "
                        "the draft model's best chain and tree, EAGLE-2's and EAGLE-3's depth and node budget, each "
                        "beside its default; the tuner measures for about ten seconds before the run")
    parser.add_argument("--batch", type=positive_int, help="decode B prompts at a time (chapter 09): the chain "
                        "methods against batched plain decoding, greedy unless --temperatures says otherwise")


def check_bench(parser, args) -> None:
    """The checks that involve two flags (parser.error exits with a one-line message)."""
    if args.target and (args.pair != "tiny" or args.method != "all" or args.batch):
        parser.error("--target runs the showdown (--method all) of a real model at batch 1: leave out "
                     "--pair, --method and --batch")
    if args.category in ("edit", "doc") and args.target or args.category in ("chat", "rewrite") and not args.target:
        parser.error(f"--category {args.category} is not a category of {'--target' if args.target else 'the pair'}'s "
                     "prompts: code, edit, doc for a pair; chat, code, rewrite for --target")
    if args.method == "draft":
        extra = [flag for flag in ("json", "csv", "temperatures") if getattr(args, flag) is not None]
        if extra:
            parser.error(f"--{extra[0]} belongs to the showdown (--method all); --method draft is greedy and "
                         "prints its table only")
    elif args.naive:
        parser.error("--naive belongs to --method draft (chapter 03's table); leave it out for the showdown")
    if args.auto and (args.method != "all" or args.batch):
        parser.error("--auto belongs to the showdown (--method all, no --batch): it adds the tuned settings beside "
                     "the defaults there")
    if args.batch and args.method != "all":
        parser.error("--batch runs the batched showdown of the chain methods; leave out --method")
    if args.json and args.csv and os.path.abspath(args.json) == os.path.abspath(args.csv):
        parser.error(f"--json and --csv both name {args.json!r}: give them different files")


# Types for argparse: each returns the parsed value or raises ArgumentTypeError, which argparse prints as
# "argument --flag: <message>", before anything is loaded.

def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: give 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number: give 1 or more")
    return value


def temperature_list(text: str) -> list[float]:
    from specdec_lab import checks

    temperatures = []
    for part in text.split(","):
        try:
            T = checks.temperature(float(part))
        except checks.ArgumentError as e:  # a number, but not a temperature
            raise argparse.ArgumentTypeError(str(e)) from None
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a number: give comma-separated temperatures, "
                                             "0 for greedy, e.g. 0,0.7") from None
        if T in temperatures:
            raise argparse.ArgumentTypeError(f"{T:g} appears twice in {text!r}: give each temperature once")
        temperatures.append(T)
    return temperatures


def output_file(text: str) -> str:
    """A file the results can be written to: not a folder, and under a folder that exists or can be made."""
    from pathlib import Path

    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder: give a file name in it, e.g. {path / 'showdown'}"
                                         ".json")
    folder = path.absolute().parent
    while not folder.exists():  # the nearest folder that exists: the missing ones are created when saving
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: no permission to write in {folder}")
    return text


DTYPES = ("float32", "bfloat16", "float16")


def dtype_name(text: str):
    import torch

    name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(text, text)
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a dtype the models load in: give one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def pair_name(text: str) -> str:
    from specdec_lab import zoo

    try:
        zoo.resolve_pair(text)
    except (ValueError, FileNotFoundError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def device_name(text: str) -> str:
    from specdec_lab import zoo

    try:
        return zoo.check_device(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def folder(text: str) -> Path:
    """An argparse type: a folder to write in (made if missing), outside the installed package."""
    path, package = Path(text), Path(__file__).resolve().parent
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file: give a folder")
    if path.resolve().is_relative_to(package):
        raise argparse.ArgumentTypeError(f"{text!r} is inside the installed package ({package}): pick a folder "
                                         "outside it (--install is the one way to replace the shipped zoo)")
    return path


def heads_doc() -> str:
    from specdec_lab import train_heads

    return train_heads.__doc__


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give minutes, e.g. 5 or 0.5") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of minutes")
    return value


def text_source(text: str) -> Path | str:
    return text if text in ("chat", "chat-untemplated", "chat-mixed") else existing_folder(text)


def existing_folder(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder: give a folder of text files")
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


def train_heads(args) -> int:
    """`specdec-lab train-heads` (its flags checked as they are parsed): train, save, say how to load."""
    import json

    import torch

    from specdec_lab import zoo
    from specdec_lab.train_heads import default_folder, train

    name = str(zoo.EMBEDDED["tiny"] / "target") if args.target == "tiny" else args.target
    device = zoo.check_device(args.device or zoo.default_device())
    dtype = zoo.gpu_dtype(device) if device.startswith("cuda") else torch.float32
    try:
        if name in zoo.MODELS:  # a real model the course runs offline (fp32: its heads are trained in fp32)
            target, tok = zoo.load_model(name, device)
        else:
            target, tok = zoo._load_one(name, device, dtype)
    except (RuntimeError, OSError, ValueError) as e:  # offline with a Hub id, a folder with no model in it
        print(f"specdec-lab train-heads: error: --target {args.target}: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or default_folder(target.config.name_or_path, args.method)
    try:
        train(target, tok, args.method, out, args.minutes, args.data, args.lm_head, steps=args.steps,
              windows=args.windows, init=args.init, draft_layers=args.layers, memory_gb=args.memory,
              answers=args.answers)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the same command resumes from the checkpoint in {out}")
        return 130
    except ValueError as e:  # text that cannot train this target (no chat template, too short)
        print(f"specdec-lab train-heads: error: {e}", file=sys.stderr)
        return 2
    if args.method == "draft":
        print(f"load it with: DraftModelDrafter(draft_models.load_distilled(target, {json.dumps(str(out))}), gamma=3)"
              + (f"; zoo.load_pair({args.target!r}) returns it as the pair's draft" if name in zoo.MODELS else ""))
    else:
        if args.method == "block":
            print(f"load it with: BlockDrafter(BlockNet.from_pretrained(target, {json.dumps(str(out))}), gamma=4)")
        else:
            kind = "MedusaDrafter" if args.method == "medusa" else "EagleDrafter"
            print(f"load it with: {kind}.from_pretrained(target, {json.dumps(str(out))})")
    return 0


# ---- `specdec-lab bench`: flags in, exit code out (the benchmarks themselves are specdec_lab.bench) ---------


def _load(args):
    """The pair for `specdec-lab bench`, with a word when the CPU only emulates the chosen bfloat16."""
    import torch

    from specdec_lab import precision, zoo

    target, draft, tok = zoo.load_pair(args.pair, device=args.device, dtype=args.dtype)
    if target.device.type == "cpu" and target.dtype == torch.bfloat16 and not precision.cpu_bf16_is_native():
        print("note: this CPU emulates bfloat16 (no AVX512-BF16 or AMX): expect it 10-40x slower than float32")
    return target, draft, tok


def bench_draft(args) -> int:
    """`specdec-lab bench --method draft` (chapter 03): the draft model against plain decoding and HF."""
    import torch

    from specdec_lab import bench, lineup, report

    target, draft, tok = _load(args)
    prompts = [ids.to(target.device) for ids in bench.suite_prompts(tok, args.category, args.limit)]
    methods = lineup.draft_methods(target, draft, args.max_new_tokens, args.gamma, tok.eos_token_id, naive=args.naive)
    print(f"pair {args.pair!r} in {str(target.dtype).removeprefix('torch.')}, {len(prompts)} prompts, greedy, "
          f"max_new_tokens={args.max_new_tokens}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    rows = bench.run(target, methods, prompts, progress=True)
    print(report.format_table(rows))
    ours, hf = rows[2], rows[3 + bool(args.naive)]
    print(f"\ndraft model γ={args.gamma}: {ours.tokens_per_second / rows[0].tokens_per_second:.2f}x target only, "
          f"{ours.tokens_per_second / hf.tokens_per_second:.2f}x {hf.method} "
          f"({ours.tokens_per_second / max(r.tokens_per_second for r in rows if r.method.startswith('HF assisted')):.2f}x "
          "the fastest HF assisted row)")
    return 0 if not any(r.bugs for r in rows) else 1


def _meta(args, target, prompts: list, temperatures: list, **extra) -> dict:
    """A benchmark run's settings and versions, saved beside its results."""
    import time

    import torch
    import transformers

    from specdec_lab import precision

    cpu = {"cpu": precision.cpu_name()} if target.device.type == "cpu" else {}
    return dict(pair=args.pair, device=str(target.device), **cpu, dtype=str(target.dtype).removeprefix("torch."),
                threads=torch.get_num_threads(), prompts=len(prompts), **extra,
                category=args.category or "all", max_new_tokens=args.max_new_tokens, temperatures=temperatures,
                torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                machine=platform.machine(), date=time.strftime("%Y-%m-%d %H:%M"))


def _save(results: list[dict], meta: dict, args) -> None:
    """`report.save_results` to the --json and --csv files given, saying where."""
    from specdec_lab import report

    report.save_results(results, meta, args.json, args.csv)
    for path in (args.json, args.csv):
        if path:
            print(f"wrote {path}")


def bench_all(args) -> int:
    """`specdec-lab bench` (chapter 08's showdown): every method, greedy and sampled."""
    import torch
    import transformers

    from specdec_lab import bench, chat, lineup, report
    from specdec_lab.prompts import load_prompts

    extra = {}
    if args.target:  # a real chat model: its held-out chat prompts in its template, its draft model as the draft
        from specdec_lab import precision, zoo
        from specdec_lab.draft_models import DraftHead

        device = zoo.check_device(args.device or zoo.default_device())
        dtype = args.dtype or precision.decoding_dtype(device)  # bf16 where native: a pass over a few tokens ~ a step
        target, draft, tok = zoo.load_pair(args.target, device=device, dtype=dtype)  # a distilled draft or an early exit
        held = sorted(chat.held_out(args.category), key=lambda p: int(p["id"].rsplit("-", 1)[1]))  # categories take turns
        prompts, template = held[:args.limit], True
        args.pair = args.target
        what = (f"{len(draft.model.layers)} layers distilled from it (train-heads --method draft)"
                if isinstance(draft.lm_head, DraftHead) else f"first {zoo.EARLY_EXIT} layers (an early exit, untrained)")
        print(f"the draft model: {args.target}'s {what}; {precision.cpu_name() if device == 'cpu' else device}")
        extra["draft"] = what  # saved with the run (files without it ran the untrained early exit)
    else:
        target, draft, tok = _load(args)
        prompts, template = load_prompts(args.category)[:args.limit], False
    temperatures = args.temperatures or list(lineup.TEMPERATURES)
    device = target.device
    meta = _meta(args, target, prompts, temperatures, **extra)
    print(f"pair {args.pair!r} on {device} in {meta['dtype']}, {len(prompts)} prompts, "
          f"max_new_tokens={args.max_new_tokens}, "
          f"{meta['threads']} threads, torch {torch.__version__}, transformers {transformers.__version__}")
    try:
        results = bench.showdown(target, draft, tok, prompts, temperatures, args.max_new_tokens,
                                 progress=True, gamma=args.gamma, auto=args.auto, template=template,
                                 small_tree=bool(args.target))
    except bench.Interrupted as stop:
        return _save_partial(stop.partial, meta, args)
    for T in temperatures:
        print("\n" + report.format_showdown(results, T))
    _save(results, meta, args)
    greedy = [r for r in results if r["identical"] is not None and r["category"] == "all"]
    tied, broken = [r["method"] for r in greedy if r["ties"]], [r["method"] for r in greedy if r["bugs"]]
    if tied:
        print(f"\nmismatches at near-ties of the target's logits (its rounding in {meta['dtype']} decides them; not "
              f"errors): {', '.join(tied)}")
    if broken:
        print(f"\nNOT identical to plain greedy decoding, beyond ties (bugs): {', '.join(broken)}")
    return 1 if broken else 0


def _save_partial(results: list[dict], meta: dict, args) -> int:
    """Ctrl-C: print and save what was measured, each result and the meta marked partial; exit code 130."""
    from specdec_lab import report

    done = {r["temperature"]: r["prompts"] for r in results if r["category"] == "all" and not r["skipped"]}
    if not done:
        print("\ninterrupted before the first prompt was done: nothing measured, nothing saved")
        return 130
    so_far = ", ".join(f"T={T:g}: {n} of {meta['prompts']} prompts" for T, n in done.items())
    for T in done:
        print("\n" + report.format_showdown(results, T))
    files = [path for path in (args.json, args.csv) if path]
    report.save_results([dict(r, partial=True) for r in results], dict(meta, partial=f"interrupted after {so_far}"),
                       args.json, args.csv)
    saved = f"saved them, marked partial, to {' and '.join(files)}" if files else "give --json or --csv to save them"
    print(f"\ninterrupted: measured {so_far}; {saved}")
    return 130


def bench_batch(args) -> int:
    """`specdec-lab bench --batch B` (chapter 09): the chain methods decoding B prompts at a time."""
    from specdec_lab import bench, report
    from specdec_lab.prompts import load_prompts

    target, draft, tok = _load(args)
    prompts = load_prompts(args.category)[:args.limit]
    temperatures = args.temperatures or [0.0]
    meta = _meta(args, target, prompts, temperatures, batch=args.batch)
    print(f"pair {args.pair!r} on {target.device} in {meta['dtype']}, {len(prompts)} prompts in batches of "
          f"{args.batch}, max_new_tokens={args.max_new_tokens}, {meta['threads']} threads")
    results = bench.batch_showdown(target, draft, tok, prompts, args.batch, temperatures, args.max_new_tokens,
                                   args.gamma, progress=True)
    for T in temperatures:
        print("\n" + report.format_batch_showdown(results, T))
    _save(results, meta, args)
    broken = [r["method"] for r in results if r["identical"] is not None and r["identical"] < r["prompts"]]
    if broken:
        print(f"\nNOT identical to each prompt's own greedy decoding: {', '.join(broken)}")
    return 1 if broken else 0


# `specdec-lab bench --method NAME` runs METHODS[NAME](args).
METHODS = {"all": bench_all, "draft": bench_draft}


def main(argv=None) -> int:
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
    tz.add_argument("--threads", type=positive_int, default=1,
                    help="CPU threads for training (default 1)")
    tz.add_argument("--stage", choices=["all", "models", "medusa", "eagle"], default="all",
                    help="all (default); models: tokenizer, target, draft; medusa: only the Medusa heads; "
                         "eagle: only the EAGLE-1 and EAGLE-3 drafts")
    th = sub.add_parser("train-heads", help="train Medusa heads, an EAGLE-1/EAGLE-3 draft or a draft model distilled "
                        "from the target, for any causal LM",
                        description=heads_doc(), formatter_class=argparse.RawDescriptionHelpFormatter)
    th.add_argument("--target", required=True, help="tiny (the zoo's target), smollm2-135m-instruct (a real model, "
                    "offline), a Hugging Face id or a local folder")
    th.add_argument("--method", required=True, choices=["medusa", "eagle1", "eagle3", "block", "draft"],
                    help="block: EAGLE-1's draft drafting 4 tokens in one forward; draft: a few of the target's own "
                    "layers trained on its distributions (a draft model)")
    th.add_argument("--device", type=device_name, help="cpu, cuda, ... (default: cuda when available, else cpu)")
    th.add_argument("--minutes", type=positive_float, help="time budget of the whole run, caching included (default: "
                    "the full recipe, however long it takes)")
    th.add_argument("--data", type=text_source, help="a folder of text files to train on, or chat (a chat model's "
                    "own answers in its template), chat-untemplated (the same without it) or chat-mixed (both) "
                    "(default: the course corpus, the Python standard library)")
    th.add_argument("--out", type=folder, help="output folder (default: the user's cache, "
                    "~/.cache/specdec-lab/heads/<target>/<method>)")
    th.add_argument("--steps", type=positive_int, help="training steps (default: the recipe's, fewer to fit --minutes)")
    th.add_argument("--windows", type=positive_int, help="training windows of 256 tokens (default: the recipe's)")
    th.add_argument("--lm-head", choices=["own", "shared"], default="own", help="Medusa: each head its own LM head "
                    "initialised from the target's (own, as published; the default) or the target's, frozen (shared)")
    th.add_argument("--init", choices=["eagle1"], help="block: start from this target's trained EAGLE-1 draft (its "
                    "layer; the placeholders start fresh), found where train-heads saved it or shipped")
    th.add_argument("--layers", type=positive_int, help="draft: how many of the target's first layers the draft "
                    "model copies and trains (default: the recipe's; at most half the target's)")
    th.add_argument("--answers", type=positive_int, default=2, help="chat data: conversations per prompt in the "
                    "template, the greedy answer and N - 1 sampled at T = 0.7 (default 2, shipped for the real model; "
                    "more are generated once into the user cache)")
    th.add_argument("--memory", type=positive_float, metavar="GB", help="the most host memory the target's cached "
                    "states may take (default 2; fewer windows train where they do not fit, and the run says so)")
    th.add_argument("--threads", type=positive_int, help="CPU threads (default: torch's own choice)")
    bench = sub.add_parser("bench", help="benchmark a method against plain decoding and HF on the prompt suite")
    bench_arguments(bench)
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
    if args.cmd == "train-heads":
        if args.lm_head == "shared" and args.method != "medusa":
            th.error("--lm-head belongs to --method medusa (EAGLE drafts always read the target's own LM head)")
        if args.init and args.method != "block":
            th.error("--init eagle1 belongs to --method block (a block drafter is EAGLE-1's draft plus placeholders)")
        if args.layers and args.method != "draft":
            th.error("--layers belongs to --method draft (the draft model's depth)")
        return train_heads(args)
    if args.cmd == "bench":
        import torch

        check_bench(bench, args)
        if args.threads:
            torch.set_num_threads(args.threads)
        try:
            return bench_batch(args) if args.batch else METHODS[args.method](args)
        except KeyboardInterrupt:  # --method all saves what it measured itself; this is the rest
            print("\ninterrupted", file=sys.stderr)
            return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
