"""Chat data made on this machine (`specdec_lab.chat`): the prompts heads train on, and the held-out ones."""
import re

import torch

from specdec_lab import chat


def test_training_prompts_are_fixed_cover_every_category_and_leave_the_held_out_ones_out():
    prompts = chat.training_prompts()
    assert len(prompts) == 2561 and prompts == chat.training_prompts()  # the same list on every call
    assert {p["category"] for p in chat.training_prompts(40)} == set(chat.CATEGORIES)  # every category early
    assert len({p["id"] for p in prompts}) == len(prompts)
    held = chat.held_out()
    assert len(held) == 24 and all(len(chat.held_out(c)) == 8 for c in chat.CATEGORIES)
    texts = {p["prompt"] for p in prompts}
    assert not any(h["prompt"] in texts for h in held)
    # the everyday lists (written beside the held-out prompts) avoid every subject a held-out prompt uses
    subjects = ["sea", "ocean", "cat", "dog", "pet", "tea", "sky", "bakery", "hiking", "robot", "paint", "france",
                "paris", "fibonacci", "palindrome", "csv", "bank", "tuple", "merges", "committee", "library", "picnic",
                "banana", "apples", "photosynthesis", "exercise", "station", "report"]
    everyday = [chat.SUBJECTS, chat.ACTIVITIES, chat.PAIRS, chat.CHARACTERS, chat.BUSINESSES, chat.THINGS[4:],
                chat.TASKS, chat.CONCEPTS, chat.CLASSES, chat.SENTENCES, chat.PASSAGES, chat.TOPICS, chat.HOWTOS,
                chat.WORRIES, chat.CHOICES, chat.MOTIFS, chat.HEROES, chat.LISTS, chat.WRITINGS, chat.PLACES,
                chat.TASKS_MORE, chat.PY_HOWTOS, chat.SENTENCES_MORE, chat.PASSAGES_MORE]
    words = {w for items in everyday for item in items for part in (item if isinstance(item, tuple) else [item])
             for w in re.findall(r"[a-z]+", part.lower())}
    assert words.isdisjoint(subjects), sorted(words & set(subjects))


def test_plain_prompts_are_text_to_continue_on_subjects_no_training_prompt_uses():
    """Chapter 11's τ beyond the template: 8 openings of plain text (stories, articles, code, documents), written for
    the course, outside the template and on subjects that no training prompt names."""
    plain = chat.plain_held_out()
    assert len(plain) == 8 and {p["category"] for p in plain} == {"plain"} and len({p["id"] for p in plain}) == 8
    assert not any("<|im_start|>" in p["prompt"] for p in plain)
    trained = " ".join(p["prompt"].lower() for p in chat.training_prompts())
    subjects = ["ferry", "quay", "orchard", "telescope", "fungus", "yeast", "thermostat", "scanner", "roof", "tenants"]
    assert all(any(w in p["prompt"].lower() for w in subjects) for p in plain), "each opening has its own subject"
    assert not [w for w in subjects if re.search(rf"\b{w}\b", trained)], "a subject some training prompt names"

    class Tok:  # the one call `plain_ids` makes of a tokenizer: the text as it is, no template, no special tokens
        def __call__(self, text, return_tensors, add_special_tokens):
            assert return_tensors == "pt" and add_special_tokens is False
            return type("Enc", (), {"input_ids": torch.tensor([[len(text)]])})

    assert chat.plain_ids(Tok(), plain[0]["prompt"]).tolist() == [[len(plain[0]["prompt"])]]


def test_a_conversation_is_the_template_around_prompt_and_answer():
    class Tok:  # the one call `conversations` makes of a tokenizer
        def apply_chat_template(self, messages, tokenize=False):
            return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)

    rows = [{"prompt": "Say hi.", "answer": "Hi!"}]
    assert chat.conversations(Tok(), rows) == ["<user>Say hi.</user><assistant>Hi!</assistant>"]


def test_shipped_answers_start_the_cache_only_for_the_weights_that_wrote_them(tmp_path, monkeypatch):
    import gzip
    import json

    from helpers import tiny_llama

    from specdec_lab import weights

    model, other = tiny_llama(layers=1, seed=0), tiny_llama(layers=1, seed=1)
    rows = [{"id": "chat-0", "category": "chat", "prompt": "Say hi.", "answer": "Hi!"}]
    monkeypatch.setattr(chat, "SHIPPED", tmp_path / "shipped")
    chat.SHIPPED.mkdir()
    (chat.SHIPPED / "m.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    made_by = {**weights.fingerprint(model), "target": "models/m"}  # the same weights, read from another folder
    (chat.SHIPPED / "m.json").write_text(json.dumps(made_by))
    assert not chat.shipped_answers(other, "m", tmp_path / "other.jsonl"), "other weights answer for themselves"
    assert not (tmp_path / "other.jsonl").exists()
    assert chat.shipped_answers(model, "m", tmp_path / "mine.jsonl")
    assert [json.loads(line) for line in (tmp_path / "mine.jsonl").read_text().splitlines()] == rows
    assert not chat.shipped_answers(model, "m", tmp_path / "mine.jsonl"), "a cache that exists is never overwritten"
    again = [{**rows[0], "answer": "Hello there!"}]  # the sampled answers: their own file, the same fingerprint
    (chat.SHIPPED / "m-sampled.jsonl.gz").write_bytes(gzip.compress((json.dumps(again[0]) + "\n").encode()))
    assert chat.shipped_answers(model, "m", tmp_path / "sampled.jsonl", sampled=True)
    assert [json.loads(line) for line in (tmp_path / "sampled.jsonl").read_text().splitlines()] == again


def test_the_answers_shipped_cover_the_training_prompts():
    import gzip
    import json

    files = sorted(chat.SHIPPED.glob("*.jsonl.gz"))
    assert len(files) == 2, "the package ships the target's greedy and sampled answers for the real model"
    ids = {p["id"]: p["prompt"] for p in chat.training_prompts()}
    for file in files:
        rows = [json.loads(line) for line in gzip.decompress(file.read_bytes()).decode().splitlines()]
        assert {r["id"]: r["prompt"] for r in rows} == ids, f"{file.name}: regenerate it for the current prompts"
        assert all(r["answer"].strip() for r in rows)
        name = file.name.replace("-sampled", "").replace(".jsonl.gz", ".json")
        assert json.loads(file.with_name(name).read_text())["target"]
    greedy, sampled = ({r["id"]: r["answer"] for r in map(json.loads, gzip.decompress(f.read_bytes()).splitlines())}
                       for f in sorted(files, key=lambda f: "-sampled" in f.name))
    assert sum(sampled[i] != greedy[i] for i in sampled) > 0.9 * len(sampled), "sampling wrote other answers"


def test_calibration_prompts_are_neither_trained_on_nor_scored():
    """Chapter 11's tuner calibrates on chat.CALIBRATION: no draft trained on them, no method is scored on them."""
    from specdec_lab import chat

    trained = {p["prompt"].lower() for p in chat.training_prompts()}
    scored = {p["prompt"].lower() for p in chat.held_out()}
    assert chat.CALIBRATION and {p["category"] for p in chat.CALIBRATION} == set(chat.CATEGORIES)
    assert not {p["prompt"].lower() for p in chat.CALIBRATION} & (trained | scored)
