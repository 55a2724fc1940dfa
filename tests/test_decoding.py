"""Tests for the speculative loop (decoding.py), the draft-model drafter (drafters.py) and DraftTree (tree.py).

Tiny random Llama models in fp32 (tests/helpers.py: a target, an unrelated draft, and a draft that is the target
with noise added, so acceptance is partial), plus the embedded zoo pair when it is present.

* Greedy: the output must EQUAL Hugging Face's greedy `generate` token for token (fp32; one flipped
  near-tie would show up as a failure, none is expected on these models), at every γ, stop and cache edge.
* Sampling: the warp settings (no top-k, top-p) reach target and draft alike: the first 3 tokens, over RUNS
  seeded runs, follow the target's exact distribution (helpers.follows_target).

What every method owes (greedy identity with EOS and budget, exact sampling, seeds, batching) is checked once for
all of them in test_exactness.py; bad arguments in test_misuse.py.
"""
import copy
import math
from types import SimpleNamespace

import pytest
import torch
from helpers import (RUNS, SAMPLING_SETTINGS, VOCAB, exact_first_tokens, follows_target, noisy_copy, prompt_ids,
                     settings_id, tiny_llama)

from specdec_lab import DraftModelDrafter, Generation, bench, generate, lineup, lm, measure, report, viz
from specdec_lab.decoding import generate_naive
from specdec_lab.sampling import Warp
from specdec_lab.draft_models import (distilled_draft, early_exit_model, fake_quantize, fake_quantized_model,
                                      trained_part)
from specdec_lab.sampling import verify_chain
from specdec_lab.tree import DraftTree, verify_tree


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(layers=3, seed=0)
    return target, noisy_copy(target, 0.05, seed=1), tiny_llama(hidden=32, layers=1, seed=2)


def _reference(target, ids, n, eos=None):
    return measure.hf_generate(target, ids, n, eos_token_id=eos).tolist()


# ---- DraftTree --------------------------------------------------------------------------------------------


def test_draft_tree_chain():
    tree = DraftTree.chain([5, 6, 7])
    assert tree.parents == [-1, 0, 1] and tree.is_chain and len(tree) == 3
    assert DraftTree.chain([]).is_chain
    assert not DraftTree([1, 2, 3], [-1, -1, 0]).is_chain
    with pytest.raises(ValueError, match="earlier node"):
        DraftTree([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="one parent per token"):
        DraftTree([1, 2], [-1])
    with pytest.raises(ValueError, match=r"q must be \[n, V\]"):
        DraftTree.chain([1, 2], torch.ones(3, 4) / 4)


# ---- greedy: identical to the target's own greedy decoding --------------------------------------------


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_draft_equal_to_target_accepts_everything(pair, gamma):
    target = pair[0]
    ids = prompt_ids(7)
    gen = generate(target, ids, DraftModelDrafter(target, gamma), max_new_tokens=30)
    assert gen.tokens == _reference(target, ids, 30)
    assert gen.accept_lengths[:-1] == [gamma] * (len(gen.accept_lengths) - 1)
    assert gen.target_calls == math.ceil(30 / (gamma + 1)), "each pass should emit γ drafts plus the bonus"
    assert gen.acceptance_rate == 1.0


def test_naive_loop_agrees_with_cached(pair):
    target, noisy, _ = pair
    ids = prompt_ids(3)
    cached = generate(target, ids, DraftModelDrafter(noisy, 3), max_new_tokens=25)
    naive = generate_naive(target, noisy, ids, gamma=3, max_new_tokens=25)
    assert naive.tokens == cached.tokens and naive.accept_lengths == cached.accept_lengths
    for seed in range(3):  # same draws in the same order: the same sampled tokens
        kw = dict(max_new_tokens=25, temperature=0.9, top_k=50)
        a = generate(target, ids, DraftModelDrafter(noisy, 3), generator=torch.Generator().manual_seed(seed), **kw)
        b = generate_naive(target, noisy, ids, 3, generator=torch.Generator().manual_seed(seed), **kw)
        assert a.tokens == b.tokens, f"seed {seed}: the naive and cached loops drew different tokens"


def test_greedy_verify_equals_verify_chain():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(5, 6, generator=g)  # [γ+1, V]
        draft = logits[:4].argmax(-1).tolist()
        cut = int(torch.randint(0, 5, (), generator=g))
        if cut < 4:
            draft[cut] = (draft[cut] + 1) % 6  # a mismatch at position `cut`
        tree = DraftTree.chain(draft)
        p = torch.nn.functional.one_hot(logits.argmax(-1), 6).float()
        assert verify_tree(logits, tree, Warp())[1] == verify_chain(p, None, draft, g)


# ---- stopping: max_new_tokens and EOS, inside an accepted draft ----------------------------------------


def test_stops_exactly_at_max_new_tokens(pair):
    target = pair[0]
    ids = prompt_ids(4)
    ref = _reference(target, ids, 13)
    for n in range(14):  # with draft = target every draft is accepted, so every stop falls inside a block
        gen = generate(target, ids, DraftModelDrafter(target, 4), max_new_tokens=n)
        assert gen.tokens == ref[:n], f"max_new_tokens={n}: got {len(gen.tokens)} tokens"
        assert gen.target_calls == math.ceil(n / 5)


def test_stops_at_first_eos_inside_accepted_block(pair):
    target = pair[0]
    ids = prompt_ids(5)
    ref = _reference(target, ids, 30)
    for k in (0, 2, 3, 6, 12):  # declare as EOS a token greedy decoding is known to produce (pitfall 13)
        eos = ref[k]
        first = ref.index(eos)
        want = ref[: first + 1]
        for drafter in (DraftModelDrafter(target, 8), DraftModelDrafter(pair[1], 3), None):
            gen = generate(target, ids, drafter, max_new_tokens=30, eos_token_id=eos)
            assert gen.tokens == want, f"EOS {eos} first produced at {first}: expected {len(want)} tokens"
        assert _reference(target, ids, 30, eos=eos) == want, "HF's generate stops at the same place"
        assert generate(target, ids, max_new_tokens=30, eos_token_id=[VOCAB - 1, eos]).tokens == want


# ---- caches ---------------------------------------------------------------------------------------------


class _Recording(DraftModelDrafter):
    """Records (committed length, accepted, γ, draft cache length) after every commit."""

    def __init__(self, draft, gamma):
        super().__init__(draft, gamma)
        self.log = []

    def propose(self, ids, warp, limit):
        tree = super().propose(ids, warp, limit)
        self.last_gamma = len(tree)
        return tree

    def commit(self, ids, accepted, path, hidden):
        super().commit(ids, accepted, path, hidden)
        self.log.append((ids.shape[1], accepted, self.last_gamma, lm.cache_len(self.cache)))


def test_draft_cache_rollback_and_lag(pair):
    target, noisy, _ = pair
    drafter = _Recording(noisy, 4)
    generate(target, prompt_ids(6), drafter, max_new_tokens=60)
    kinds = set()
    for committed, accepted, gamma, held in drafter.log:
        if accepted < gamma:  # rejection: cropped to the committed text minus the pending token
            assert held == committed - 1, f"after a rejection the draft cache holds {held}, expected {committed - 1}"
        else:  # all accepted: the last draft was never fed, the cache lags one more
            assert held == committed - 2, f"after all accepted the draft cache holds {held}, not {committed - 2}"
        kinds.add(accepted < gamma)
    assert kinds == {True, False}, "the run should contain both rejections and fully accepted steps"


def test_target_cache_bug_changes_text(pair, monkeypatch):
    """Pitfall 9: a stale TARGET cache shows up as wrong text (our invariant assertion catches it first)."""
    target, noisy, _ = pair
    monkeypatch.setattr(lm, "crop", lambda cache, length: None)
    with pytest.raises(AssertionError, match="target cache holds"):
        generate(target, prompt_ids(6), DraftModelDrafter(noisy, 4), max_new_tokens=30)


# ---- sampling: exactly the target's distribution --------------------------------------------------------


@pytest.mark.parametrize("settings", SAMPLING_SETTINGS, ids=settings_id)
def test_sampling_matches_target_distribution(small_vocab_pair, settings):
    target, draft = small_vocab_pair
    ids, g, drafter = torch.tensor([[1, 5, 2]]), torch.Generator().manual_seed(2024), DraftModelDrafter(draft, 2)
    gens = [generate(target, ids, drafter, max_new_tokens=3, generator=g, **settings) for _ in range(RUNS)]
    follows_target([gen.tokens for gen in gens], exact_first_tokens(target, ids, Warp(**settings)), str(settings))
    accepted = [a for gen in gens for a in gen.accept_lengths]
    assert 0.1 < sum(accepted) / len(accepted) < 1.9, "the draft should be accepted sometimes, not always"


# ---- drafts made from the target ------------------------------------------------------------------------


def test_early_exit_model_is_the_targets_first_layers(pair):
    target = pair[0]
    ids = prompt_ids(11)
    exit1 = early_exit_model(target, 1)
    assert exit1.model.layers[0] is target.model.layers[0] and exit1.lm_head is target.lm_head
    _, hidden = lm.forward(target, ids, hidden=True)
    want = target.lm_head(target.model.norm(hidden[1]))  # [1, T, V] layer 1's output through norm and head
    torch.testing.assert_close(lm.forward(exit1, ids), want, atol=1e-5, rtol=1e-4)
    gen = generate(target, ids, DraftModelDrafter(exit1, 3), max_new_tokens=20)
    assert gen.tokens == _reference(target, ids, 20)
    with pytest.raises(ValueError, match=r"layers must be in \[1, 2\]"):
        early_exit_model(target, 3)


def test_a_distilled_draft_starts_as_the_early_exit_with_layers_of_its_own(pair):
    """`train-heads --method draft` trains copies of the target's first layers and its final norm; the embedding and
    the LM head stay the target's. A draft vocabulary scores half the tokens: the rest get -inf, and the output is
    still the target's own."""
    target = pair[0]
    ids = prompt_ids(14)
    draft = distilled_draft(target, 1)
    assert draft.model.layers[0] is not target.model.layers[0] and draft.model.embed_tokens is target.model.embed_tokens
    torch.testing.assert_close(lm.forward(draft, ids), lm.forward(early_exit_model(target, 1), ids))
    trained = {id(p) for p in trained_part(draft).parameters()}
    assert trained.isdisjoint(id(p) for p in target.parameters()), "training the draft leaves the target as it was"
    V = target.config.vocab_size
    draft.lm_head.use_vocab(torch.arange(0, V, 2))
    logits = lm.forward(draft, ids)[0, -1]  # [V]
    assert torch.isinf(logits[1::2]).all() and torch.isfinite(logits[::2]).all()
    assert generate(target, ids, DraftModelDrafter(draft, 3), max_new_tokens=20).tokens == _reference(target, ids, 20)


def test_a_draft_models_matrices_are_stored_as_int8_with_a_scale_per_64_weights(tmp_path):
    """`weights.save(..., int8=True)` (the draft model's file): each matrix comes back within half a step of its
    group's scale, largest |weight| / 127 over 64 weights of a row; vectors stay bfloat16; a quarter of float32's bytes
    and a little more."""
    from safetensors.torch import load_file

    from specdec_lab import weights

    g = torch.Generator().manual_seed(0)
    module = torch.nn.ModuleDict({"proj": torch.nn.Linear(128, 24, bias=False), "norm": torch.nn.LayerNorm(128)})
    with torch.no_grad():
        module["proj"].weight.copy_(torch.randn(24, 128, generator=g) * torch.logspace(-3, 0, 128))  # columns' scales
        module["norm"].weight.copy_(torch.randn(128, generator=g))
    weights.save(module, tmp_path, "draft", {"x": 1}, int8=True)
    stored = load_file(tmp_path / "draft.safetensors")
    assert stored["proj.weight"].dtype == torch.int8 and stored["norm.weight"].dtype == torch.bfloat16
    back = copy.deepcopy(module)
    with torch.no_grad():
        for p in back.parameters():
            p.zero_()
    weights.load(back, tmp_path, "draft", SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32))
    w, wq = module["proj"].weight.detach(), back["proj"].weight.detach()
    step = w.reshape(24, 2, 64).abs().amax(-1, keepdim=True) / 127
    assert ((w.reshape(24, 2, 64) - wq.reshape(24, 2, 64)).abs() <= step / 2 + 1e-7).all(), "at most half a step off"
    assert (wq != 0).any() and not torch.equal(wq, w), "rounded, not copied"
    torch.testing.assert_close(back["norm"].weight, module["norm"].weight.bfloat16().float())
    assert stored["proj.weight"].numel() + 4 * stored["proj.weight" + weights.SCALE].numel() < 24 * 128 * 1.1


def test_fake_quantization(pair):
    target = pair[0]
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    wq = fake_quantize(w, bits=4, group_size=32)
    groups = wq.reshape(8, 2, 32)
    scale = w.reshape(8, 2, 32).abs().amax(-1, keepdim=True) / 7
    assert torch.allclose(groups / scale, (groups / scale).round(), atol=1e-4), "values are multiples of the scale"
    assert ((w.reshape(8, 2, 32) - groups).abs() <= scale / 2 + 1e-6).all(), "error at most half a step"
    quant = fake_quantized_model(target)
    assert quant.model.layers[0].mlp.up_proj.weight.data_ptr() != target.model.layers[0].mlp.up_proj.weight.data_ptr()
    ids = prompt_ids(12)
    gen = generate(target, ids, DraftModelDrafter(quant, 4), max_new_tokens=30)
    assert gen.tokens == _reference(target, ids, 30) and gen.acceptance_rate > 0.1


# ---- Hugging Face assisted generation on the same pair ---------------------------------------------------


def test_hf_assisted_generation_same_output(pair):
    target, noisy, _ = pair
    ids = prompt_ids(13)
    ref = _reference(target, ids, 30)
    before = noisy.generation_config.num_assistant_tokens  # None in 5.x, 20 in 4.x
    for kw in (dict(num_assistant_tokens=4), dict(schedule="heuristic"), dict(confidence_threshold=0.4)):
        assert measure.hf_generate(target, ids, 30, assistant=noisy, **kw).tolist() == ref, kw
    assert noisy.generation_config.num_assistant_tokens == before, "the assistant's settings are restored"


# ---- the benchmark and the acceptance view ------------------------------------------------------------


def test_bench_rows_agree(pair):
    target, noisy, _ = pair
    prompts = [prompt_ids(s) for s in range(2)]
    methods = lineup.draft_methods(target, noisy, max_new_tokens=12, gamma=3, naive=True)
    rows = bench.run(target, methods, prompts, warmup=1)
    assert [r.same for r in rows] == [2] * len(rows), report.format_table(rows)
    assert rows[0].target_calls == rows[1].target_calls == 24 and rows[0].tau == 1.0
    assert rows[2].target_calls == rows[3].target_calls < 24, "ours and the naive loop make the same passes"
    table = report.format_table(rows)
    assert "HF assisted, 3 tokens" in table and "speedup" in table


def test_acceptance_view(pair):
    gen = Generation(tokens=[1, 2, 3, 4, 5, 6], target_calls=3, accept_lengths=[2, 0, 3], draft_lengths=[2, 3, 3])
    assert viz.acceptance_kinds(gen) == ["accepted", "accepted", "bonus", "corrected", "accepted", "accepted"]

    class Tok:
        def decode(self, ids):
            return "abcdefg"[ids[0]]

    assert viz.acceptance_text(Tok(), gen) == "bc⟨d⟩⟦e⟧fg"
    assert 'title="bonus"' in viz.acceptance_html(Tok(), gen, prompt="a")


def test_forward_of_the_last_positions_matches_forward(pair):
    target = pair[0]
    ids = prompt_ids(14, n=12)
    full = lm.forward(target, ids)  # [1, 12, V]
    cache = lm.new_cache(target)
    torch.testing.assert_close(lm.forward(target, ids[:, :9], cache, last=2), full[:, 7:9], atol=1e-5, rtol=1e-4)
    assert lm.cache_len(cache) == 9, "forward(..., last=n) extends the cache by every fed token"
    torch.testing.assert_close(lm.forward(target, ids[:, 9:], cache, last=3), full[:, 9:], atol=1e-5, rtol=1e-4)
