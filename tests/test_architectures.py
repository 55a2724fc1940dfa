"""The architecture matrix (issue 18, item 3): every drafter on small random models of six transformers families.

Families: Llama with grouped-query attention and tied embeddings (SmolLM2's layout), Qwen2 (q/k/v biases), GPT-2
(learned absolute positions, Conv1D), Mistral (every layer a sliding window), Gemma-2 (attention and final logit
soft-capping, sliding and full layers alternating, eager attention only) and Phi-3 (fused qkv and gate/up
projections; a sliding window too, as Phi-3-mini's checkpoints set one). Windows are 16 tokens; every prompt plus
its new tokens, and the tree test's prefix, run past them (the tree test checks that the window matters there).

For each family: a target (3 layers) and a smaller draft of the same family and vocabulary (its first 2 layers:
the target's own weights, so the draft agrees partly and both accepting and rejecting branches run), saved with
`save_pretrained` and loaded back by `zoo.load_pair((target_folder, draft_folder))`, as a learner's own pair would
be (float32 on CPU, each family's default attention: SDPA, eager for Gemma-2).

* Greedy: draft chain, draft tree, prompt lookup and lookahead must emit exactly the target's plain greedy
  decoding (`generate(target, ids, None)`), which itself must equal Hugging Face's `generate`.
* Tree logits: `tree.tree_logits` over a tree after a prefix longer than the window must equal, row by row, the
  last-position logits of an ordinary forward over prefix + that node's path, within TREE_ATOL.
A family the tree path could not support would have to be refused with an error naming it (masks.require_custom_masks);
all six are supported: see lm.new_cache and lm.forward for what sliding windows need (without them Mistral, Phi-3
and Gemma-2 failed: transformers' own errors from sliding cache layers, or a window silently missing from the
tree mask). The last test checks that refusal guards the window: masks that lose it are refused, never used.
"""
import pytest
import torch
from transformers import (Gemma2Config, GPT2Config, LlamaConfig, MistralConfig, Phi3Config, PreTrainedTokenizerFast,
                          Qwen2Config)

from specdec_lab import DraftModelDrafter, PromptLookupDrafter, generate, masks, measure, tree, zoo
from specdec_lab.lookahead import lookahead_generate

VOCAB, WINDOW, NEW = 96, 16, 40
TREE_ATOL = 1e-4  # fp32: a cached tree forward against uncached per-path forwards (seen: below 1e-5)
BUG = 1e-3        # how far logits must move when the window is ignored, for the tree test to be able to fail

_SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
FAMILIES = {
    "llama-gqa-tied": (LlamaConfig, dict(_SMALL, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                                         tie_word_embeddings=True)),  # SmolLM2: 3 query heads per kv head
    "qwen2": (Qwen2Config, _SMALL),
    "gpt2": (GPT2Config, dict(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=256,
                              initializer_range=0.2, bos_token_id=None, eos_token_id=None)),
    "mistral": (MistralConfig, dict(_SMALL, sliding_window=WINDOW)),
    "gemma2": (Gemma2Config, dict(_SMALL, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "phi3": (Phi3Config, dict(_SMALL, sliding_window=WINDOW)),
}
DRAFTERS = ["chain", "tree", "prompt-lookup", "lookahead"]  # and Medusa and EAGLE: HEADS, below


def _layers_key(config_class) -> str:
    return "n_layer" if config_class is GPT2Config else "num_hidden_layers"


def _tokenizer():
    """A word-level tokenizer over the VOCAB ids: load_pair wants one in a folder, and checks the pair shares it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="t0")


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """(family, target, draft) loaded back from save_pretrained folders by zoo.load_pair."""
    from transformers import AutoModelForCausalLM

    family = request.param
    config_class, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(config_class(**kwargs)).eval()
    draft = AutoModelForCausalLM.from_config(config_class(**{**kwargs, _layers_key(config_class): 2})).eval()
    missing, _ = draft.load_state_dict(target.state_dict(), strict=False)  # the target's first 2 layers
    assert not missing, f"{family}: the draft should take every weight from the target, missing {missing}"
    folder = tmp_path_factory.mktemp(family)
    target.save_pretrained(folder / "target")
    draft.save_pretrained(folder / "draft")
    _tokenizer().save_pretrained(folder / "target")
    target, draft, _ = zoo.load_pair((str(folder / "target"), str(folder / "draft")))
    assert type(target).__name__.lower().startswith(family.split("-")[0]), type(target).__name__
    if kwargs.get("tie_word_embeddings"):
        assert target.get_output_embeddings().weight is target.get_input_embeddings().weight, "untied after loading"
    return family, target, draft


def _prompts():
    """Random text (nothing to look up at first) and a repeated phrase (prompt lookup finds it); both with NEW
    tokens run past WINDOW."""
    g = torch.Generator().manual_seed(0)
    phrase = torch.randint(0, VOCAB, (1, 6), generator=g)
    return [torch.randint(0, VOCAB, (1, 10), generator=g), phrase.repeat(1, 3)]


def _decode(name, target, draft, ids):
    if name == "lookahead":
        return lookahead_generate(target, ids, max_new_tokens=NEW)
    drafter = {"chain": lambda: DraftModelDrafter(draft, gamma=3),
               "tree": lambda: DraftModelDrafter(draft, branching=[2, 2, 1]),
               "prompt-lookup": lambda: PromptLookupDrafter()}[name]()
    return generate(target, ids, drafter, max_new_tokens=NEW)


@pytest.fixture(scope="module")
def plain(pair):
    """The target's plain greedy decoding of each prompt: the reference, itself checked against HF's generate."""
    family, target, _ = pair
    refs = []
    for i, ids in enumerate(_prompts()):
        ref = generate(target, ids, None, max_new_tokens=NEW).tokens
        assert ref == measure.hf_generate(target, ids, NEW).tolist(), \
            f"{family}, prompt {i}: plain greedy decoding differs from Hugging Face's generate"
        refs.append(ref)
    return refs


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_identical_to_plain_decoding(pair, plain, drafter):
    family, target, draft = pair
    accepted = 0
    for i, (ids, ref) in enumerate(zip(_prompts(), plain)):
        gen = _decode(drafter, target, draft, ids)
        assert gen.tokens == ref, f"{family}, {drafter}, prompt {i}: greedy output differs from plain greedy decoding"
        accepted += sum(gen.accept_lengths)
    if drafter in ("chain", "tree"):  # the draft is the target's first layers: some of its tokens must get through
        assert accepted > 0, f"{family}, {drafter}: no draft token was ever accepted, so no rollback was tested"


def _path(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


@torch.no_grad()
def _per_path(model, prefix, tokens, parents):
    """[n, V] the last-position logits of an ordinary (uncached, unmasked) forward over prefix + each node's path."""
    rows = []
    for i in range(len(parents)):
        ids = torch.cat([prefix, torch.tensor([[tokens[j] for j in _path(parents, i)]])], 1)
        rows.append(model(input_ids=ids).logits[0, -1].float())
    return torch.stack(rows)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_tree_logits_equal_per_path_logits(pair, role):
    family, target, draft = pair
    model = target if role == "target" else draft
    parents = tree.branching_parents([2, 2, 1])
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, VOCAB, (1, WINDOW + 6), generator=g)  # longer than the window
    tokens = torch.randint(0, VOCAB, (len(parents),), generator=g).tolist()
    got = tree.tree_logits(model, prefix, tokens, parents)  # [n, V]
    want = _per_path(model, prefix, tokens, parents)  # [n, V]
    diff = float((got - want).abs().max())
    print(f"tree_logits {family} {role}: max |diff| = {diff:.2e}")
    assert diff < TREE_ATOL, f"{family} {role}: tree logits differ from per-path logits by {diff:.2e}"
    window = getattr(model.config, "sliding_window", None)
    if window:  # the test can fail: with the window switched off, the per-path logits must move
        model.config.sliding_window = 10 ** 6
        try:
            unwindowed = _per_path(model, prefix, tokens, parents)
        finally:
            model.config.sliding_window = window
        assert float((unwindowed - want).abs().max()) > BUG, f"{family}: the sliding window changes nothing here"


HEADS = ["medusa", "eagle1", "eagle2", "eagle3", "block"]  # eagle2: the EAGLE-1 draft with EAGLE-2's dynamic tree


@pytest.fixture(scope="module")
def trained(pair, tmp_path_factory):
    """{method: folder} of Medusa heads, EAGLE-1, EAGLE-3 and block drafts trained for the pair's target by
    `train_heads.train` (what `specdec-lab train-heads` runs) for a few steps on random text, and saved. (The
    distilled draft model, `--method draft`, copies a Llama-style target's layers: tests/test_train_heads.py.)"""
    from specdec_lab import train_heads

    family, target, _ = pair
    folder = tmp_path_factory.mktemp(f"{family}-heads")
    g = torch.Generator().manual_seed(2)
    (folder / "text").mkdir()
    for i in range(4):  # a corpus of random words of the tokenizer: 4 files, one of them validation
        words = torch.randint(0, VOCAB, (600,), generator=g).tolist()
        (folder / "text" / f"{i}.txt").write_text(" ".join(f"t{w}" for w in words))
    out = {}
    for method in ("medusa", "eagle1", "eagle3", "block"):
        out[method] = folder / method
        card = train_heads.train(target, _tokenizer(), method, out[method], data=folder / "text", steps=20,
                                 windows=16, seq_len=32, progress=False)
        assert card["finished"] and card["target"].endswith("target"), card
    return out


@pytest.mark.parametrize("method", HEADS)
def test_trained_heads_keep_greedy_identity(pair, plain, trained, method):
    """Medusa, EAGLE and the block drafter for a learner's own target (issue 19): trained, saved, loaded back with from_pretrained,
    and exact. On random text a few steps teach the heads little, so most tokens come from the target: what is
    checked is the tree forward, the rollback and the hidden-state plumbing on each architecture."""
    from specdec_lab import EagleDrafter, MedusaDrafter
    from specdec_lab.eagle import BlockDrafter, BlockNet

    family, target, _ = pair
    accepted = 0
    for i, (ids, ref) in enumerate(zip(_prompts(), plain)):
        if method == "medusa":
            drafter = MedusaDrafter.from_pretrained(target, trained["medusa"])
        elif method == "block":
            drafter = BlockDrafter(BlockNet.from_pretrained(target, trained["block"]), gamma=4)
        else:
            folder = trained["eagle3" if method == "eagle3" else "eagle1"]
            drafter = EagleDrafter.from_pretrained(target, folder, dynamic=method == "eagle2")
        gen = generate(target, ids, drafter, max_new_tokens=NEW)
        assert gen.tokens == ref, f"{family}, {method}, prompt {i}: greedy output differs from plain greedy decoding"
        accepted += sum(gen.accept_lengths)
    if method == "medusa":  # its own LM heads start as the target's: seen 7 to 62 tokens accepted per family here
        assert accepted > 0, f"{family}, medusa: no head token was ever accepted, so no rollback was tested"


def test_a_window_the_custom_masks_miss_is_refused(monkeypatch):
    """The guard behind the sliding-window support: were our masks to lose the window (as in an older or newer
    transformers whose model builds it some other way), tree drafts and lookahead must be refused with an error
    naming the architecture and the reason, never run with the window silently dropped."""
    config_class, kwargs = FAMILIES["mistral"]
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config_class(**kwargs)).eval()
    assert masks.custom_mask_problem(model) is None
    build = masks.attention_mask_4d
    monkeypatch.setattr(masks, "attention_mask_4d", lambda *args, window=None, **kw: build(*args, **kw))
    monkeypatch.setattr(masks, "_MASK_PROBES", {})  # probe again, with the window gone from our masks
    with pytest.raises(NotImplementedError, match="MistralForCausalLM cannot run tree drafts.*sliding-window layers"):
        DraftModelDrafter(model, branching=[2, 2, 1]).start(model, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(NotImplementedError, match="MistralForCausalLM cannot run lookahead decoding.*sliding-window"):
        lookahead_generate(model, torch.zeros(1, 4, dtype=torch.long), max_new_tokens=4)
    assert generate(model, torch.zeros(1, 4, dtype=torch.long), DraftModelDrafter(model, gamma=3),
                    max_new_tokens=4).tokens, "a chain needs no custom mask and must still run"
