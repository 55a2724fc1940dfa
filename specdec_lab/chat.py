"""Chat data for a real instruct model, made on this machine: prompts from text every Python install holds, answers
from the target itself.

A feature draft (EAGLE) or Medusa heads learn to predict what the target will say, so the best text to train them
on is the target's own answers, in the chat template it is used with (Li et al. 2024 regenerate their training
answers with the target for this reason). With no dataset to download, the questions come from what is on disk:

    chat     questions about Python's keywords, modules and functions, and everyday requests
    code     "write a function that ..." from standard-library docstrings, "explain this code" from its source
    rewrite  summaries and rewrites of paragraphs of Python's own documentation (pydoc's topics)

`training_prompts()` builds them (deterministic); `HELD_OUT` (data/chat_prompts.json) holds prompts written by hand
for this course that no training prompt resembles: tests and chapter 11 decode from them. `self_answers` runs the
target greedily over the prompts in batches, appending each answer to a JSON-lines file, so an interrupted run
resumes where it stopped. `conversations` renders prompt and answer in the chat template, as the model reads them.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import sysconfig
import time
from pathlib import Path

import torch

__all__ = ["CATEGORIES", "HELD_OUT", "held_out", "training_prompts", "chat_ids", "self_answers", "conversations"]

CATEGORIES = ("chat", "code", "rewrite")
HELD_OUT = Path(__file__).parent / "data" / "chat_prompts.json"

EVERYDAY = ["staying focused while studying", "learning a new language", "sleeping better", "saving money",
            "writing a good email", "preparing for a job interview", "keeping a plant alive", "running a meeting",
            "cooking rice", "starting to exercise", "reading more books", "giving a short talk",
            "making friends in a new city", "organizing a small kitchen", "taking notes in class",
            "travelling on a budget", "drinking more water", "learning to draw", "writing a cover letter",
            "planning a birthday party"]
THINGS = ["the moon", "autumn leaves", "a quiet library", "the ocean at night", "a cup of coffee", "rain on a window",
          "a mountain trail", "an old bicycle", "the first snow", "a city at dawn", "a lighthouse", "a garden in spring"]


def held_out(category: str | None = None) -> list[dict]:
    """The hand-written prompts [{"id", "category", "prompt"}] (never trained on), or those of one category."""
    prompts = json.loads(HELD_OUT.read_text(encoding="utf-8"))
    return [p for p in prompts if category is None or p["category"] == category]


def _stdlib_functions(limit: int) -> list[tuple[str, str, str]]:
    """(dotted name, first docstring line, source) of small documented public functions of the standard library."""
    root, found = Path(sysconfig.get_paths()["stdlib"]), []
    for path in sorted(root.glob("*.py")):  # top-level modules only: names a learner has heard of
        if path.name.startswith("_"):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if doc and not node.name.startswith("_") and 3 <= node.end_lineno - node.lineno <= 14:
                first = doc.strip().splitlines()[0].strip()
                if 20 <= len(first) <= 100 and first[0].isupper():
                    found.append((f"{path.stem}.{node.name}", first, ast.get_source_segment(source, node)))
    return found[:limit]


def _paragraphs(lo: int = 200, hi: int = 700) -> list[tuple[str, str]]:
    """(topic, paragraph) of Python's own documentation (pydoc's topics), plain prose only."""
    from pydoc_data.topics import topics

    out = []
    for name, text in sorted(topics.items()):
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            if lo <= len(para) <= hi and not re.search(r"[{}\[\]<>|=*]{2}|::|\*\*\*", para) and para[0].isupper():
                out.append((name, para))
    return out


TRAINING = 480  # the prompts heads are trained on: the first 480 in hash order (about 35 min of answers, 2 cores)


def training_prompts(limit: int | None = TRAINING) -> list[dict]:
    """The first `limit` (None: all 1,108) of the prompts [{"id", "category", "prompt"}] made from text on this
    machine, in the order of a hash of their id (every category among the first few)."""
    from pydoc_data.topics import topics

    prompts = []

    def add(category, text):
        prompts.append({"id": f"{category}-{len(prompts)}", "category": category, "prompt": text})

    for name in sorted(topics):
        add("chat", f"Explain {name.replace('-', ' ')} in Python in simple terms.")
    for mod in sorted(sys.stdlib_module_names):
        if not mod.startswith("_"):
            add("chat", f"What is the Python module `{mod}` used for?")
    for task in EVERYDAY:
        add("chat", f"Give me three tips for {task}.")
    for thing in THINGS:
        add("chat", f"Write a short poem about {thing}.")
    for name, first, source in _stdlib_functions(240):
        verb = re.sub(r"^(Return|Get|Make|Convert|Compute|Create|Find|Check|Test)s?\b",
                      lambda m: m.group(1).lower() + "s", first.rstrip("."))
        add("code", f"Write a Python function that {verb[0].lower() + verb[1:]}.")
        add("code", f"Explain what this Python function does:\n\n```python\n{source}\n```")
    for i, (name, para) in enumerate(_paragraphs()[:300]):
        task = ("Summarize in one sentence:", "Rewrite this in simpler words:", "Summarize the main point:")[i % 3]
        add("rewrite", f"{task} {para}")
    return sorted(prompts, key=lambda p: hashlib.sha1(p["id"].encode()).digest())[:limit]


def chat_ids(tok, text: str) -> torch.Tensor:
    """[1, T] one user message in the model's chat template, ending where the assistant's answer starts."""
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids


@torch.no_grad()
def self_answers(target, tok, prompts: list[dict], file: Path | str, max_new_tokens: int = 128, batch: int = 24,
                 progress: bool = True) -> list[dict]:
    """The target's greedy answer to every prompt: [{"id", "category", "prompt", "answer"}], in `prompts` order.

    Answers already in `file` (JSON lines) are kept; the rest are generated in batches of similar length (left
    padding), each batch appended as soon as it is done, so a rerun resumes. Stops at the template's end token."""
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if file.exists():
        for line in file.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            done[row["id"]] = row
    todo = sorted((p for p in prompts if p["id"] not in done), key=lambda p: hashlib.sha1(p["id"].encode()).digest())
    todo = [p for i in range(0, len(todo), 4 * batch)  # every category early; similar lengths share a batch
            for p in sorted(todo[i: i + 4 * batch], key=lambda p: len(p["prompt"]))]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    side, tok.padding_side = tok.padding_side, "left"
    t0 = time.monotonic()
    try:
        for i in range(0, len(todo), batch):
            rows = todo[i: i + batch]
            texts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                             add_generation_prompt=True) for r in rows]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
            out = target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                                  pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos)
            with file.open("a", encoding="utf-8") as f:
                for r, new in zip(rows, out[:, enc.input_ids.shape[1]:].tolist()):
                    new = new[: new.index(eos)] if eos in new else new  # the answer without its end token
                    done[r["id"]] = {**r, "answer": tok.decode(new)}
                    f.write(json.dumps(done[r["id"]]) + "\n")
            if progress:
                n = min(i + batch, len(todo))
                eta = (time.monotonic() - t0) / n * (len(todo) - n)
                print(f"answers: {n}/{len(todo)} new ({eta / 60:.0f} min left)", flush=True)
    finally:
        tok.padding_side = side
    return [done[p["id"]] for p in prompts]


def conversations(tok, answers: list[dict]) -> list[str]:
    """Each prompt and answer rendered in the chat template, ending with the template's end of turn."""
    return [tok.apply_chat_template([{"role": "user", "content": a["prompt"]},
                                     {"role": "assistant", "content": a["answer"]}], tokenize=False)
            for a in answers]
