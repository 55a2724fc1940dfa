"""Chapter 08's showdown (`specdec-lab bench`) and the engine-settings mapping."""
import csv
import json

import pytest
import torch

from specdec_lab import (DraftModelDrafter, EagleDrafter, MedusaDrafter, PromptLookupDrafter, bench, lineup, report,
                         train_heads)
from specdec_lab.__main__ import main
from specdec_lab.engines import sglang_flags
from specdec_lab.lineup import engine_settings
from specdec_lab.measure import ForwardTimer
from specdec_lab.prompts import CATEGORIES as SUITE
from specdec_lab.prompts import load_prompts


@pytest.fixture(scope="module")
def results(pair):
    target, draft, tok = pair
    prompts = [next(p for p in load_prompts(c)) for c in SUITE]  # one prompt per category
    return bench.showdown(target, draft, tok, prompts, temperatures=(0.0, 0.7), max_new_tokens=12)


def test_every_method_runs_and_greedy_output_is_identical(results):
    greedy = [r for r in results if r["temperature"] == 0 and r["category"] == "all"]
    names = [r["method"] for r in greedy]
    for family in ["target only", "draft model, chain", "draft model, tree", "Medusa", "EAGLE-1", "EAGLE-2",
                   "EAGLE-3", "prompt lookup", "lookahead", "HF assisted", "HF prompt lookup"]:
        assert any(n.startswith(family) for n in names), (family, names)
    for r in greedy:
        assert r["skipped"] is None and r["identical"] == r["prompts"] == 3, r


def test_limit_and_efficiency_come_from_the_forwards_of_the_same_run(results):
    rows = [r for r in results if r["category"] == "all" and not r["skipped"]]
    for r in rows:
        assert r["forward_s"] is not None and 0 < r["forward_s"] <= r["seconds"], r
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["limit"], rel=1e-3), r
    base = next(r for r in rows if r["method"] == "target only" and r["temperature"] == 0)
    assert base["limit"] == pytest.approx(1.0) and base["efficiency"] == pytest.approx(1.0)


def test_forward_timer_counts_outermost_calls_once(pair):
    target, draft, _ = pair
    head = target.get_output_embeddings()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad(), ForwardTimer(target, [draft, head]) as timer:
        target(input_ids=ids)  # its LM head runs inside: the target's time only
        after_target = dict(timer.seconds)
        draft(input_ids=ids)
        head(torch.zeros(1, target.config.hidden_size))  # a drafter reading the LM head: drafting
    assert after_target["target"] > 0 and after_target["draft"] == 0
    assert timer.seconds["draft"] > 0 and timer.seconds["target"] == after_target["target"]
    assert timer.depth == 0 and not timer.handles
    assert not target._forward_pre_hooks and not head._forward_hooks, "the hooks are removed on exit"


def test_rows_add_up_by_category(results):
    for T in (0.0, 0.7):
        rows = [r for r in results if r["temperature"] == T and not r["skipped"]]
        for name in {r["method"] for r in rows}:
            by = {r["category"]: r for r in rows if r["method"] == name}
            assert set(by) == {"all", *SUITE}
            for key in ("prompts", "tokens", "target_calls"):
                assert by["all"][key] == sum(by[c][key] for c in SUITE)
            assert by["all"]["tau"] == pytest.approx(by["all"]["tokens"] / by["all"]["target_calls"], abs=1e-4)
        base = [r for r in rows if r["method"] == "target only"]
        assert all(r["speedup"] == 1 and r["tau"] == 1 for r in base)  # plain decoding: one token per pass


def test_sampling_rows(results):
    sampled = [r for r in results if r["temperature"] == 0.7 and r["category"] == "all"]
    assert all(r["identical"] is None for r in sampled)  # identity is a greedy check
    skipped = {r["method"]: r["skipped"] for r in sampled if r["skipped"]}
    assert list(skipped) == ["lookahead (4, 4, 4)"] and "greedy only" in skipped["lookahead (4, 4, 4)"]
    chain = next(r for r in sampled if r["method"].startswith("draft model, chain"))
    assert 1 < chain["tau"] <= 4  # γ = 3: at most 3 drafts + 1 per pass


def test_sampling_is_repeatable(pair):
    target, draft, tok = pair
    prompts = load_prompts("edit")[:1]
    a, b = (bench.showdown(target, draft, tok, prompts, temperatures=(0.7,), max_new_tokens=10) for _ in range(2))
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    assert [r["target_calls"] for r in a] == [r["target_calls"] for r in b]


def test_format_and_save(results, tmp_path):
    table = report.format_showdown(results, 0.0)
    assert "identical" in table and "3/3" in table and "speedup by category" in table
    assert "n/a: greedy only" in report.format_showdown(results, 0.7)
    report.save_results(results, {"pair": "tiny"}, tmp_path / "r.json", tmp_path / "r.csv")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["meta"] == {"pair": "tiny"} and data["results"] == results
    with open(tmp_path / "r.csv", newline="") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(results) and lines[0]["method"] == "target only"


def test_methods_without_heads_say_how_to_train_them(pair):
    target, draft, _ = pair
    methods = lineup.showdown_methods(target, draft, 8, heads={})
    notes = {name: m for name, m in methods.items() if isinstance(m, str) and "greedy only" not in m}
    assert sorted(notes) == ["EAGLE-1, chain γ=4", "EAGLE-2, dynamic tree", "EAGLE-3, dynamic tree",
                             "Medusa, 24-node tree", "block drafter, γ=4"]
    assert all("specdec-lab train-heads --target" in why for why in notes.values()), notes


def test_the_zoo_target_finds_its_shipped_heads_and_no_other_does(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no heads trained by the user
    target, draft, _ = pair
    assert sorted(train_heads.find(target)) == ["block", "eagle1", "eagle3", "medusa"]
    assert train_heads.find(draft) == {}, "the shipped heads were trained for the zoo target, not its draft"


def test_command_line(tmp_path, capsys):
    code = main(["bench", "--limit", "1", "--max-new-tokens", "6", "--temperatures", "0", "--threads", "1",
                 "--json", str(tmp_path / "b.json"), "--csv", str(tmp_path / "b.csv")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "temperature 0 (greedy)" in out and "EAGLE-3, dynamic tree" in out and "1/1" in out
    meta = json.loads((tmp_path / "b.json").read_text())["meta"]
    assert meta["pair"] == "tiny" and meta["prompts"] == 1 and meta["temperatures"] == [0.0]
    assert meta["threads"] == 1 and meta["device"] == "cpu"
    assert (tmp_path / "b.csv").read_text().startswith("temperature,method,category")


def test_auto_rows_sit_beside_their_defaults_and_stay_exact(tmp_path, capsys):
    code = main(["bench", "--auto", "--limit", "1", "--max-new-tokens", "6", "--temperatures", "0", "--threads", "1",
                 "--json", str(tmp_path / "a.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [r for r in json.loads((tmp_path / "a.json").read_text())["results"] if r["category"] == "all"]
    names = [r["method"] for r in rows]
    auto = [n for n in names if n.endswith("(auto)")]
    assert [n.split(",")[0] for n in auto] == ["draft model", "draft model", "EAGLE-2", "EAGLE-3"], names
    for n in auto:  # each right after its default
        before = names[names.index(n) - 1]
        assert before.split(",")[0] == n.split(",")[0] and not before.endswith("(auto)"), names
    assert all(r["identical"] == 1 for r in rows), rows


def test_batched_command_line(tmp_path, capsys):
    code = main(["bench", "--batch", "3", "--limit", "5", "--max-new-tokens", "8", "--temperatures", "0,0.7",
                 "--threads", "1", "--json", str(tmp_path / "b.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "EAGLE-1, chain γ=4" in out and "target only, batch 1" in out and "5/5" in out
    results = json.loads((tmp_path / "b.json").read_text())["results"]
    greedy = [r for r in results if r["temperature"] == 0]
    assert all(r["identical"] == 5 for r in greedy), "every row equals its own greedy decoding"
    assert {r["batch"] for r in greedy} == {1, 3}
    for r in greedy:  # one harness (bench.run with a batch) counted both: each prompt's passes, and the batched ones
        assert r["steps"] == r["row_passes"] if r["batch"] == 1 else r["steps"] < r["row_passes"], r
    assert all(r["identical"] is None and r["tokens"] > 0 for r in results if r["temperature"] == 0.7)


def test_command_line_offline_hub_pair_fails_clearly(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="Hub is unreachable"):
        main(["bench", "--pair", "smollm2", "--limit", "1"])


# ---- engines.py ---------------------------------------------------------------------------------------


def test_sglang_counts_the_root():
    assert sglang_flags(1, 3, 3) == {"--speculative-num-steps": 3, "--speculative-eagle-topk": 1,
                                     "--speculative-num-draft-tokens": 4}
    assert sglang_flags(4, 8, 24)["--speculative-num-draft-tokens"] == 25
    for bad in [(0, 3, 3), (1, 3, 4), (2, 2, 7), (4, 1, 5)]:  # zero, a chain with a branch, too many nodes
        with pytest.raises(ValueError):
            sglang_flags(*bad)
    assert sglang_flags(2, 2, 6)["--speculative-num-draft-tokens"] == 7  # 2 + 2 * 2 nodes: the most possible


def test_engine_settings(pair):
    target, draft, _ = pair
    chain = engine_settings(DraftModelDrafter(draft, 5), model="m")
    vllm = json.loads(chain["vLLM"].split("'")[1])
    assert vllm == {"method": "draft_model", "model": "m", "num_speculative_tokens": 5}
    assert "--speculative-num-draft-tokens 6" in chain["SGLang"] and "--draft-max 5" in chain["llama.cpp"]
    assert "num_assistant_tokens = 5" in chain["Hugging Face"]
    lookup = engine_settings(PromptLookupDrafter(7, 2))
    assert json.loads(lookup["vLLM"].split("'")[1])["prompt_lookup_max"] == 2
    assert "prompt_lookup_num_tokens=7" in lookup["Hugging Face"]
    eagle2 = engine_settings(EagleDrafter.from_zoo(target, 1, dynamic=True))
    assert "--speculative-algorithm EAGLE " in eagle2["SGLang"] and "--speculative-eagle-topk 4" in eagle2["SGLang"]
    assert "EAGLE3" in engine_settings(EagleDrafter.from_zoo(target, 3, dynamic=True))["SGLang"]
    assert engine_settings(MedusaDrafter.from_zoo(target))["SGLang"].startswith("no equivalent")
    assert all(v.startswith("no equivalent") for v in engine_settings(DraftModelDrafter(draft, branching=[2, 1])).values())
    assert set(engine_settings(None).values()) == {"leave speculative decoding off"}
    with pytest.raises(TypeError, match="no engine mapping"):
        engine_settings(object())
