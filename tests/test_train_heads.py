"""`specdec-lab train-heads` (issue 19, specdec_lab/train_heads.py): Medusa heads, EAGLE-1 and EAGLE-3 drafts for a
target that is not the zoo's.

A randomly initialised small Qwen2, saved to a folder as a learner's own model would be, stands for "any target".
Each method is trained for a few steps through the command line, saved, loaded back with `from_pretrained` and
used: greedy output identical to the target's own. The heads are refused for another target (other sizes, another
architecture, the same architecture with other weights), with a message that says how to train them. The time
budget stops a run and keeps its checkpoint; a rerun resumes it exactly. (The six architectures of the matrix run
the same heads in test_architectures.py.)
"""
import json
import re
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
from helpers import tiny_llama
from transformers import AutoModelForCausalLM, Qwen2Config

from specdec_lab import (DraftModelDrafter, EagleDrafter, MedusaDrafter, draft_models, eagle, generate, train_heads,
                         training, weights, zoo)
from specdec_lab.__main__ import main
from specdec_lab.eagle import BlockDrafter, BlockNet

VOCAB = 4096  # the zoo's tokenizer: a byte-level BPE, which AutoTokenizer loads back from the target's folder
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2)
TEXTS = ["textwrap.py", "string.py", "bisect.py", "heapq.py", "shlex.py", "fnmatch.py", "glob.py", "colorsys.py"]


def _save_target(folder, seed=0, **changes):
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**{**SMALL, **changes})).eval()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(zoo.EMBEDDED["tiny"] / "target").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(folder of the target, folder of text files: 8 modules of the standard library)."""
    root = tmp_path_factory.mktemp("heads")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    (root / "text").mkdir()
    for name in TEXTS:
        shutil.copy(stdlib / name, root / "text" / name)
    return _save_target(root / "qwen2"), root / "text"


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):
    """{method: output folder} after `specdec-lab train-heads` with each method on the random Qwen2."""
    target, text = setup
    out = {}
    for method in train_heads.METHODS:
        out[method] = tmp_path_factory.mktemp(method)
        argv = ["train-heads", "--target", str(target), "--method", method, "--steps", "4", "--windows", "8",
                "--data", str(text), "--out", str(out[method]), "--threads", "1"]
        assert main(argv) == 0
    return out


def _load(folder):
    target, _ = zoo._load_one(str(folder), "cpu", torch.float32)
    return target


@pytest.mark.parametrize("method", train_heads.METHODS)
def test_trained_heads_are_saved_with_what_identifies_their_target(setup, trained, method):
    target = _load(setup[0])
    files = sorted(p.name for p in trained[method].iterdir())
    assert files == sorted(["config.json", weights.FILES[method]]), f"{method}: {files} (a finished run leaves no checkpoint)"
    card = json.loads((trained[method] / "config.json").read_text())
    assert card["finished"] and card["method"] == method and card["config"]["steps"] == 4
    mine = weights.fingerprint(target)
    assert {k: card[k] for k in mine} == mine, "the card must record the target's name, hash, sizes and probe"
    assert card["target"].endswith("qwen2")
    assert len(card["val_accuracy_vs_target"]) == (4 if method == "medusa" else 3)
    if method == "medusa":
        assert card["own_lm_heads"], "Medusa as published: each head its own LM head"


@pytest.mark.parametrize("drafter", ["medusa", "eagle1", "eagle2", "eagle3", "block", "draft"])
def test_loaded_back_they_keep_greedy_identity(setup, trained, drafter):
    target = _load(setup[0])
    if drafter == "block":
        make = lambda: BlockDrafter(BlockNet.from_pretrained(target, trained["block"]), gamma=4)  # noqa: E731
    elif drafter == "draft":
        make = lambda: DraftModelDrafter(draft_models.load_distilled(target, trained["draft"]), gamma=3)  # noqa: E731
    elif drafter == "medusa":
        make = lambda: MedusaDrafter.from_pretrained(target, trained["medusa"])  # noqa: E731
    else:
        folder = trained["eagle3" if drafter == "eagle3" else "eagle1"]
        make = lambda: EagleDrafter.from_pretrained(target, folder, dynamic=drafter == "eagle2")  # noqa: E731
    g = torch.Generator().manual_seed(3)
    for i in range(3):
        ids = torch.randint(0, VOCAB, (1, 12), generator=g)
        want = generate(target, ids, None, max_new_tokens=30).tokens
        assert generate(target, ids, make(), max_new_tokens=30).tokens == want, f"{drafter}, prompt {i}"


@pytest.mark.parametrize("method", train_heads.METHODS)
def test_refused_for_another_target(setup, trained, tmp_path, method):
    load = {"medusa": lambda t: MedusaDrafter.from_pretrained(t, trained[method]),
            "block": lambda t: BlockNet.from_pretrained(t, trained[method]),
            "draft": lambda t: draft_models.load_distilled(t, trained[method])}.get(
        method, lambda t: EagleDrafter.from_pretrained(t, trained[method]))
    others = {"other weights": _save_target(tmp_path / "reinit", seed=1),
              "architecture": _save_target(tmp_path / "deeper", num_hidden_layers=3),
              "hidden": _save_target(tmp_path / "wider", hidden_size=48, num_attention_heads=4)}
    for words, folder in others.items():
        with pytest.raises(ValueError, match=words) as error:
            load(_load(folder))
        message = str(error.value)
        assert f"specdec-lab train-heads --target <your target> --method {method}" in message, message
    load(_load(setup[0]))  # and accepted for its own


def test_a_block_drafter_starts_from_the_targets_eagle1_draft(setup, trained, monkeypatch):
    """--init eagle1: the block drafter's layer and fc start as the trained EAGLE-1 draft's, its placeholders fresh;
    with no EAGLE-1 draft for the target the run is refused with the command that trains one."""
    target = _load(setup[0])
    eagle1 = EagleDrafter.from_pretrained(target, trained["eagle1"]).net
    monkeypatch.setattr(train_heads, "find", lambda t: {"eagle1": trained["eagle1"]})
    with pytest.raises(ValueError, match=r"does not fit this one: layer.gate.weight \[64, 32\] \(here \[16, 32\]\)"):
        train_heads._start_from(BlockNet(target, eagle1.num_heads, 16), target, "eagle1")
    net = BlockNet(target, eagle1.num_heads, eagle1.mlp)
    fresh = net.placeholder.detach().clone()
    train_heads._start_from(net, target, "eagle1")
    for name, value in eagle1.state_dict().items():
        if name != "d2t":
            torch.testing.assert_close(net.state_dict()[name], value, msg=f"{name} must start as EAGLE-1's")
    torch.testing.assert_close(net.placeholder.detach(), fresh)
    monkeypatch.setattr(train_heads, "find", lambda t: {})
    with pytest.raises(ValueError, match="init='eagle1': .*--method eagle1"):
        train_heads._start_from(net, target, "eagle1")


def test_missing_heads_say_how_to_train_them(setup, tmp_path):
    target = _load(setup[0])
    with pytest.raises(FileNotFoundError, match="specdec-lab train-heads --target <your target> --method medusa"):
        MedusaDrafter.from_pretrained(target, tmp_path)
    with pytest.raises(FileNotFoundError, match="--method eagle1"):
        EagleDrafter.from_pretrained(target, tmp_path)


def test_the_budget_stops_a_run_and_a_rerun_resumes_it(setup, tmp_path):
    """--minutes: past the deadline the run stops, keeps its checkpoint and says so in its card; the same call
    again goes on from the checkpoint and finishes, with the weights of a run never stopped."""
    target, text = _load(setup[0]), setup[1]
    tok = zoo._load_one(str(setup[0]), "cpu", torch.float32)[1]
    kw = dict(data=text, steps=6, windows=8, seq_len=64, progress=False)
    card = train_heads.train(target, tok, "eagle1", tmp_path / "cut", minutes=1e-6, **kw)  # the deadline has passed
    assert not card["finished"] and (tmp_path / "cut" / "checkpoint.pt").exists()
    planned = card["config"]["steps"]  # sized to the budget from a timed step: here the least, 1
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)["step"] < planned
    card = train_heads.train(target, tok, "eagle1", tmp_path / "cut", **kw)
    assert card["finished"] and not (tmp_path / "cut" / "checkpoint.pt").exists()
    train_heads.train(target, tok, "eagle1", tmp_path / "whole", **{**kw, "steps": planned})
    from safetensors.torch import load_file

    cut, whole = (load_file(tmp_path / f / "eagle.safetensors") for f in ("cut", "whole"))
    assert all(torch.equal(cut[k], whole[k]) for k in whole), "the resumed run must end where an unbroken one does"


def test_ctrl_c_keeps_the_run_and_a_rerun_redoes_the_step_it_cut(tmp_path):
    """training.fit's checkpoint: interrupted inside step 3, then resumed, it ends with the weights of an
    uninterrupted run, bit for bit (the generator is saved as it was before the step that was cut)."""
    def run(checkpoint, interrupt_at=None):
        torch.manual_seed(0)
        module = torch.nn.Linear(4, 2)
        x, calls = torch.randn(32, 4), []

        def loss_fn(idx, g):
            calls.append(1)
            if len(calls) == interrupt_at:
                raise KeyboardInterrupt
            loss = (module(x[idx]) + 0.01 * torch.randn(2, generator=g)).pow(2).mean()
            return loss, [loss.item()]
        training.fit(module, loss_fn, 32, training.Recipe(steps=6, batch=4, lr=1e-2), progress=False,
                     precision="fp32", checkpoint=checkpoint)
        return module

    whole = run(None)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "ck.pt", interrupt_at=3)
    assert torch.load(tmp_path / "ck.pt", weights_only=False)["step"] == 2
    resumed = run(tmp_path / "ck.pt")
    assert not (tmp_path / "ck.pt").exists()
    assert torch.equal(resumed.weight, whole.weight) and torch.equal(resumed.bias, whole.bias)


@pytest.mark.parametrize("method", ["medusa", "eagle3"])
def test_the_zoo_trains_by_the_same_recipe_table(method, monkeypatch, tmp_path):
    """train-zoo's heads and drafts (train_zoo.train_method) run this front-end by RECIPES: a change to the table
    reaches the zoo's run, which differs from it only in its drafts' MLP width (and, on a small vocabulary, in
    having no draft vocabulary)."""
    from dataclasses import replace

    from specdec_lab import train_zoo

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    changed = replace(train_heads.RECIPES[method], lr=0.0123, batch=3, windows=4, seq_len=16)
    monkeypatch.setitem(train_heads.RECIPES, method, changed)
    drawn = {}

    def windows(tok, n, seq_len, n_val, seed):  # the zoo's windows, tiny: [n, T] training, [2, T] validation
        drawn.update(n=n, seq_len=seq_len)
        return torch.randint(0, VOCAB, (n, seq_len)), torch.randint(0, VOCAB, (2, seq_len))

    class Fitted(Exception):
        pass

    def fit(module, loss_fn, n_examples, recipe, *args, **kwargs):
        raise Fitted(recipe)
    monkeypatch.setattr(train_zoo, "zoo_windows", windows)
    monkeypatch.setattr(training, "fit", fit)
    with pytest.raises(Fitted) as fitted:
        train_zoo.train_method(tmp_path, method)
    assert drawn == {"n": 4, "seq_len": 16}, "the zoo draws the recipe's windows"
    assert fitted.value.args[0] == replace(changed, draft_vocab=None, mlp=None if method == "medusa" else 512)


def test_default_output_is_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = train_heads.default_folder("HuggingFaceTB/SmolLM2-1.7B", "eagle1")
    assert folder == tmp_path / "specdec-lab" / "heads" / "HuggingFaceTB--SmolLM2-1.7B" / "eagle1"


def _fail(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, words", [
    (["--method", "eagle2"], ["--method", "invalid choice: 'eagle2'", "'medusa', 'eagle1', 'eagle3', 'block', 'draft'"]),
    (["--method", "medusa", "--minutes", "0"], ["--minutes", "'0' is not a positive number of minutes"]),
    (["--method", "medusa", "--minutes", "five"], ["--minutes", "'five' is not a number"]),
    (["--method", "medusa", "--data", "/no/such/folder"], ["--data", "is not a folder"]),
    (["--method", "eagle1", "--lm-head", "shared"], ["--lm-head belongs to --method medusa"]),
    (["--method", "eagle1", "--init", "eagle1"], ["--init eagle1 belongs to --method block"]),
    (["--method", "eagle1", "--layers", "4"], ["--layers belongs to --method draft"]),
    (["--method", "draft", "--layers", "0"], ["--layers", "'0'", "1 or more"]),
    (["--method", "medusa", "--steps", "0"], ["--steps", "'0'", "1 or more"]),
    (["--method", "medusa", "--device", "gpu0"], ["--device", "'gpu0' is not a device"]),
])
def test_flags_are_checked_before_the_target_loads(argv, words, monkeypatch, capsys):
    def load(*args, **kwargs):
        raise AssertionError("the target was loaded before the flags were checked")
    monkeypatch.setattr(zoo, "_load_one", load)
    message = _fail(["train-heads", "--target", "tiny", *argv], capsys)
    for word in words:
        assert word in message, message


def test_a_draft_model_deeper_than_half_the_target_is_refused(setup, tmp_path, capsys):
    """--layers: a draft model of more than half the target's layers would cost more than half a step a token."""
    argv = ["train-heads", "--target", str(setup[0]), "--method", "draft", "--layers", "2", "--steps", "1",
            "--windows", "8", "--data", str(setup[1]), "--out", str(tmp_path), "--threads", "1"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "a draft model of 2 layers" in error and "this target has 2 layers, give at most 1" in error, error
    assert not (tmp_path / "draft.safetensors").exists()


def test_a_target_that_cannot_load_gets_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["train-heads", "--target", "someone/not-on-this-machine", "--method", "medusa"]) == 2
    assert "--target someone/not-on-this-machine: cannot load" in capsys.readouterr().err
    assert main(["train-heads", "--target", str(tmp_path), "--method", "medusa"]) == 2  # a folder, no model
    assert f"--target {tmp_path}:" in capsys.readouterr().err


def test_tuned_tree_is_the_best_tree_of_its_size():
    """tune.medusa_choices against every tree of 4 nodes (prefix-closed sets of paths) over 2 heads and 3 ranks."""
    from itertools import combinations

    from specdec_lab.tune import medusa_choices

    topk = {1: [0.6, 0.3], 2: [0.75, 0.45], 3: [0.8, 0.5]}
    p = [[0.6, 0.15, 0.05], [0.3, 0.15, 0.05]]  # rank probabilities: differences of the top-k accuracies
    paths = [(r,) for r in range(3)] + [(r, s) for r in range(3) for s in range(3)]

    def value(tree):
        return sum(p[0][c[0]] * (p[1][c[1]] if len(c) > 1 else 1.0) for c in tree)
    trees = [t for t in combinations(paths, 4) if all(len(c) == 1 or c[:1] in t for c in t)]
    best = max(value(t) for t in trees)
    choices, expected = medusa_choices(topk, nodes=4)
    assert len(choices) == 4 and all(len(c) == 1 or c[:1] in choices for c in choices)
    assert expected == pytest.approx(value(choices)) == pytest.approx(best)
    assert choices == [(0,), (1,), (0, 0), (0, 1)]


def test_medusa_drafter_uses_the_tree_saved_with_its_heads(setup, trained):
    card = json.loads((trained["medusa"] / "config.json").read_text())
    drafter = MedusaDrafter.from_pretrained(_load(setup[0]), trained["medusa"])
    assert drafter.choices == [tuple(c) for c in card["choices"]] and len(card["choices"]) == 24
    assert card["expected_accepted"] > 0


def test_chat_data_needs_a_chat_model(capsys):
    assert main(["train-heads", "--target", "tiny", "--method", "eagle1", "--data", "chat"]) == 2
    assert "no chat template, so the target is not a chat model" in capsys.readouterr().err


def test_kept_states_are_reused_and_capped(setup, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = AutoModelForCausalLM.from_pretrained(setup[0]).eval()
    windows = [torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    first, best = train_heads.stored_states(target, windows[0], progress=False)
    folder = tmp_path / "specdec-lab" / "states"
    (size,) = {f.stat().st_size for f in folder.glob("*.pt")}
    monkeypatch.setattr(training, "cache_states", lambda *a: pytest.fail("kept states were computed again"))
    again, best_again = train_heads.stored_states(target, windows[0], progress=False)
    assert torch.equal(again, first) and torch.equal(best_again, best)
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(train_heads, "STATES_BYTES", 2.5 * size)  # room for two files of this size
    for w in windows[1:]:
        train_heads.stored_states(target, w, progress=False)
    assert len(list(folder.glob("*.pt"))) == 2
    def computed(*args):
        raise LookupError("not kept")

    monkeypatch.setattr(training, "cache_states", computed)
    train_heads.stored_states(target, windows[2], progress=False)  # the newest is kept
    with pytest.raises(LookupError):  # the least recently used went first
        train_heads.stored_states(target, windows[0], progress=False)


def test_training_windows_tile_the_text_without_overlap():
    """n windows read n * T different tokens while the text holds that many; past that, the rest start anywhere."""
    class Numbering:  # a tokenizer that gives every character of every text its own id: a repeat is an overlap
        eos_token_id, seen = None, 0

        def __call__(self, texts, add_special_tokens=False, verbose=False):
            out = []
            for t in texts:
                out.append(list(range(self.seen, self.seen + len(t))))
                self.seen += len(t)
            return {"input_ids": out}

    texts = [f"request {i}: " + "x" * (40 + i % 50) for i in range(600)]  # 19 in 20 train: about 38,000 tokens
    tiles = (sum(len(t) for i, t in enumerate(texts) if i % 20 != 7) - 1) // 32  # text_windows keeps texts[7::20]
    train, _ = train_heads.text_windows(Numbering(), texts, tiles, 32)
    assert train.shape == (tiles, 32) and train.unique().numel() == train.numel(), "windows overlap"
    more, _ = train_heads.text_windows(Numbering(), texts, tiles + 100, 32)
    assert more.shape == (tiles + 100, 32) and more.unique().numel() < more.numel(), "past the tiles, text repeats"


class ChatMarks:
    """A ChatML-like tokenizer for tests: "<s>" and "<e>" are one token each (1 and 2), every other character its
    code point; a conversation is "<s>role\\ncontent<e>\\n" per message."""
    eos_token_id, chat_template = 2, "chatml"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<s>{m['role']}\n{m['content']}<e>\n" for m in messages)
        return text + ("<s>assistant\n" if add_generation_prompt else "")

    def encode(self, text):
        parts = re.split(r"(<s>|<e>)", text)
        return [t for p in parts if p for t in ([1] if p == "<s>" else [2] if p == "<e>" else map(ord, p))]

    def __call__(self, texts, add_special_tokens=False, verbose=False):
        return {"input_ids": self.encode(texts) if isinstance(texts, str) else [self.encode(t) for t in texts]}


def test_chat_training_scores_only_the_positions_whose_next_token_is_the_assistants():
    from specdec_lab import chat

    tok = ChatMarks()
    rows = [{"prompt": f"question {i}?", "answer": f"answer {i}" + "!" * (i % 7)} for i in range(400)]
    texts = chat.conversations(tok, rows)
    ids = torch.tensor(tok(texts[0])["input_ids"])
    inside = chat.answer_mask(tok, ids)
    assert "".join(chr(t) for t in ids[inside].tolist() if t > 2) == "answer 0" and ids[inside][-1] == 2, \
        "the answer and its end-of-turn token, nothing of the system, the user or the header"
    train, val, scored, v_scored = train_heads.text_windows(tok, texts, 50, 32, answers=True)
    assert scored.shape == train.shape and v_scored.shape == val.shape
    for x, s in ((train, scored), (val, v_scored)):  # scored[t]: token t + 1 is the assistant's
        nxt, rest = x[:, 1:][s[:, :-1]].tolist(), x[:, 1:][~s[:, :-1]].tolist()
        assert {chr(t) for t in nxt if t > 2} <= set("answer 0123456789!") and 2 in nxt and 1 not in nxt
        assert ord("?") in rest and ord("q") in rest and 1 in rest, "the question and the header are not scored"
        assert s.float().mean() < 0.6, "the question and the header are not scored"
    with pytest.raises(ValueError, match="chat template"):
        class Flat(ChatMarks):
            def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
                return " ".join(m["content"] for m in messages)
        chat.answer_mask(Flat(), ids)


def test_a_mixture_shares_the_windows_by_tokens_and_scores_plain_text_everywhere():
    from specdec_lab import chat

    tok = ChatMarks()
    rows = [{"prompt": f"question {i}?", "answer": f"answer {i}" + "!" * (i % 7)} for i in range(400)]
    texts = {"chat": chat.conversations(tok, rows),
             "chat-untemplated": [f"{r['prompt']}\n\n{r['answer']}" for r in rows]}
    tokens = [len(train_heads.token_stream(t, tok)) for t in texts.values()]
    (x, val, scored, v_scored), (u, u_val, none, v_none) = train_heads.shared_windows(tok, texts, 60, 32)
    assert len(x) + len(u) == 60 and abs(len(x) / 60 - tokens[0] / sum(tokens)) < 0.02, "shared by tokens"
    assert tokens[0] > tokens[1], "the template's own tokens make its text the longer"
    assert scored.shape == x.shape and v_scored.shape == val.shape and 0 < scored.float().mean() < 0.6
    assert none is None and v_none is None, "plain text: every position scored"
    assert not (u == 1).any() and (x == 1).any(), "no template in the plain text"
    (alone, *_), = train_heads.shared_windows(tok, {"chat": texts["chat"]}, 60, 32)
    assert torch.equal(alone, train_heads.text_windows(tok, texts["chat"], 60, 32)[0]), "one text: as before"


def test_more_answers_per_prompt_are_further_sampled_draws_each_in_a_file_of_its_own(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from specdec_lab import chat, zoo

    calls = []

    def self_answers(target, tok, prompts, file, progress=True, temperature=None, draw=1):
        calls.append((Path(file).name, temperature, draw))
        return [{**p, "answer": f"{Path(file).stem} to {p['id']}"} for p in prompts[:3]]

    monkeypatch.setattr(chat, "self_answers", self_answers)
    monkeypatch.setattr(chat, "shipped_answers", lambda *args, **kwargs: False)
    monkeypatch.setattr(zoo, "user_cache", lambda: tmp_path)
    target = SimpleNamespace(config=SimpleNamespace(name_or_path="some/chat-model"))
    texts = train_heads.chat_texts(target, ChatMarks(), "chat", progress=False, answers=3)
    assert calls == [("chat_answers.jsonl", None, 1), ("chat_answers_sampled.jsonl", chat.TEMPERATURE, 1),
                     ("chat_answers_sampled2.jsonl", chat.TEMPERATURE, 2)], "draw 1 is the shipped samples' file"
    assert len(texts) == 3 and all(t.count("<s>assistant") == 3 for t in texts), "a prompt's answers in one text"
    assert "chat_answers_sampled2 to" in texts[0]
    calls.clear()
    plain = train_heads.chat_texts(target, ChatMarks(), "chat-untemplated", progress=False, answers=3)
    assert [c[0] for c in calls] == ["chat_answers.jsonl"] and "<s>" not in plain[0], "plain: the greedy answers"
    with pytest.raises(ValueError, match="answers=0"):
        train_heads.chat_texts(target, ChatMarks(), "chat", progress=False, answers=0)


def test_unscored_labels_stay_unscored_in_the_draft_vocabulary_and_in_accuracy():
    from specdec_lab import vocab

    d2t = torch.tensor([3, 5, 7])
    assert vocab.to_draft(torch.tensor([5, -100, 4, 7]), d2t, 10).tolist() == [1, -100, -100, 2]
    target = tiny_llama(layers=1)
    net = eagle.EagleNet(target, 1, heads=2, mlp=32)
    x = torch.randint(0, target.config.vocab_size, (2, 12))
    states, best = training.cache_states(target, x)
    full = training.eagle_accuracy(net, states.float(), x, best, depth=1)[0]
    half = best.clone()
    half[:, ::2] = -100
    some = training.eagle_accuracy(net, states.float(), x, half, depth=1)[0]
    hits = (net.logits(net(states[:, :-1, -1].float(), x[:, 1:], torch.arange(11))).argmax(-1) == best[:, 1:])
    assert full == pytest.approx(hits.float().mean().item())
    assert some == pytest.approx(hits[:, 1::2].float().mean().item()), "only the scored positions count"
