"""Greedy identity up to ties (specdec_lab.identity): correct decoders pass in fp32 with no mismatch and in bfloat16
and float16 with ties only; real bugs (a dropped tree mask, an output cut short) are called bugs; an exact tie of
the target's logits is called a tie; `specdec-lab bench` counts both."""
import copy

import pytest
import torch

from helpers import prompt_ids, tiny_llama
from specdec_lab import bench, identity, lm, report, zoo
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.eagle import EagleDrafter, EagleNet
from specdec_lab.lookahead import lookahead_generate
from specdec_lab.ngram import PromptLookupDrafter

N = 32  # new tokens per prompt


def _decoders(target, draft):
    """{name: ids -> new tokens} for the drafters that verify in different ways: chain, trees, lookahead."""
    net = EagleNet.from_zoo(target, 1)
    drafters = {"draft chain": lambda: DraftModelDrafter(draft, 3),
                "draft tree": lambda: DraftModelDrafter(draft, branching=[2, 2, 1, 1]),
                "EAGLE-2": lambda: EagleDrafter(net, dynamic=True),
                "prompt lookup": lambda: PromptLookupDrafter(10, 3)}
    out = {name: (lambda ids, make=make: generate(target, ids, make(), max_new_tokens=N).tokens)
           for name, make in drafters.items()}
    out["lookahead"] = lambda ids: lookahead_generate(target, ids, N).tokens
    return out


def _check(dtype, prompts=3):
    target, draft, tok = zoo.load_pair("tiny", device="cpu", dtype=dtype)
    ids = bench.suite_prompts(tok)[::17][:prompts]
    ref = [generate(target, x, None, max_new_tokens=N).tokens for x in ids]
    return {name: identity.compare(target, ids, [run(x) for x in ids], ref)
            for name, run in _decoders(target, draft).items()}


def test_fp32_every_decoder_is_identical():
    for name, verdict in _check(torch.float32).items():
        assert verdict.identical == verdict.prompts == 3 and not verdict.mismatches, f"{name}: {verdict}"
        assert str(verdict) == "3/3 identical"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_this_cpu_has_ties_only(dtype):
    """Which prompts tie depends on the CPU's kernels; that none is a bug does not."""
    for name, verdict in _check(dtype).items():
        assert not verdict.bugs, f"{name} in {dtype}: {verdict}"
        for m in verdict.ties:  # a tie is a near-tie of the target's top logits, within the measured noise
            assert m.gap <= 2 * m.noise and m.noise > 0


def test_a_dropped_tree_mask_is_a_bug(pair, monkeypatch):
    """Verifying a tree with a causal mask (nodes see their siblings) changes logits far beyond rounding."""
    target, draft, tok = pair
    ids = bench.suite_prompts(tok)[::17][:3]
    ref = [generate(target, x, None, max_new_tokens=N).tokens for x in ids]
    forward = lm.forward

    def no_tree_mask(model, x, cache=None, positions=None, mask=None, **kw):
        return forward(model, x, cache, positions, None if model is target else mask, **kw)

    monkeypatch.setattr(lm, "forward", no_tree_mask)
    outs = [generate(target, x, DraftModelDrafter(draft, branching=[2, 2, 1, 1]), max_new_tokens=N).tokens
            for x in ids]
    monkeypatch.setattr(lm, "forward", forward)
    report = identity.compare(target, ids, outs, ref)
    assert report.bugs and not report.ties, report
    assert all(m.gap > 100 * m.noise for m in report.bugs), report
    assert "BUG" in str(report) and f"{len(report.bugs)} bug" in str(report)


def test_an_exact_tie_is_a_tie():
    """Give token b the LM-head row of token a: their logits are equal everywhere. Greedy decoding takes the
    lower id at a tie (argmax's first); an output that took the other is as greedy, and is called a tie."""
    target = copy.deepcopy(tiny_llama())
    ids = prompt_ids(3)
    ref = generate(target, ids, None, max_new_tokens=8).tokens
    a, b = ref[2], (ref[2] + 1) % 300  # b: a token that is not a
    with torch.no_grad():
        target.lm_head.weight[b] = target.lm_head.weight[a]
    ref = generate(target, ids, None, max_new_tokens=8).tokens
    j = ref.index(min(a, b))
    ours = ref[:j] + [max(a, b)] + ref[j + 1:]
    m = identity.classify(target, ids, ours, ref)
    assert (m.position, m.ours, m.reference, m.gap, m.tie) == (j, max(a, b), min(a, b), 0.0, True), m
    assert "tie" in str(m)


def test_an_output_cut_short_is_a_bug():
    target = tiny_llama()
    ids = prompt_ids(4)
    ref = generate(target, ids, None, max_new_tokens=8).tokens
    m = identity.classify(target, ids, ref[:5], ref, prompt=7)
    assert (m.prompt, m.position, m.ours, m.reference, m.tie) == (7, 5, None, ref[5], False)
    assert "stops here" in str(m)
    assert identity.classify(target, ids, ref, ref) is None


def test_noise_is_tiny_in_fp32_and_a_rounding_step_in_bf16():
    target = tiny_llama()
    ids = prompt_ids(5, n=24)
    fp32 = identity.logit_noise(target, ids)
    half = identity.logit_noise(copy.deepcopy(target).to(torch.bfloat16), ids)
    logits = lm.forward(target, ids)[0].abs().max().item()
    assert 0 <= fp32 < 1e-4 * logits, fp32
    assert half > 100 * fp32 and half < 0.1 * logits, (half, fp32)  # bf16: 8 bits of mantissa


def test_compare_wants_one_output_per_prompt():
    with pytest.raises(ValueError, match="one output and one reference per prompt"):
        identity.compare(tiny_llama(), [prompt_ids(0)], [[1], [2]], [[1]])


def test_bench_counts_ties_and_bugs():
    """bench.run classifies greedy mismatches; the tables name them."""
    target = tiny_llama()
    prompts = [prompt_ids(s) for s in range(3)]

    def plain(x):
        return generate(target, x, None, max_new_tokens=6).tokens, None

    def short(x):  # drops its last token: a bug on every prompt
        return plain(x)[0][:-1], None

    rows = bench.run(target, {"target only": plain, "same": plain, "short": short}, prompts, warmup=0)
    assert [(r.same, r.ties, r.bugs) for r in rows] == [(3, 0, 0), (3, 0, 0), (0, 0, 3)]
    assert report.format_table(rows).splitlines()[-1].endswith("0/3 (3 BUGS)")
    assert report._identical(dict(identical=51, prompts=52, ties=1, bugs=0)) == "51/52 (1 tie)"
    sampled = bench.run(target, {"target only": plain, "short": short}, prompts, warmup=0, seed=0)
    assert [r.verdicts for r in sampled] == [[], []]  # sampling: no identity to check
