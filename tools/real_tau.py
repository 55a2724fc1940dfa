"""τ of the drafts trained for SmolLM2-135M-Instruct on its 24 held-out chat prompts, greedy, by category.

    python tools/real_tau.py --json results/tau-smollm2-135m-instruct.json
    python tools/real_tau.py --json results/tau-smollm2-135m-instruct.json --only-ablation --ablation IN WITHOUT
    python tools/real_tau.py --json results/tau-smollm2-135m-instruct.json --only "EAGLE-2, dynamic tree" ...
    python tools/real_tau.py --json results/tau-smollm2-135m-instruct.json --plain

With --plain every row also decodes 8 openings of plain text to continue, outside the template
(`chat.plain_held_out()`): a column "plain" of its own, not pooled into "all" (a row rerun without it loses it).

The second adds the rows of chapter 11's template ablation (two EAGLE-1 drafts trained alike, on the answers in the
chat template and without it) to the saved table; rows already there for other methods are kept.

τ = new tokens / target passes, pooled over a category's prompts (the prompt's own pass included). Every output is
checked against the model's own greedy decoding (Hugging Face's `generate`); in float32 (the default) a difference
stops the run. --dtype auto runs in the precision `bench --target` decodes in (`precision.decoding_dtype`: bfloat16
where the CPU has it natively): there a difference at a near-tie of the logits is a tie (`identity.classify`), counted
and printed, and any other stops the run. τ counts passes, not seconds, so it does not depend on the machine's load.
Chapter 11 prints the saved table (float32: the same on every machine), chapter 12 its block drafter's row beside
EAGLE-1's chain when `specdec-lab train-heads --method block` has trained one (`--only "block drafter, γ=4"`), and
the draft model distilled from the target (`train-heads --method draft`, shipped) beside the untrained early exit
it replaced (`--only "draft model, chain γ=3" "draft model, chain γ=4" "early exit (8 of 30 layers, untrained),
chain γ=3"`). Every trained draft also runs as a chain of 3 ("..., chain γ=3"): for those rows the file keeps, per
depth, the share of the rounds that reached it (every depth before it accepted) that accepted it
("accepted_by_depth"), which chapter 11 sets beside the draft's top-1 agreement by offset in training.
"""
import argparse
import json
import time
from pathlib import Path

import torch

from specdec_lab import (DraftModelDrafter, EagleDrafter, MedusaDrafter, PromptLookupDrafter, chat, draft_models,
                         generate, identity, measure, precision, train_heads, zoo)
from specdec_lab.eagle import BlockDrafter, BlockNet

ABLATION = ("EAGLE-2, ablation: trained in the template", "EAGLE-2, ablation: trained without it")


def methods(model, found: dict, ablation: list[str] | None) -> dict:
    """{name: a function that makes a fresh drafter}."""
    table = {"prompt lookup": lambda: PromptLookupDrafter(),
             "Medusa": lambda: MedusaDrafter.from_pretrained(model, found["medusa"]),
             "EAGLE-1, chain γ=4": lambda: EagleDrafter.from_pretrained(model, found["eagle1"], branching=[1] * 4),
             "EAGLE-2, dynamic tree": lambda: EagleDrafter.from_pretrained(model, found["eagle1"], dynamic=True),
             "EAGLE-2, dynamic tree of 60 (the paper's)": lambda: EagleDrafter.from_pretrained(
                 model, found["eagle1"], dynamic=True, topk=10, depth=6, budget=60),
             "EAGLE-3, dynamic tree": lambda: EagleDrafter.from_pretrained(model, found["eagle3"], dynamic=True)}
    if "block" in found:  # chapter 12's block drafter, once `train-heads --method block` has trained one
        table["block drafter, γ=4"] = lambda: BlockDrafter(BlockNet.from_pretrained(model, found["block"]), 4)
    # chains of 3, one per trained draft: its top-1 agreement by offset in training beside its τ (chapter 11)
    table["Medusa, chain γ=3"] = lambda: MedusaDrafter.from_pretrained(model, found["medusa"],
                                                                      choices=[[0], [0, 0], [0, 0, 0]])
    table["EAGLE-1, chain γ=3"] = lambda: EagleDrafter.from_pretrained(model, found["eagle1"], branching=[1] * 3)
    table["EAGLE-3, chain γ=3"] = lambda: EagleDrafter.from_pretrained(model, found["eagle3"], branching=[1] * 3)
    if "block" in found:
        table["block drafter, γ=3"] = lambda: BlockDrafter(BlockNet.from_pretrained(model, found["block"]), 3)
    if "draft" in found:  # a draft model distilled from the target (`train-heads --method draft`), read once
        distilled = draft_models.load_distilled(model, found["draft"])
        for gamma in (3, 4):
            table[f"draft model, chain γ={gamma}"] = lambda gamma=gamma: DraftModelDrafter(distilled, gamma)
    table["early exit (8 of 30 layers, untrained), chain γ=3"] = lambda: DraftModelDrafter(
        draft_models.early_exit_model(model, zoo.EARLY_EXIT), 3)
    for name, folder in zip(ABLATION, ablation or []):
        table[name] = lambda folder=folder: EagleDrafter.from_pretrained(model, folder, dynamic=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=64, help="new tokens per prompt (default 64)")
    parser.add_argument("--json", help="also write the table here")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--only-ablation", action="store_true", help="run only the --ablation rows")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these rows (the others saved in --json "
                        "are kept: τ counts passes, so rows from separate runs compare), e.g. after retraining a "
                        "draft")
    parser.add_argument("--plain", action="store_true", help="also decode the 8 openings of plain text to continue, "
                        "outside the template (`chat.plain_held_out`): a column \"plain\" of its own")
    parser.add_argument("--dtype", choices=("float32", "auto"), default="float32", help="float32 (default: exact, the "
                        "saved table) or auto (bfloat16 where this CPU has it natively, as bench --target decodes)")
    parser.add_argument("--ablation", nargs=2, metavar=("IN", "WITHOUT"), help="two folders of EAGLE-1 weights "
                        "trained alike, on the answers in the chat template and without it (chapter 11)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "float32" else precision.decoding_dtype("cpu")
    model, tok = zoo.load_model("smollm2-135m-instruct", device="cpu", dtype=dtype)
    found, eos = train_heads.find(model), tok.convert_tokens_to_ids("<|im_end|>")
    make, table, t0, ties, depths = methods(model, found, args.ablation), {}, time.monotonic(), [], {}
    if args.only_ablation:
        make = {name: m for name, m in make.items() if name in ABLATION}
    if args.only:
        unknown = sorted(set(args.only) - set(make))
        if unknown:
            raise SystemExit(f"--only {unknown}: the rows are {sorted(make)}")
        make = {name: m for name, m in make.items() if name in args.only}
    prompts = [(p, chat.chat_ids(tok, p["prompt"])) for p in chat.held_out()]
    if args.plain:  # plain text to continue, outside the template: a column of its own, not in "all"
        prompts += [(p, chat.plain_ids(tok, p["prompt"])) for p in chat.plain_held_out()]
    for p, ids in prompts:
        want = measure.hf_generate(model, ids, args.new, eos_token_id=eos).tolist()
        for name, drafter in make.items():
            gen = generate(model, ids, drafter(), max_new_tokens=args.new, eos_token_id=eos)
            if gen.tokens != want:  # in fp32 never; in bf16 only at a near-tie of the logits
                mismatch = identity.classify(model, ids, gen.tokens, want)
                if dtype == torch.float32 or not mismatch.tie:
                    raise SystemExit(f"{name} changed the greedy output of {p['id']}: {mismatch}")
                ties.append(f"{name}, {p['id']}")
            for cat in (p["category"], "all") if p["category"] in chat.CATEGORIES else (p["category"],):
                row = table.setdefault(name, {}).setdefault(cat, [0, 0])
                row[0] += len(gen.tokens)
                row[1] += gen.target_calls
            if "γ=3" in name:  # a chain of 3: per depth k, the rounds that reached it and those that accepted it
                counts = depths.setdefault(name, [[0, 0] for _ in range(3)])
                for accepted, deep in zip(gen.accept_lengths, gen.draft_lengths):
                    for k in range(min(deep, accepted + 1, 3)):  # depth k + 1 is tried once depths 1..k were accepted
                        counts[k][0] += 1
                        counts[k][1] += accepted > k
    cats = [*chat.CATEGORIES, "all"] + (["plain"] if args.plain else [])
    folders = {} if args.only_ablation else {m: found[m] for m in ("eagle1", "eagle3", "medusa")}
    folders |= {m: found[m] for m in ("block", "draft") if m in found and not args.only_ablation}
    folders |= dict(zip(ABLATION, args.ablation or []))
    cards = {m: json.loads((Path(f) / "config.json").read_text()) for m, f in folders.items()}
    print(f"τ on {len(chat.held_out())} held-out prompts, {args.new} new tokens, greedy, in {str(dtype)[6:]} on "
          f"{precision.cpu_name()}; every output identical to the model's own greedy decoding"
          f"{f' but {len(ties)} at near-ties of the logits (not bugs)' if ties else ''}; {time.monotonic() - t0:.0f} s")
    for tie in ties:
        print(f"  a tie: {tie}")
    print(f"{'method':<52} " + " ".join(f"{c:>8}" for c in cats))
    for name, by in table.items():
        print(f"{name:<52} " + " ".join(f"{by[c][0] / by[c][1]:8.2f}" for c in cats))
    accept = {name: [round(a / n, 4) if n else None for n, a in counts] for name, counts in depths.items()}
    for name, rates in accept.items():  # what decoding saw at each depth, given every depth before it accepted
        print(f"{name}: accepted at depth 1, 2, 3 given the depths before it accepted {rates}")
    if args.json and dtype != torch.float32:
        print(f"not written to {args.json}: the saved table is float32's (run without --dtype)")
    elif args.json:
        out = {name: {c: round(by[c][0] / by[c][1], 3) for c in cats} for name, by in table.items()}
        trained = {m: {k: card.get(k) for k in ("data", "seconds", "val_accuracy_vs_target", "draft_vocab_coverage")}
                   | {"steps": card["config"]["steps"], "windows": card["config"]["windows"],
                      "scored": card.get("scored") or "all"}  # runs before answer masking scored every position
                   for m, card in cards.items()}
        file = Path(args.json)
        old = json.loads(file.read_text()) if file.exists() else {"new_tokens": args.new, "tau": {}, "heads": {}}
        if old["new_tokens"] != args.new:
            raise SystemExit(f"{file} holds runs of {old['new_tokens']} new tokens: give --new {old['new_tokens']}")
        file.write_text(json.dumps({"new_tokens": args.new, "prompts": len(chat.held_out()),
                                    "plain_prompts": len(chat.plain_held_out()),
                                    "tau": old["tau"] | out, "heads": old["heads"] | trained,
                                    "accepted_by_depth": old.get("accepted_by_depth", {}) | accept}, indent=1) + "\n")


if __name__ == "__main__":
    main()
