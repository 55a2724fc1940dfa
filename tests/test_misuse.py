"""Misuse gets a clear answer; contexts at their limit stay exact.

* Habits from Hugging Face and slips of the hand: each must raise ONE error whose message names the
  argument and says what to pass instead (pytest.raises(..., match=...) checks the words a learner reads).
  Every module's bad input lives here: prompts, drafters, sampling settings, and the other calls (BAD_CALLS:
  mismatched models, saved drafts, the batched loop).
* Context limits: at prompt + max_new_tokens == the target's context, every drafter must reproduce plain
  greedy decoding and no model may be asked for a position past its table, for a learned-position model
  (GPT-2, which would fail with IndexError) and a rotary one (Llama). A draft with a shorter context drafts
  less near its end instead of failing.
* Architectures that ignore or choke on custom 4D masks (Bloom's ALiBi) are refused for trees and lookahead,
  naming the architecture; chains and prompt lookup keep working there.

Tiny randomly initialised models built from configs, fp32 on CPU: the whole file runs in seconds.
"""
import re

import pytest
import torch
from transformers import (BatchEncoding, BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM)

from specdec_lab import (DraftModelDrafter, EagleDrafter, MedusaDrafter, PromptLookupDrafter, generate, lm,
                         lookahead_generate, masks)
from specdec_lab.checks import ArgumentError
from specdec_lab.decoding import generate_naive
from specdec_lab.drafters import Drafter
from specdec_lab.eagle import BlockDrafter, BlockNet, EagleNet
from specdec_lab.medusa import MedusaHeads
from specdec_lab.sampling import Warp
from specdec_lab.serving import generate_batch
from specdec_lab.tree import DraftTree

VOCAB, CONTEXT = 100, 64


def _gpt2(context=CONTEXT, seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=context, n_embd=32, n_layer=2, n_head=2,
                                      initializer_range=0.2, bos_token_id=None, eos_token_id=None)).eval()


def _llama(context=CONTEXT, seed=0, vocab=VOCAB, hidden=32):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                                        initializer_range=0.2, bos_token_id=None, eos_token_id=None,
                                        pad_token_id=None)).eval()


def _ids(n, seed=0):
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama():
    return _llama()


# ---- the prompt -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt, words", [
    ("def add(a, b):", re.escape("tokenize first: tok(text, return_tensors='pt').input_ids")),
    (BatchEncoding({"input_ids": torch.tensor([[1, 2]]), "attention_mask": torch.ones(1, 2)}), r"pass its \.input_ids"),
    ({"input_ids": torch.tensor([[1, 2]])}, r"pass its \.input_ids"),
    (torch.zeros(1, 0, dtype=torch.long), "prompt is empty: pass at least one token id"),
    ([], "prompt is empty"),
    (torch.zeros(2, 4, dtype=torch.long), "batch size 1.*loop over the rows"),
    (torch.zeros(1, 4), "input_ids must be token ids"),
    (torch.tensor([[1, VOCAB]]), "outside the target's vocabulary"),
])
def test_bad_prompts_say_what_to_pass(llama, prompt, words):
    for run in (lambda: generate(llama, prompt, max_new_tokens=4), lambda: lookahead_generate(llama, prompt, 4)):
        with pytest.raises(ValueError, match=words):
            run()


def test_a_1d_prompt_is_one_sequence(llama):
    ids = _ids(8)
    assert generate(llama, ids[0], max_new_tokens=6).tokens == generate(llama, ids, max_new_tokens=6).tokens
    assert lookahead_generate(llama, ids[0], 6).tokens == generate(llama, ids, max_new_tokens=6).tokens
    assert generate_batch(llama, ids.expand(2, -1), max_new_tokens=6).tokens[1] == \
        generate(llama, ids, max_new_tokens=6).tokens, "to generate_batch a [B, T] tensor is B prompts"


def test_swapped_arguments_name_the_order(llama):
    with pytest.raises(ValueError, match=r"target must be a causal LM .*got a torch.int64 tensor of shape \[1, 8\]"):
        generate(_ids(8), llama)
    with pytest.raises(ValueError, match=r"the order is generate\(target, input_ids"):
        generate(llama, llama)


# ---- the drafter ------------------------------------------------------------------------------------------------


def test_a_model_or_a_class_as_drafter(llama):
    ids = _ids(8)
    with pytest.raises(TypeError, match=re.escape("wrap the draft model: DraftModelDrafter(draft)")):
        generate(llama, ids, _llama(seed=1), max_new_tokens=4)
    with pytest.raises(TypeError, match=re.escape("drafter=DraftModelDrafter is a class: instantiate it: "
                                                  "DraftModelDrafter(draft)")):
        generate(llama, ids, DraftModelDrafter, max_new_tokens=4)
    with pytest.raises(TypeError, match=re.escape("instantiate it: PromptLookupDrafter()")):
        generate(llama, ids, PromptLookupDrafter, max_new_tokens=4)
    with pytest.raises(TypeError, match=re.escape("MedusaDrafter(heads)")):
        generate(llama, ids, MedusaHeads.for_target(llama), max_new_tokens=4)
    with pytest.raises(TypeError, match="drafter must be None or a drafter"):
        generate(llama, ids, "assistant", max_new_tokens=4)


@pytest.mark.parametrize("make, words", [
    (lambda m: DraftModelDrafter(m, gamma=0), "gamma .*must be an int >= 1, got 0; for plain decoding pass drafter="),
    (lambda m: DraftModelDrafter(m, gamma=-2), "gamma .*>= 1, got -2"),
    (lambda m: DraftModelDrafter(m, gamma=2.5), "gamma .*must be an int >= 1, got 2.5"),
    (lambda m: DraftModelDrafter(m, branching=[]), r"branching must be a non-empty list of ints >= 1"),
    (lambda m: DraftModelDrafter(m, branching=[2, 0]), r"branching must be .* got \[2, 0\]"),
    (lambda m: DraftModelDrafter(m, branching=[2.0, 1]), r"branching must be .* got \[2\.0, 1\]"),
    (lambda m: DraftModelDrafter(m, gamma=3, branching=[2, 2]), "disagree"),
    (lambda m: DraftModelDrafter("gpt2"), "draft must be a causal LM .*from_pretrained"),
    (lambda m: PromptLookupDrafter(num_tokens=0), "num_tokens .*>= 1"),
    (lambda m: PromptLookupDrafter(max_ngram=1.5), "max_ngram .*>= 1, got 1.5"),
    (lambda m: MedusaDrafter(MedusaHeads.for_target(m), choices=[]), r"choices must be a non-empty list of paths"),
    (lambda m: MedusaDrafter(MedusaHeads.for_target(m), choices=[(0,), (-1,)]), r"choices must be .*ints >= 0"),
    (lambda m: MedusaDrafter(MedusaHeads.for_target(m, 2), choices=[(0,), (0, 0), (0, 0, 0)]),
     "3 deep but there are only 2 heads"),
    (lambda m: MedusaDrafter(MedusaHeads.for_target(m), typical=(0.09, 0.3)),
     r"typical=\(0\.09, 0\.3\) is a rule of the verifier, not of the drafter: pass it to generate\("),
    (lambda m: MedusaDrafter(m), r"heads must be a MedusaHeads, got a LlamaForCausalLM: MedusaDrafter\.from_zoo"),
    (lambda m: MedusaDrafter.from_zoo((m, m, None)), r"target must be a causal LM .*load_pair"),
    (lambda m: EagleDrafter(m), r"net must be an EagleNet, got a LlamaForCausalLM: EagleDrafter\.from_zoo"),
    (lambda m: EagleDrafter(EagleNet(m), branching=[0]), "branching must be"),
    (lambda m: EagleDrafter(EagleNet(m), dynamic=True, topk=0), "topk .*>= 1"),
    (lambda m: EagleDrafter(EagleNet(m), dynamic=True, budget=2.5), "budget .*>= 1, got 2.5"),
    (lambda m: EagleDrafter.from_zoo(m, version=2), "version must be 1 .* or 3"),
    (lambda m: BlockDrafter(EagleNet(m)), r"net must be a BlockNet, got an EagleNet"),
    (lambda m: BlockDrafter(BlockNet(m, depths=3), gamma=5), r"gamma must be at most 4: .*placeholders for 4 tokens"),
])
def test_bad_drafter_settings(llama, make, words):
    with pytest.raises(ValueError, match=words):
        make(llama)


# ---- sampling and stopping settings --------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, words", [
    (dict(top_k=2.5), r"top_k .*must be an int >= 1, got 2\.5; None switches top-k off"),
    (dict(top_k=0), r"top_k .*>= 1, got 0; None switches top-k off \(Hugging Face's top_k=0\)"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\] or None"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(temperature=float("nan")), "temperature must be >= 0"),
    (dict(temperature="0.7"), "temperature must be >= 0 .* got '0.7'"),
    (dict(temperature=1e-45), r"temperature=1e-45 is too small .* pass temperature=0 for greedy decoding"),
    (dict(eos_token_id="0"), r"eos_token_id must be a token id .* got '0': pass tok\.eos_token_id"),
    (dict(eos_token_id=[2, None]), "eos_token_id must be a token id"),
    (dict(eos_token_id=-1), "eos_token_id must be a token id"),
    (dict(max_new_tokens=-1), r"max_new_tokens \(tokens to generate\) must be an int >= 0, got -1"),
    (dict(max_new_tokens=2.5), r"max_new_tokens .*must be an int >= 0, got 2\.5"),
    (dict(max_new_tokens=CONTEXT), f"exceed the target's context of {CONTEXT}: ask for at most {CONTEXT - 8} new"),
    (dict(generator=0), "generator must be a torch.Generator"),
    (dict(typical=0.09), r"typical must be None .* \(threshold, alpha\)"),
])
def test_bad_sampling_settings(llama, kwargs, words):
    with pytest.raises(ValueError, match=words):
        generate(llama, _ids(8), **{"max_new_tokens": 4, **kwargs})


def test_warp_and_lookahead_use_the_same_checks(llama):
    with pytest.raises(ValueError, match=r"top_k .*got 2\.5"):
        Warp(temperature=1.0, top_k=2.5)
    with pytest.raises(ValueError, match="temperature=1e-45 is too small"):
        Warp(temperature=1e-45)
    with pytest.raises(ValueError, match="eos_token_id must be a token id .* got '0'"):
        lookahead_generate(llama, _ids(8), 4, eos_token_id="0")
    with pytest.raises(ValueError, match=r"gamma .*>= 1, got 0"):
        generate_naive(llama, llama, _ids(8), gamma=0)
    assert generate(llama, [3, 4, 5], max_new_tokens=0).tokens == []  # zero new tokens is a valid request


# ---- the other calls: mismatched models, saved drafts, the batched loop -------------------------------------


class _Stateful(Drafter):
    """State per sequence (its own start) and no batch members: generate_batch cannot run it."""

    def start(self, target, ids):
        self.steps = 0

    def propose(self, ids, warp, limit):
        return DraftTree.chain([])


class _Duck:
    """The protocol's four members, duck-typed, without the batch members."""

    needs_hidden = False
    start, commit, propose = Drafter.start, Drafter.commit, _Stateful.propose


def _saved_net(folder):
    """An EAGLE-1 net for the misuse Llama, saved where EagleNet.from_zoo(root=folder) looks; it loads back."""
    EagleNet(_llama(), 1).save(folder / "eagle1")
    loaded = EagleNet.from_zoo(_llama(), 1, root=folder)
    assert loaded.version == 1 and loaded.fc.weight.dtype == torch.float32
    return folder


OK = [[1, 2, 3], [4, 5]]  # two prompts for generate_batch


def _batch(m, prompts, drafter=None, **kwargs):
    return generate_batch(m, prompts, drafter, max_new_tokens=4, **kwargs)

BAD_CALLS = [  # (a call on the misuse Llama m and a fresh folder, the error it raises, words of its message)
    (lambda m, tmp: generate(m, _ids(8), DraftModelDrafter(_llama(vocab=VOCAB + 4)), max_new_tokens=5), ValueError,
     "different vocabularies .* use a draft trained with the target's tokenizer"),
    (lambda m, tmp: generate(m, torch.zeros(1, CONTEXT + 1, dtype=torch.long), max_new_tokens=1), ValueError,
     f"more than the target's context of {CONTEXT}: keep its last {CONTEXT - 1}"),
    (lambda m, tmp: generate(m, _ids(8), max_new_tokens=1, temperature=1.0, top_p=0.0), ValueError, "top_p must be in"),
    (lambda m, tmp: EagleNet(m, 2), ValueError, "version"),
    (lambda m, tmp: EagleDrafter(EagleNet(m, 1), branching=[2, 1], dynamic=True), ValueError, "dynamic"),
    (lambda m, tmp: EagleNet.from_zoo(m, 1, root=tmp), FileNotFoundError, "train-zoo --stage eagle"),
    (lambda m, tmp: generate(_llama(hidden=64), _ids(8), EagleDrafter(EagleNet(m, 1)), max_new_tokens=4), ValueError,
     "hidden size"),
    (lambda m, tmp: EagleNet.from_zoo(_llama(hidden=64), 1, root=_saved_net(tmp)), ValueError, "hidden"),
    (lambda m, tmp: _batch(m, OK, DraftModelDrafter(m, branching=[2, 1])), ArgumentError, "chains only"),
    (lambda m, tmp: _batch(m, "def f(x):", DraftModelDrafter(m)), ArgumentError, "list of prompts"),
    (lambda m, tmp: _batch(m, [], None), ArgumentError, "list of prompts"),
    (lambda m, tmp: _batch(m, ["def f(x):", "import os"], None), ArgumentError, "text"),
    (lambda m, tmp: _batch(m, [[1, 2], []], None), ArgumentError, "empty"),
    (lambda m, tmp: _batch(m, OK, DraftModelDrafter(m), gamma=[1, 2, 3]), ArgumentError, "one per prompt"),
    (lambda m, tmp: _batch(m, OK, None, gamma=2), ArgumentError, "without a drafter"),
    (lambda m, tmp: _batch(m, OK, _llama(seed=1)), ArgumentError, "DraftModelDrafter"),  # HF's habit
    (lambda m, tmp: _batch(m, OK, _Stateful()), ArgumentError, "keeps state per sequence"),
    (lambda m, tmp: _batch(m, OK, _Duck()), ArgumentError, "lacks the batch members"),
]


@pytest.mark.parametrize("call, error, words", BAD_CALLS, ids=[words for _, _, words in BAD_CALLS])
def test_bad_input_errors(llama, tmp_path, call, error, words):
    with pytest.raises(error, match=words):
        call(llama, tmp_path)


# ---- context limits --------------------------------------------------------------------------------------------


class MaxPosition:
    """Records the largest position a model is asked to read: explicit position_ids, else cache + n - 1."""

    def __init__(self, model):
        self.seen = -1
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if kwargs.get("position_ids") is not None:
            top = int(kwargs["position_ids"].max())
        else:
            top = lm.cache_len(kwargs.get("past_key_values", kwargs.get("cache"))) + ids.shape[1] - 1
        self.seen = max(self.seen, top)


METHODS = {
    "chain": lambda draft: DraftModelDrafter(draft, gamma=4),
    "tree": lambda draft: DraftModelDrafter(draft, branching=[2, 2, 1]),
    "prompt lookup": lambda draft: PromptLookupDrafter(num_tokens=6, max_ngram=2),
    "lookahead": None,
}


def _run(method, target, draft, ids, n):
    if method == "lookahead":
        return lookahead_generate(target, ids, n, window=5, ngram=4, guesses=4)
    return generate(target, ids, METHODS[method](draft), max_new_tokens=n)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("prompt", [1, 40])
def test_exact_context_limit(arch, method, prompt):
    """prompt + max_new_tokens == the target's context: the greedy text, no position past the table."""
    make = _gpt2 if arch == "gpt2" else _llama
    target, draft = make(), make(seed=1)
    seen_target, seen_draft = MaxPosition(target), MaxPosition(draft)
    ids, n = _ids(prompt, seed=prompt), CONTEXT - prompt
    want = generate(target, ids, max_new_tokens=n).tokens
    assert _run(method, target, draft, ids, n).tokens == want, f"{arch} {method} differs from greedy decoding"
    assert CONTEXT - 2 <= seen_target.seen <= CONTEXT - 1 and seen_draft.seen <= CONTEXT - 1
    with pytest.raises(ValueError, match=f"exceed the target's context of {CONTEXT}: ask for at most {n} new"):
        _run(method, target, draft, ids, n + 1)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["chain", "tree", "naive"])
def test_a_shorter_draft_drafts_less_near_its_end(arch, method):
    make = _gpt2 if arch == "gpt2" else _llama
    target, draft = make(), make(context=32, seed=2)
    seen = MaxPosition(draft)
    ids = _ids(20, seed=3)
    want = generate(target, ids, max_new_tokens=CONTEXT - 20).tokens
    if method == "naive":
        gen = generate_naive(target, draft, ids, gamma=4, max_new_tokens=CONTEXT - 20)
    else:
        gen = generate(target, ids, METHODS[method](draft), max_new_tokens=CONTEXT - 20)
    assert gen.tokens == want
    assert 28 <= seen.seen <= 31, "the draft must read close to the end of its table, and never past it"
    assert gen.draft_lengths[-1] == 0 and max(gen.draft_lengths) > 1  # drafted early on, then stopped
    with pytest.raises(ValueError, match="more than the draft's context of 32: shorten it"):
        generate(target, _ids(33), METHODS["chain"](draft), max_new_tokens=4)


# ---- architectures that cannot take a custom 4D mask ---------------------------------------------------------


def test_alibi_models_refuse_trees_and_lookahead_but_run_chains():
    torch.manual_seed(0)
    bloom = BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2)).eval()
    ids = _ids(12)
    want = generate(bloom, ids, max_new_tokens=16).tokens
    assert generate(bloom, ids, DraftModelDrafter(bloom, gamma=3), max_new_tokens=16).tokens == want
    assert generate(bloom, ids, PromptLookupDrafter(), max_new_tokens=16).tokens == want
    words = "BloomForCausalLM cannot run {}: custom 4D attention masks are needed, and it fails on them"
    with pytest.raises(NotImplementedError, match=words.format("tree drafts")):
        generate(bloom, ids, DraftModelDrafter(bloom, branching=[2, 2]), max_new_tokens=16)
    with pytest.raises(NotImplementedError, match=words.format("lookahead decoding")):
        lookahead_generate(bloom, ids, 16)
    assert masks.custom_mask_problem(_llama()) is None and masks.custom_mask_problem(_gpt2()) is None
