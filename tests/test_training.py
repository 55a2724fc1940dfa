"""Tests for specdec_lab.training, the one training loop behind Medusa's heads and EAGLE's drafts (the state
cache, the learning-rate schedule, fit), and specdec_lab.weights, the files of trained heads and drafts."""
import math

import pytest
import torch
from helpers import tiny_llama
from torch import nn

from specdec_lab import lm, weights
from specdec_lab.medusa import MedusaHeads
from specdec_lab.training import Recipe, cache_hidden, cache_states, fit, lr_at
from specdec_lab.weights import load, read_config, save


@pytest.fixture(scope="module")
def target():
    return tiny_llama(layers=3, seed=0)  # hidden 64, vocab 300


# ---- the state cache ------------------------------------------------------------------------------------


def test_cache_states_holds_the_chosen_layers_then_the_last_and_the_argmax(target):
    x = torch.randint(0, 300, (5, 12), generator=torch.Generator().manual_seed(0))
    states, best = cache_states(target, x, layers=(1, 2), batch=2)  # batches of 2, 2, 1 windows
    assert states.shape == (5, 12, 3, 64) and states.dtype == torch.bfloat16 and best.shape == (5, 12)
    logits, hidden = lm.forward(target, x, hidden=True)
    for s, layer in enumerate([1, 2, -1]):
        torch.testing.assert_close(states[:, :, s].float(), hidden[layer].to(torch.bfloat16).float())
    assert best.equal(logits.argmax(-1)), "the labels are the target's own greedy choices"
    last, best_again = cache_hidden(target, x)  # Medusa's view: the last state only, [N, T, H]
    assert last.shape == (5, 12, 64) and last.equal(states[:, :, -1]) and best_again.equal(best)


# ---- the schedule -----------------------------------------------------------------------------------------


def test_heads_schedule_warms_up_peaks_and_decays_to_zero():
    lrs = [lr_at(s, 200, 1e-3) for s in range(200)]
    assert lrs[0] == pytest.approx(1e-3 / 20, rel=1e-3), "step 0: a twentieth of the peak"
    assert all(a < b for a, b in zip(lrs[:19], lrs[1:20])), "rising over the 20 warmup steps"
    assert max(lrs) == lrs[19] and lrs[19] == pytest.approx(1e-3, rel=0.03), "the peak right after the warmup"
    assert all(a > b for a, b in zip(lrs[19:], lrs[20:])), "then a cosine decay"
    assert 0 < lrs[-1] < 1e-6, "down to (almost) nothing"


def test_zoo_schedule_holds_a_floor():
    total = 1000
    lrs = [lr_at(s, total, 2e-3, warmup=100, floor=0.1, after_warmup=True) for s in range(total)]
    assert lrs[0] == pytest.approx(2e-5) and lrs[99] == pytest.approx(2e-3) and lrs[100] == 2e-3, "a ramp to the peak"
    assert all(a >= b for a, b in zip(lrs[100:], lrs[101:])), "then a cosine over the remaining steps"
    assert lrs[-1] == pytest.approx(2e-4, rel=1e-4) and min(lrs[100:]) >= 2e-4, "to a tenth of the peak, not below"


def test_schedules_give_the_numbers_the_shipped_weights_were_trained_with():
    """Bit for bit the formulas the zoo was trained with (they round differently; see lr_at)."""
    for steps, lr in [(400, 1e-3), (1200, 3e-3), (40, 3e-3)]:  # Medusa, EAGLE, notebook 05's runs
        old = [lr * min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)) for s in range(steps)]
        assert [lr_at(s, steps, lr) for s in range(steps)] == old
    for total in (1464, 976):  # the zoo's target and draft

        def old(step, warmup=100, peak=2e-3):
            if step < warmup:
                return peak * (step + 1) / warmup
            progress = (step - warmup) / max(1, total - warmup)
            return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

        assert [lr_at(s, total, 2e-3, 100, 0.1, True) for s in range(total)] == [old(s) for s in range(total)]


# ---- the loop ----------------------------------------------------------------------------------------------


def _toy(seed=0):
    """A linear regression: y = X w, 64 examples of 4 features; the module starts at zero."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(64, 4, generator=g)
    y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    model = nn.Linear(4, 1, bias=False)
    nn.init.zeros_(model.weight)

    def loss_fn(idx, _):
        loss = (model(X[idx])[:, 0] - y[idx]).pow(2).mean()  # [batch] residuals -> mean square
        return loss, [loss.item()]

    return model, loss_fn


def test_fit_lowers_the_loss_logs_and_is_reproducible():
    model, loss_fn = _toy()
    recipe = Recipe(steps=200, batch=16, lr=0.1, log_every=50)
    log = fit(model, loss_fn, 64, recipe, progress=False, precision="fp32")
    assert [row[0] for row in log] == [1, 50, 100, 150, 200], "step 1, then every 50th"
    assert log[-1][1] < 0.01 * log[0][1], f"fit should drive the loss down: {log}"
    assert not model.training, "fit leaves the module in eval mode"
    again, loss_fn = _toy()
    fit(again, loss_fn, 64, recipe, progress=False, precision="fp32")
    assert again.weight.equal(model.weight), "same seed, same batches, same weights"
    clipped, loss_fn = _toy()
    fit(clipped, loss_fn, 64, Recipe(steps=200, batch=16, lr=0.1, clip=1e-3), progress=False, precision="fp32")
    assert not clipped.weight.equal(model.weight), "clip bounds every step's gradient norm"


def test_fit_trains_only_what_requires_grad():
    model, loss_fn = _toy()
    frozen = nn.Linear(1, 1)
    model.frozen = frozen.requires_grad_(False)
    before = frozen.weight.clone()
    fit(model, loss_fn, 64, Recipe(steps=5, lr=0.1), progress=False, precision="fp32")
    assert frozen.weight.equal(before)


# ---- the weights' files ---------------------------------------------------------------------------------------


def test_save_load_round_trip(target, tmp_path):
    heads = MedusaHeads.for_target(target, 2)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    file = tmp_path / "medusa" / "heads.safetensors"
    save(heads, tmp_path / "medusa", "medusa", {"num_heads": 2, "hidden": 64, "vocab": 300, "note": "kept"})
    meta = read_config(tmp_path / "medusa", target, "medusa")
    assert meta["num_heads"] == 2 and meta["note"] == "kept"
    loaded = load(MedusaHeads.for_target(target, 2), tmp_path / "medusa", "medusa", target)
    assert not loaded.training
    for (name, want), got in zip(heads.state_dict().items(), loaded.state_dict().values()):
        assert got.dtype == torch.float32 and got.equal(want.to(torch.bfloat16).float()), f"{name}: stored in bf16"
    heads.save(tmp_path / "again", meta={"note": "kept"})  # the class's own save and from_zoo use the same files
    assert (tmp_path / "again" / "heads.safetensors").read_bytes() == file.read_bytes()
    assert MedusaHeads.from_zoo(target, tmp_path / "again").num_heads == 2


def test_missing_or_mismatched_weights_say_what_to_do(target, tmp_path):
    with pytest.raises(FileNotFoundError, match="no Medusa heads in .*train-zoo --stage medusa"):
        read_config(tmp_path, target, "medusa")
    save(nn.Linear(2, 2), tmp_path, "medusa", {"hidden": 32, "vocab": 300})
    with pytest.raises(ValueError, match="trained for hidden 32 / vocab 300, not this target's 64 / 300"):
        read_config(tmp_path, target, "medusa")


def test_the_architecture_reads_alike_under_transformers_4_and_5(monkeypatch):
    """5.x keeps a model's rotary settings in `rope_parameters`, 4.x in `rope_theta` and `rope_scaling`: the
    fingerprint's architecture is the same either way (heads trained under one version load under the other),
    and a model of another depth or rope base still reads as another architecture."""
    from types import SimpleNamespace

    import transformers
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, rope_theta=100000.0)
    here = weights.architecture(config)
    assert here["rope"] == {"rope_type": "default", "rope_theta": 100000.0} and here["num_hidden_layers"] == 3
    fields = {k: getattr(config, k) for k in weights.ARCHITECTURE if getattr(config, k, None) is not None}
    if int(transformers.__version__.split(".")[0]) >= 5:  # the same model as the other major version holds it
        other, version = SimpleNamespace(**fields, rope_theta=100000.0, rope_scaling=None), "4.53.3"
        rebased = SimpleNamespace(**fields, rope_theta=10000.0, rope_scaling=None)
    else:
        other, version = SimpleNamespace(**fields, rope_parameters={"rope_type": "default", "rope_theta": 1e5}), "5.24.0"
        rebased = SimpleNamespace(**fields, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    monkeypatch.setattr(lm.transformers, "__version__", version)  # the module lm reads
    assert weights.architecture(other) == here
    assert weights.architecture(rebased)["rope"]["rope_theta"] == 10000.0
    deeper = SimpleNamespace(**{**vars(other), "num_hidden_layers": 4})
    assert weights.architecture(deeper) != here


def test_the_shipped_cards_record_the_architecture_this_transformers_reads():
    """Every Medusa head and EAGLE draft shipped for the zoo's target names the architecture that target reads as
    here, under whichever supported transformers version is installed: none is refused as another model (the real
    model's are loaded by tests/test_real_model.py)."""
    import json

    from specdec_lab import zoo

    target, _ = zoo._load_one(str(zoo.EMBEDDED["tiny"] / "target"), "cpu", torch.float32)
    here = weights.architecture(target.config)
    cards = sorted(zoo.EMBEDDED["tiny"].glob("*/config.json"))
    heads = [c for c in cards if c.parent.name in ("medusa", "eagle1", "eagle3")]
    assert len(heads) == 3, cards
    for card in heads:
        assert json.loads(card.read_text())["architecture"] == here, card


def test_a_converted_real_model_is_kept_once_per_major_version_of_transformers(monkeypatch, tmp_path):
    """load_model's fp32 copy of a GGUF is written by save_pretrained, whose tokenizer file from transformers 5 names a
    class that 4.x lacks (TokenizersBackend): each major version keeps its own copy, so switching versions (a Colab
    runtime beside a local venv) converts again instead of failing to load the other's files."""
    from specdec_lab import zoo

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folders = {}
    for version in ("4.53.3", "4.57.1", "5.24.0"):
        monkeypatch.setattr(lm.transformers, "__version__", version)  # the module lm reads
        folders[version] = zoo.model_folder("smollm2-135m-instruct")
    assert folders["4.53.3"] == folders["4.57.1"] != folders["5.24.0"]
    assert folders["5.24.0"] == tmp_path / "specdec-lab" / "models" / "smollm2-135m-instruct" / "transformers-5"


def test_the_shipped_heads_load_here_and_are_refused_by_a_target_of_another_architecture(tmp_path):
    """The zoo's shipped Medusa heads load for the zoo target under the installed transformers (the cards hold the
    architecture, not a hash of one version's serialisation; test_the_architecture_reads_alike_under_transformers_4_and_5
    shows the other major version reads it alike); a target one layer shallower, same sizes and vocabulary, is refused
    with the differing field named and the command that trains heads for it."""
    import copy

    from specdec_lab import zoo
    from specdec_lab.medusa import MedusaHeads

    folder = zoo.EMBEDDED["tiny"] / "medusa"
    target, _ = zoo._load_one(str(zoo.EMBEDDED["tiny"] / "target"), "cpu", torch.float32)
    assert isinstance(MedusaHeads.from_pretrained(target, folder), MedusaHeads)
    other = copy.deepcopy(target)
    other.model.layers = other.model.layers[:-1]
    other.config.num_hidden_layers -= 1
    with pytest.raises(ValueError, match=r"whose architecture is not this target's .*num_hidden_layers: "
                                         rf"{target.config.num_hidden_layers} there, {other.config.num_hidden_layers} here"
                                         r".*specdec-lab train-heads"):
        MedusaHeads.from_pretrained(other, folder)


def test_a_draft_models_agreement_by_depth_is_the_chain_it_would_draft(target):
    """draft_accuracy's entry i, computed for all positions at once (EAGLE's unroll mask on the draft's cache), is
    what drafting a chain from each position one token at a time gives: its (i + 1)-th token against the target's
    choice at that point of the true text."""
    from specdec_lab.draft_models import distilled_draft
    from specdec_lab.training import draft_accuracy

    draft = distilled_draft(target, 1)
    x = torch.randint(0, target.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))  # [1, T]
    with torch.no_grad():
        labels = lm.forward(target, x).argmax(-1)  # [1, T] the target's choice for token p + 1
        hits, counts = [0] * 3, [0] * 3
        for p in range(x.shape[1]):  # a chain from each position, one forward per token
            seq = x[:, :p + 1]
            for i in range(min(3, x.shape[1] - p)):
                nxt = lm.forward(draft, seq)[0, -1].argmax()
                hits[i], counts[i] = hits[i] + int(nxt == labels[0, p + i]), counts[i] + 1
                seq = torch.cat([seq, nxt.view(1, 1)], 1)
    assert draft_accuracy(draft, None, x, labels, depth=3) == pytest.approx([h / c for h, c in zip(hits, counts)])
    assert hits[0] > 0, "the draft agrees somewhere, or the test compares nothing"
