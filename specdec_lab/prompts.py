"""The held-out prompt suite that every benchmark and notebook decodes from.

`data/prompts.json` holds original Python source prefixes, written for this course and checked
(by `tests/test_prompts.py`) not to appear in the standard-library training corpus of the zoo
models. They come in three categories, because speculative decoding pays off very differently
on each:

    code  the start of a function or class (signature, docstring, maybe a first line);
          the continuation is the body
    edit  a snippet followed by the start of its edited copy (renamed, a parameter added,
          arguments reordered, a mirrored method...); the continuation mostly repeats the
          snippet, so drafts are accepted often
    doc   a docstring or comment to write: the prompt ends on an opening triple quote or a `#`

Each prompt ends on a non-blank character, so the continuation starts on a clean token boundary.
Every entry is `{"id", "category", "prompt", "note"}`; the note says what a good continuation does.
"""

from __future__ import annotations

import json
from pathlib import Path

CATEGORIES = ("code", "edit", "doc")

_PATH = Path(__file__).parent / "data" / "prompts.json"


def load_prompts(category: str | None = None) -> list[dict]:
    """The prompt suite in file order, or only the prompts of one `category`."""
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")
    prompts = json.loads(_PATH.read_text(encoding="utf-8"))
    seen = set()
    for p in prompts:
        if p.get("id") in seen:
            raise ValueError(f"{_PATH.name}: duplicate id {p.get('id')!r}")
        seen.add(p.get("id"))
        if p.get("category") not in CATEGORIES:
            raise ValueError(f"{_PATH.name}: {p.get('id')!r} has unknown category {p.get('category')!r}")
        for key in ("id", "prompt", "note"):
            if not isinstance(p.get(key), str) or not p[key].strip():
                raise ValueError(f"{_PATH.name}: {p.get('id')!r} has an empty or missing {key!r}")
    return [p for p in prompts if category is None or p["category"] == category]
