"""Run a chapter on another pair by changing its one `PAIR = ...` line, exactly as a learner would.

    python tools/on_pair.py --random /tmp/pair                 # write a randomly initialised local pair
    python tools/on_pair.py notebooks/05_medusa.ipynb /tmp/pair [--out DIR]

--random FOLDER writes FOLDER/target (a Qwen2, 4 layers, width 128) and FOLDER/draft (2 layers, width 64), both
with the zoo's tokenizer: a pair that is not the zoo, of another architecture, with no heads trained for it.
Running a notebook executes a copy of it (the committed one is never touched) with PAIR set to the folder, in
DIR (default: a new temporary folder), then prints the notes the chapter wrote where your pair differs from the
text (`zoo.claim`) and the time it took. Exit status 1 when a cell fails. Heads that chapters 05 and 06 train go
to the user cache (`specdec_lab.train_heads.default_folder`; set XDG_CACHE_HOME to put them elsewhere).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

PAIR_LINE = re.compile(r'^PAIR = "tiny"(.*)$', re.M)


def random_pair(folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from specdec_lab import zoo

    tok = AutoTokenizer.from_pretrained(zoo.EMBEDDED["tiny"] / "target")
    for name, width, layers, seed in (("target", 128, 4, 0), ("draft", 64, 2, 1)):
        torch.manual_seed(seed)
        config = Qwen2Config(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=2048, eos_token_id=tok.eos_token_id)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder / name)
        tok.save_pretrained(folder / name)
    print(f"wrote a random Qwen2 pair to {folder}: target (4 layers, width 128), draft (2 layers, width 64)")


def run(notebook: Path, pair: str, out: Path) -> int:
    nb = nbformat.read(notebook, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and PAIR_LINE.search(c.source)]
    if len(cells) != 1:
        print(f"{notebook}: expected one `PAIR = \"tiny\"` line, found {len(cells)}", file=sys.stderr)
        return 2
    cells[0].source = PAIR_LINE.sub(lambda m: f"PAIR = {pair!r}{m.group(1)}", cells[0].source)
    out.mkdir(parents=True, exist_ok=True)
    path = out / notebook.name
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=None, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.resolve().parent)}})
    try:
        client.execute()
        failed = None
    except CellExecutionError as e:
        failed = str(e).strip().splitlines()[-1]
    nbformat.write(nb, path)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    notes = [line for line in text.splitlines() if line.startswith(("note:", "no "))]  # claims, heads trained
    for line in notes:
        print(f"  {line}")
    verdict = f"FAILED: {failed}" if failed else "ran end to end"
    print(f"{notebook} on {pair}: {verdict} in {time.perf_counter() - start:.0f} s; executed copy: {path}")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?", type=Path)
    parser.add_argument("pair", nargs="?", help="a folder with target/ and draft/, or a named pair")
    parser.add_argument("--random", type=Path, metavar="FOLDER", help="write a random local pair to FOLDER first")
    parser.add_argument("--out", type=Path, help="where the executed copy goes (default: a new temporary folder)")
    args = parser.parse_args(argv)
    if args.random:
        random_pair(args.random)
    if args.notebook is None:
        return 0 if args.random else parser.error("give a notebook and a pair, or --random FOLDER")
    if args.pair is None:
        parser.error("give the pair to run the notebook on")
    return run(args.notebook, args.pair, args.out or Path(tempfile.mkdtemp(prefix="on_pair-")))


if __name__ == "__main__":
    sys.exit(main())
