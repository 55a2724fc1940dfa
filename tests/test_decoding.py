"""Tests for the speculative loop (decoding.py), the draft-model drafter (drafters.py) and DraftTree (tree.py).

Tiny random Llama models in fp32 (tests/helpers.py: a target, an unrelated draft, and a draft that is the target
with noise added, so acceptance is partial), plus the embedded zoo pair when it is present.

* Greedy: the output must EQUAL Hugging Face's greedy `generate` token for token (fp32; one flipped
  near-tie would show up as a failure, none is expected on these models).
* Sampling: the joint distribution of the first 3 generated tokens, over RUNS seeded runs, must match the
  target's own (computed exactly by enumerating every 3-token continuation) in Pearson's chi-square test,
  cells with expected count < 5 pooled, at P_MIN. Fixed seeds, so the test is deterministic.
"""
import math

import pytest
import torch
from helpers import P_MIN, RUNS, VOCAB, exact_joint, noisy_copy, pooled_chi_square, prompt_ids, tiny_llama

from specdec_lab import DraftModelDrafter, Generation, bench, generate, lineup, lm, measure, report, sampling, viz, zoo
from specdec_lab.decoding import generate_naive
from specdec_lab.sampling import Warp
from specdec_lab.draft_models import early_exit_model, fake_quantize, fake_quantized_model
from specdec_lab.drafters import Drafter
from specdec_lab.prompts import load_prompts
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
def test_greedy_equals_hf_generate(pair, gamma):
    target, noisy, unrelated = pair
    for seed in range(3):
        ids = prompt_ids(seed)
        ref = _reference(target, ids, 40)
        for draft in (noisy, unrelated):
            gen = generate(target, ids, DraftModelDrafter(draft, gamma), max_new_tokens=40)
            assert gen.tokens == ref, f"γ={gamma}, prompt {seed}: greedy speculation differs from greedy decoding"
            assert gen.target_calls == len(gen.accept_lengths) and len(gen.tokens) == 40
        assert generate(target, ids, max_new_tokens=40).tokens == ref, "plain decoding differs from HF's"
    # the noisy draft must exercise both branches: some rejections and some fully accepted steps
    gen = generate(target, prompt_ids(0), DraftModelDrafter(noisy, gamma), max_new_tokens=40)
    assert 0 < gen.acceptance_rate < 1, f"acceptance {gen.acceptance_rate}: the test draft should agree partly"


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


@pytest.fixture(scope="module")
def small_vocab_pair():
    target = tiny_llama(vocab=8, hidden=16, layers=1, seed=10, init=0.5)
    return target, noisy_copy(target, 0.5, seed=11)


@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.7, top_k=4),
                                      dict(temperature=0.7, top_p=0.8), dict(temperature=1.0, top_p=0.9)],
                         ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_sampling_matches_target_distribution(small_vocab_pair, settings):
    target, draft = small_vocab_pair
    ids = torch.tensor([[1, 5, 2]])
    want = exact_joint(target, ids, Warp(**settings))  # [V^3]
    counts, mean_accepted = _sample_counts(target, draft, ids, settings, RUNS)
    pvalue = pooled_chi_square(counts, want)
    print(f"{settings}: chi-square p-value {pvalue:.3f} over {RUNS} runs, "
          f"mean accepted drafts per call {mean_accepted:.2f}")
    assert pvalue > P_MIN, f"{settings}: the first 3 tokens do not follow the target (p-value {pvalue:.2g})"
    assert 0.1 < mean_accepted < 1.9, "the draft should be accepted sometimes, not always"


def _sample_counts(target, draft, ids, settings, runs, seed=2024):
    g = torch.Generator().manual_seed(seed)
    drafter = DraftModelDrafter(draft, 2)
    counts, accepted = torch.zeros(8 ** 3, dtype=torch.float64), []
    for _ in range(runs):
        gen = generate(target, ids, drafter, max_new_tokens=3, generator=g, **settings)
        a, b, c = gen.tokens
        counts[a * 64 + b * 8 + c] += 1
        accepted += gen.accept_lengths
    return counts, sum(accepted) / len(accepted)


def test_sampling_test_catches_a_biased_verifier(small_vocab_pair, monkeypatch):
    """The test above has power: replacing rejected drafts from p instead of the residual fails it."""
    target, draft = small_vocab_pair
    ids = torch.tensor([[1, 5, 2]])
    want = exact_joint(target, ids, Warp(temperature=1.0))
    monkeypatch.setattr(sampling, "_residual", lambda p, q: p)
    counts, _ = _sample_counts(target, draft, ids, dict(temperature=1.0), RUNS)
    assert pooled_chi_square(counts, want) < P_MIN


def test_seeded_runs_reproduce(pair):
    target, noisy, _ = pair
    ids = prompt_ids(8)
    kw = dict(max_new_tokens=30, temperature=1.0, top_p=0.95)
    runs = [generate(target, ids, DraftModelDrafter(noisy, 4), generator=torch.Generator().manual_seed(s), **kw)
            for s in (0, 0, 1)]
    assert runs[0].tokens == runs[1].tokens and runs[0].accept_lengths == runs[1].accept_lengths
    assert runs[0].tokens != runs[2].tokens, "different seeds should give different samples"


# ---- bad input: a clear error that says what to do -------------------------------------------------------


def test_bad_input_errors(pair):
    target, noisy, _ = pair
    ids = prompt_ids(0)
    with pytest.raises(ValueError, match="prompt is empty: pass at least one token id"):
        generate(target, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=5)
    with pytest.raises(ValueError, match="gamma .* must be an int >= 1"):
        DraftModelDrafter(noisy, gamma=0)
    with pytest.raises(ValueError, match="max_new_tokens .*must be an int >= 0"):
        generate(target, ids, max_new_tokens=-1)
    with pytest.raises(ValueError, match="different vocabularies .* use a draft trained with the target's tokenizer"):
        generate(target, ids, DraftModelDrafter(tiny_llama(vocab=VOCAB + 4, hidden=32, layers=1), 2), max_new_tokens=5)
    with pytest.raises(ValueError, match="more than the target's context of 128: keep its last 127"):
        generate(target, torch.zeros(1, 129, dtype=torch.long), max_new_tokens=1)
    with pytest.raises(ValueError, match="exceed the target's context of 128: ask for at most 8 new tokens"):
        generate(target, torch.zeros(1, 120, dtype=torch.long), max_new_tokens=9)
    with pytest.raises(ValueError, match="batch size 1"):
        generate(target, torch.zeros(2, 4, dtype=torch.long), max_new_tokens=1)
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        generate(target, torch.tensor([[1, VOCAB]]), max_new_tokens=1)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(target, ids, max_new_tokens=1, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p must be in"):
        generate(target, ids, max_new_tokens=1, temperature=1.0, top_p=0.0)
    short_draft = tiny_llama(hidden=32, layers=1, context=16)
    with pytest.raises(ValueError, match="more than the draft's context of 16"):
        generate(target, torch.zeros(1, 20, dtype=torch.long), DraftModelDrafter(short_draft, 2), max_new_tokens=1)
    assert generate(target, [3, 4, 5], max_new_tokens=0).tokens == []  # a list works, and 0 tokens is fine


def test_stateless_drafter_needs_only_propose(pair):
    """The hooks have defaults: a drafter that repeats the last token writes only propose()."""

    class Repeat(Drafter):
        def propose(self, ids, warp, limit):
            return DraftTree.chain([int(ids[0, -1])] * min(3, limit))

    target = pair[0]
    ids = prompt_ids(9)
    gen = generate(target, ids, Repeat(), max_new_tokens=20)
    assert gen.tokens == _reference(target, ids, 20) and isinstance(gen, Generation)


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


# ---- the embedded zoo pair (present in CI; trained by `specdec-lab train-zoo`) ---------------------------

ZOO = (zoo.EMBEDDED["tiny"] / "target" / "model.safetensors").exists()


@pytest.mark.skipif(not ZOO, reason="the embedded zoo pair is not trained yet (run `specdec-lab train-zoo`)")
def test_zoo_greedy_identity_on_suite_prompts():
    target, draft, tok = zoo.load_pair("tiny", device="cpu")
    prompts = load_prompts()
    for p in prompts[::9]:  # 6 prompts spread over the three categories; the notebook runs all 52
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        ref = measure.hf_generate(target, ids, 32, eos_token_id=tok.eos_token_id).tolist()
        gen = generate(target, ids, DraftModelDrafter(draft, 4), max_new_tokens=32, eos_token_id=tok.eos_token_id)
        assert gen.tokens == ref, f"prompt {p['id']}: speculative output differs from greedy decoding"
        assert gen.tau > 1.3, f"prompt {p['id']}: τ = {gen.tau:.2f}, the zoo draft should help"


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
