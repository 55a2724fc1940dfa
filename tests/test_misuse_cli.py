"""Misuse of the command line and of zoo.load_pair: each gets a one-line answer that names the problem, before
any model loads; train-zoo writes into the package only with --install; Ctrl-C keeps a benchmark's results."""
import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_lab import bench, lineup, report, train_zoo, zoo
from specdec_lab.__main__ import main

SHIPPED = zoo.EMBEDDED["tiny"]


def _fail(argv, capsys) -> str:
    """Run the command, expect argparse's exit (code 2); return its one-line message."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in message, message
    return message


@pytest.fixture
def no_loading(monkeypatch):
    """A check that comes after a model loads fails the test: flags are checked first."""
    def load_pair(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")
    monkeypatch.setattr(zoo, "load_pair", load_pair)


# ---- specdec-lab bench: every flag checked before a model loads ---------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["--temperatures", "0,-1"], ["--temperatures", "-1", ">= 0"]),
    (["--temperatures", "abc"], ["--temperatures", "'abc' is not a number", "e.g. 0,0.7"]),
    (["--dtype", "int8"], ["--dtype", "'int8' is not a dtype", "float32, bfloat16, float16"]),
    (["--temperatures", "0,1e-45"], ["--temperatures", "1e-45", "temperature=0 for greedy"]),
    (["--temperatures", "0,0.7,0"], ["--temperatures", "0 appears twice"]),
    (["--limit", "0"], ["--limit", "'0'", "1 or more"]),
    (["--max-new-tokens", "0"], ["--max-new-tokens", "'0'", "1 or more"]),
    (["--threads", "0"], ["--threads", "'0'", "1 or more"]),
    (["--gamma", "two"], ["--gamma", "'two' is not a whole number"]),
    (["--device", "gpu0"], ["--device", "'gpu0' is not a device", "use cpu"]),
    (["--pair", "tinyy"], ["--pair", "unknown pair 'tinyy'", "smollm2"]),
    (["--method", "draft", "--json", "r.json"], ["--json", "--method all"]),
    (["--method", "draft", "--temperatures", "0.7"], ["--temperatures", "--method all"]),
    (["--naive"], ["--naive", "--method draft"]),
    (["--batch", "0"], ["--batch", "'0'", "1 or more"]),
    (["--batch", "4", "--method", "draft"], ["--batch", "leave out --method"]),
    (["--auto", "--method", "draft"], ["--auto", "the showdown"]),
    (["--auto", "--batch", "4"], ["--auto", "no --batch"]),
    (["--json", "r.json", "--csv", "./r.json"], ["--json and --csv", "different files"]),
])
def test_bench_flags_are_checked_first(argv, words, no_loading, capsys):
    message = _fail(["bench", *argv], capsys)
    for word in words:
        assert word in message, message


def test_bench_device_without_cuda(monkeypatch, no_loading, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = _fail(["bench", "--device", "cuda"], capsys)
    assert "--device: 'cuda' is not available here" in message and "use cpu" in message


def test_bench_output_paths(tmp_path, no_loading, capsys):
    assert "is a folder: give a file name in it" in _fail(["bench", "--json", str(tmp_path)], capsys)
    (tmp_path / "file").write_text("")
    message = _fail(["bench", "--csv", str(tmp_path / "file" / "r.csv")], capsys)
    assert "--csv" in message and "is a file, not a folder" in message
    message = _fail(["bench", "--pair", str(tmp_path)], capsys)
    assert "--pair" in message and "has no target/ and no draft/ folder" in message


def test_bench_output_folders_are_made(tmp_path):
    report.save_results([{"method": "m", "tau": 1.0}], {}, tmp_path / "a" / "r.json", tmp_path / "b" / "c" / "r.csv")
    assert (tmp_path / "a" / "r.json").exists() and (tmp_path / "b" / "c" / "r.csv").exists()


def test_run_keeps_the_prompts_every_method_finished():
    calls = []

    def method(ids):
        calls.append(1)
        if len(calls) == 6:  # warm-up 2, prompt 0: 2, prompt 1: 1 done, then Ctrl-C
            raise KeyboardInterrupt
        return [1, 2], 1
    prompts = [torch.zeros(1, 3, dtype=torch.long)] * 3
    with pytest.raises(KeyboardInterrupt) as stop:
        bench.run(torch.nn.Linear(1, 1), {"a": method, "b": method}, prompts, warmup=1)
    rows = stop.value.partial
    assert [(r.method, r.prompts, r.tokens, r.same) for r in rows] == [("a", 1, 2, 1), ("b", 1, 2, 1)]


def test_interrupted_bench_saves_partial_results(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the sampled run: the greedy results and the sampled run's first prompt are saved, marked."""
    real = lineup.showdown_methods

    def interrupted_at_second_prompt(*args, **kwargs):
        methods = real(*args, **kwargs)
        if args[3] > 0:  # the sampled run: Ctrl-C once every method has decoded prompt 0
            calls, plain = [], methods["target only"]

            def target_only(ids):
                calls.append(1)
                if len(calls) == 3:  # warm-up, prompt 0, prompt 1
                    raise KeyboardInterrupt
                return plain(ids)
            methods["target only"] = target_only
        return methods
    monkeypatch.setattr(lineup, "showdown_methods", interrupted_at_second_prompt)
    json_path, csv_path = tmp_path / "new" / "r.json", tmp_path / "other" / "r.csv"  # folders that do not exist
    code = main(["bench", "--limit", "2", "--max-new-tokens", "4", "--threads", "1", "--json", str(json_path),
                 "--csv", str(csv_path)])
    out = capsys.readouterr().out
    assert code == 130
    assert "interrupted: measured T=0: 2 of 2 prompts, T=0.7: 1 of 2 prompts; saved them, marked partial" in out
    data = json.loads(json_path.read_text())
    assert data["meta"]["partial"] == "interrupted after T=0: 2 of 2 prompts, T=0.7: 1 of 2 prompts"
    every = {(r["temperature"], r["method"]): r for r in data["results"] if r["category"] == "all"}
    assert every[0.0, "target only"]["prompts"] == 2 and every[0.7, "target only"]["prompts"] == 1
    assert every[0.0, "lookahead (4, 4, 4)"]["identical"] == 2
    assert all(r["partial"] for r in data["results"])
    assert csv_path.read_text().splitlines()[0].endswith(",partial")


# ---- specdec-lab train-zoo: never into the package unless --install ------------------------------------

def _snapshot(folder: Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def shipped_untouched():
    before = _snapshot(SHIPPED)
    yield
    assert _snapshot(SHIPPED) == before, "a train-zoo test wrote into the shipped zoo"


@pytest.fixture
def fake_heads(monkeypatch):
    """A train_method that only records where it reads and writes (training takes minutes)."""
    calls = []

    def train_method(out_dir, method, zoo_dir=train_zoo.ZOO_DIR, steps=None):
        calls.append((method, Path(out_dir), Path(zoo_dir)))
        if method == "medusa":
            (Path(out_dir) / "medusa").mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / "medusa" / "heads.safetensors").write_text("new")
    monkeypatch.setattr(train_zoo, "train_method", train_method)
    return calls


@pytest.mark.parametrize("stage", ["medusa", "eagle"])
def test_head_stages_write_to_the_user_cache(stage, tmp_path, monkeypatch, fake_heads, shipped_untouched, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["train-zoo", "--stage", stage]) == 0
    out = tmp_path / "cache" / "specdec-lab" / "zoo" / "tiny"
    assert fake_heads and all(o == out and z == train_zoo.ZOO_DIR for _, o, z in fake_heads), fake_heads
    assert f"writing to {out}" in capsys.readouterr().out


def test_install_backs_up_what_it_replaces(tmp_path, monkeypatch, fake_heads, shipped_untouched, capsys):
    fake_zoo = tmp_path / "package" / "tiny"  # stands in for the package's data folder
    (fake_zoo / "medusa").mkdir(parents=True)
    (fake_zoo / "medusa" / "heads.safetensors").write_text("old")
    monkeypatch.setattr(train_zoo, "ZOO_DIR", fake_zoo)
    assert main(["train-zoo", "--stage", "medusa", "--install", "--work", str(tmp_path / "w")]) == 0
    (backup,) = (tmp_path / "w").glob("backup-*")
    assert (backup / "medusa" / "heads.safetensors").read_text() == "old"
    assert (fake_zoo / "medusa" / "heads.safetensors").read_text() == "new"
    assert f"backed up in {backup}" in capsys.readouterr().out


def test_measure_only_prints_and_writes_the_card_only_where_asked(tmp_path, monkeypatch, shipped_untouched, capsys):
    figures = json.loads((SHIPPED / "card.json").read_text())["figures"]
    monkeypatch.setattr(train_zoo, "measure", lambda zoo_dir: figures)  # measuring takes a minute
    work = tmp_path / "w"
    assert main(["train-zoo", "--measure-only", "--work", str(work)]) == 0
    out = capsys.readouterr().out
    assert '"greedy_agreement"' in out and "the card was not written: --card DIR" in out
    assert not work.exists()
    assert main(["train-zoo", "--measure-only", "--work", str(work), "--card", str(tmp_path / "card")]) == 0
    assert {p.name for p in (tmp_path / "card").iterdir()} == {"README.md", "card.json"}


@pytest.mark.parametrize("argv, words", [
    (["--measure-only", "--train-only"], ["--measure-only and --train-only"]),
    (["--stage", "medusa", "--measure-only"], ["--stage medusa"]),
    (["--train-only", "--card", "c"], ["--card", "does not measure"]),
    (["--work", str(SHIPPED.parent)], ["--work", "inside the installed package", "--install"]),
    (["--card", str(SHIPPED)], ["--card", "inside the installed package"]),
    (["--threads", "0"], ["--threads", "'0'"]),
])
def test_train_zoo_flags(argv, words, capsys):
    message = _fail(["train-zoo", *argv], capsys)
    for word in words:
        assert word in message, message


def test_a_small_full_run_lands_in_the_work_folder_and_loads(tmp_path, monkeypatch, shipped_untouched):
    """The models stage at toy size (a few files, 2 steps each): the zoo lands in <work>/tiny, which load_pair reads."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    monkeypatch.setattr(train_zoo, "corpus_files", lambda: ([stdlib / "textwrap.py", stdlib / "bisect.py"],
                                                            [stdlib / "string.py"]))
    monkeypatch.setattr(train_zoo, "VOCAB_SIZE", 300)
    toy = dict(hidden=32, heads=2, mlp=64, tokens=2 * train_zoo.SEQ_LEN, lr=1e-3, batch=1)
    monkeypatch.setattr(train_zoo, "TARGET", train_zoo.ModelSpec(layers=2, **toy))
    monkeypatch.setattr(train_zoo, "DRAFT", train_zoo.ModelSpec(layers=1, **toy))
    figures = json.loads((SHIPPED / "card.json").read_text())["figures"]
    monkeypatch.setattr(train_zoo, "measure", lambda zoo_dir: figures)
    work = tmp_path / "w"
    assert main(["train-zoo", "--stage", "models", "--work", str(work)]) == 0
    assert {"target.pt", "draft.pt", "tokenizer", "tiny"} <= {p.name for p in work.iterdir()}
    assert {"target", "draft", "card.json", "README.md"} <= {p.name for p in (work / "tiny").iterdir()}
    target, draft, tok = zoo.load_pair(str(work / "tiny"), device="cpu")
    assert target.config.num_hidden_layers == 2 and draft.config.num_hidden_layers == 1 and len(tok) == 300


# ---- zoo.load_pair: anything from_pretrained loads; errors name what is missing -------------------------

def _llama(seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, intermediate_size=32))


def _tokenizer(folder: Path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / "target" / name, folder / name)


def test_load_pair_reads_shards_and_pytorch_bin(tmp_path):
    root = tmp_path / "pair"
    _llama().save_pretrained(root / "target", max_shard_size="200KB")  # shards and their index
    _tokenizer(root / "target")
    draft = _llama(1)  # pytorch_model.bin, and no tokenizer files: the pair shares the target's
    draft.config.save_pretrained(root / "draft")
    torch.save(draft.state_dict(), root / "draft" / "pytorch_model.bin")
    assert (root / "target" / "model.safetensors.index.json").exists()
    target, loaded, tok = zoo.load_pair(str(root), device="cpu")
    assert len(tok) == 4096
    torch.testing.assert_close(loaded.model.embed_tokens.weight, draft.model.embed_tokens.weight)
    assert zoo.load_pair((root / "target", root / "draft"), device="cpu")[2] is not None


def test_load_pair_says_what_is_missing(tmp_path):
    root = tmp_path / "pair"
    _llama().save_pretrained(root / "target")
    with pytest.raises(FileNotFoundError, match=r"has no draft/ folder"):
        zoo.load_pair(str(root))
    with pytest.raises(FileNotFoundError, match=r"holds one model: pass \(target, draft\) paths"):
        zoo.load_pair(str(root / "target"))
    (root / "draft").mkdir()
    with pytest.raises(FileNotFoundError, match=r"draft folder .* has no config.json"):
        zoo.load_pair(str(root))
    _llama().save_pretrained(root / "draft")
    with pytest.raises(FileNotFoundError, match=r"neither .* holds tokenizer files"):
        zoo.load_pair(str(root))
    _tokenizer(root / "draft")
    (root / "target" / "model.safetensors").unlink()
    with pytest.raises(OSError, match=r"no file named .*model\.safetensors"):
        zoo.load_pair(str(root))
    with pytest.raises(TypeError, match="not int"):
        zoo.load_pair(3)


def test_load_pair_device_is_checked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="'cuda' is not available here"):
        zoo.load_pair("tiny", device="cuda")
