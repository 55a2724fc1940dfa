"""The held-out prompt suite: shape, counts, and that no prompt was lifted from the training corpus."""

from collections import Counter

import pytest

from specdec_lab.prompts import CATEGORIES, load_prompts

MINIMUMS = {"code": 16, "edit": 14, "doc": 12}
MAX_CHARS = 1000  # ~250 tokens of the zoo tokenizer at its worst; the suite stays well under
HELD_OUT_MIN_LINE = 40  # a stripped prompt line this long must not occur in the corpus

# What a short continuation may need to close an unfinished prompt: the docstring or comment
# it opened, the bracket of a literal or call, then a body at some indentation (the function a
# decorator wraps, the clause a `try:` needs).
_CLOSERS = ("", ' x"""', '"""', " x", ")", "]", "}")
_INDENTS = [" " * n for n in range(0, 20, 4)]
_BODIES = ("",) + tuple(f"\n{i}pass" for i in _INDENTS) + tuple(f"\n{i}def _(): pass" for i in _INDENTS) \
    + tuple(f"\n{i}    pass\n{i}finally: pass" for i in _INDENTS)


def test_counts_per_category():
    counts = Counter(p["category"] for p in load_prompts())
    for category, minimum in MINIMUMS.items():
        assert counts[category] >= minimum, (category, counts[category])
    assert sum(counts.values()) >= 40
    assert set(counts) == set(CATEGORIES)


def test_ids_are_unique_and_name_their_category():
    prompts = load_prompts()
    ids = [p["id"] for p in prompts]
    assert len(ids) == len(set(ids))
    for p in prompts:
        assert p["id"].startswith(p["category"] + "-"), p["id"]
        assert set(p) == {"id", "category", "prompt", "note"}, p["id"]


def test_filter_by_category():
    for category in CATEGORIES:
        selected = load_prompts(category)
        assert selected and all(p["category"] == category for p in selected)
    assert sum(len(load_prompts(c)) for c in CATEGORIES) == len(load_prompts())
    with pytest.raises(ValueError):
        load_prompts("prose")


def test_prompts_end_where_a_continuation_is_natural():
    for p in load_prompts():
        prompt = p["prompt"]
        assert isinstance(prompt, str) and prompt.strip(), p["id"]
        # No trailing space, newline or blank line: the continuation starts on a clean token
        # boundary (a newline and indentation, or the text after an opening quote or '#').
        assert prompt == prompt.rstrip(), p["id"]
        assert prompt == prompt.lstrip("\n"), p["id"]
        assert "\t" not in prompt, p["id"]
        assert len(prompt) <= MAX_CHARS, (p["id"], len(prompt))
        assert "\n" not in p["note"] and p["note"].strip(), p["id"]


@pytest.mark.parametrize("prompt", load_prompts(), ids=lambda p: p["id"])
def test_prompt_is_a_prefix_of_python(prompt):
    """The prompt itself need not compile, but a few closing characters must make it valid code."""
    text = prompt["prompt"]
    for closer in _CLOSERS:
        for body in _BODIES:
            try:
                compile(text + closer + body, prompt["id"], "exec", dont_inherit=True)
                return
            except SyntaxError:
                pass
    pytest.fail(f"{prompt['id']}: no short completion makes it valid Python")


def test_prompts_are_held_out_from_the_training_corpus():
    from specdec_lab.train_zoo import corpus_files

    train_files, val_files = corpus_files()
    assert train_files
    corpus_lines = set()
    for path in train_files + val_files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if len(line) >= HELD_OUT_MIN_LINE:
                corpus_lines.add(line)
    leaked = [(p["id"], line.strip()) for p in load_prompts() for line in p["prompt"].splitlines()
              if len(line.strip()) >= HELD_OUT_MIN_LINE and line.strip() in corpus_lines]
    assert not leaked, leaked
