"""Tests for the model adapter (specdec_lab/lm.py): cache, crop, tree mask, gather, hidden states.

Every test runs on a tiny random Llama (RoPE, grouped-query attention) and a tiny random GPT-2 (learned
positions), each with eager and SDPA attention, in fp32. Cached and uncached forwards take different
kernels/shapes, so they agree to rounding only: ATOL/RTOL below. A real bug (wrong position, stale or
missing KV entry, mask ignored) moves logits by far more than that (see the negative checks, > BUG).
"""
import logging
import warnings

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from specdec_lab import lm

ATOL, RTOL = 1e-5, 1e-4   # fp32 rounding between cached/uncached and batched/unbatched paths
BUG = 1e-3                # a deliberately wrong position or mask must move logits by more than this
VOCAB = 97


def _config(arch: str):
    if arch == "llama":
        return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                           initializer_range=0.2)
    return GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.2, bos_token_id=0, eos_token_id=0,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


@pytest.fixture(scope="module", params=[(a, i) for a in ("llama", "gpt2") for i in ("eager", "sdpa")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def model(request):
    arch, impl = request.param
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(_config(arch), attn_implementation=impl).float().eval()
    assert m.config._attn_implementation == impl
    return m


def _ids(*shape, seed=1):
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


# -------------------------------------------------------------- tree helpers (the real ones live in tree.py)
def tree_mask(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: node i may attend to node j iff j is i or an ancestor of i (parents come first)."""
    n = len(parents)
    m = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            m[i] |= m[p]
    return m


def tree_depths(parents: list[int]) -> torch.Tensor:
    d = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return torch.tensor(d)                                               # [n]


def tree_path(parents: list[int], i: int) -> list[int]:
    """Nodes from the root down to i."""
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


PARENTS = [-1, 0, 0, 1, 1, 2]          # node 0 is the child of the last prefix token


# ------------------------------------------------------------------------------------------------ tests
@torch.no_grad()
def test_cached_forward_equals_uncached(model):
    ids = _ids(2, 13)                                                    # [B=2, T]
    full = lm.forward(model, ids)                                        # [2, 13, V] uncached
    assert full.dtype == torch.float32 and full.shape == (2, 13, VOCAB)
    cache = lm.new_cache(model)
    parts = []
    for a, b in [(0, 5), (5, 8), (8, 10), (10, 11), (11, 12), (12, 13)]:   # prefix, chunks, single tokens
        parts.append(lm.forward(model, ids[:, a:b], cache))
        assert lm.cache_len(cache) == b, "cache must grow by exactly the number of tokens fed"
    assert_close(torch.cat(parts, 1), full, atol=ATOL, rtol=RTOL,
                 msg="cached forward differs from uncached: check the cache keyword and default positions")


@torch.no_grad()
def test_explicit_positions_cached_equals_uncached(model):
    """Positions with a gap (as after skipping a slot) mean the same with or without a cache; uncached,
    transformers 5.x would otherwise read the gap as a boundary between packed sequences."""
    ids, pos = _ids(1, 6), torch.tensor([0, 1, 2, 4, 5, 6])
    full = lm.forward(model, ids, positions=pos)                         # [1, 6, V]
    cache = lm.new_cache(model)
    parts = [lm.forward(model, ids[:, :3], cache, positions=pos[:3]),
             lm.forward(model, ids[:, 3:], cache, positions=pos[3:])]
    assert_close(torch.cat(parts, 1), full, atol=ATOL, rtol=RTOL,
                 msg="explicit positions: uncached differs from cached; pass an explicit causal 4D mask")


@torch.no_grad()
def test_crop_then_refeed_equals_uncached(model):
    ids, other = _ids(1, 12), _ids(1, 4, seed=2)
    cache = lm.new_cache(model)
    lm.forward(model, ids, cache)
    lm.crop(cache, 20)
    assert lm.cache_len(cache) == 12, "crop to a length >= cache_len must be a no-op"
    lm.crop(cache, 8)
    assert lm.cache_len(cache) == 8, "crop(cache, L) must keep exactly L positions"
    got = lm.forward(model, other, cache)                                # [1, 4, V]
    want = lm.forward(model, torch.cat([ids[:, :8], other], 1))[:, 8:]   # [1, 4, V]
    assert_close(got, want, atol=ATOL, rtol=RTOL,
                 msg="crop then re-feed differs from uncached: crop must keep the FIRST L positions")


def _tree_forward(model, prefix, tokens, parents, positions="depth", mask="tree"):
    cache = lm.new_cache(model)
    lm.forward(model, prefix, cache)
    P = prefix.shape[1]
    pos = P + tree_depths(parents) if positions == "depth" else None    # [n]
    m = tree_mask(parents) if mask == "tree" else None                   # [n, n]
    if mask == "causal":
        m = torch.ones(len(parents), len(parents), dtype=torch.bool).tril()
    return lm.forward(model, tokens, cache, positions=pos, mask=m), cache   # [1, n, V]


@torch.no_grad()
def test_tree_mask_logits_equal_per_path_logits(model):
    prefix, tokens = _ids(1, 7), _ids(1, len(PARENTS), seed=3)           # [1, P], [1, n]
    got, cache = _tree_forward(model, prefix, tokens, PARENTS)          # [1, n, V]
    assert lm.cache_len(cache) == 7 + len(PARENTS)
    want = torch.stack([lm.forward(model, torch.cat([prefix, tokens[:, tree_path(PARENTS, i)]], 1))[0, -1]
                        for i in range(len(PARENTS))])                  # [n, V]: each path run alone
    assert_close(got[0], want, atol=ATOL, rtol=RTOL,
                 msg="tree logits differ from per-path logits: positions must be prefix_len + depth and "
                     "the 4D mask must be ancestors-plus-self, in the additive form eager/SDPA honour")
    # The test can fail: a plain causal mask, or consecutive positions, must change some node's logits.
    wrong_mask, _ = _tree_forward(model, prefix, tokens, PARENTS, mask="causal")
    wrong_pos, _ = _tree_forward(model, prefix, tokens, PARENTS, positions="consecutive")
    assert (wrong_mask[0] - want).abs().max() > BUG, "a causal mask over the tree went unnoticed"
    assert (wrong_pos[0] - want).abs().max() > BUG, "consecutive positions over the tree went unnoticed"


@torch.no_grad()
def test_gather_accepted_path_then_next_token(model):
    prefix, tokens, nxt = _ids(1, 7), _ids(1, len(PARENTS), seed=3), _ids(1, 1, seed=4)
    _, cache = _tree_forward(model, prefix, tokens, PARENTS)
    path = tree_path(PARENTS, 4)                                         # accepted nodes [0, 1, 4]
    P = prefix.shape[1]
    lm.gather(cache, list(range(P)) + [P + i for i in path])             # prefix + accepted path
    assert lm.cache_len(cache) == P + len(path), "gather must keep exactly the given positions"
    got = lm.forward(model, nxt, cache)                                  # [1, 1, V]
    want = lm.forward(model, torch.cat([prefix, tokens[:, path], nxt], 1))[:, -1:]
    assert_close(got, want, atol=ATOL, rtol=RTOL,
                 msg="after gather, the next token's logits differ from uncached: gather must select the "
                     "indices along the sequence axis (-2) of every layer's keys AND values")


@torch.no_grad()
def test_hidden_states_match_hf(model):
    ids = _ids(1, 9)
    logits, hidden = lm.forward(model, ids, hidden=True)
    ref = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(hidden) == model.config.num_hidden_layers + 1, "expected embeddings + one state per layer"
    for i, (h, r) in enumerate(zip(hidden, ref)):
        assert_close(h, r, atol=ATOL, rtol=RTOL, msg=f"hidden state {i} differs from HF's")
    assert_close(model.get_output_embeddings()(hidden[-1]).float(), logits, atol=ATOL, rtol=RTOL,
                 msg="hidden[-1] must be the final normed state that the LM head reads")
    # Cached: hidden states of the new tokens equal the matching slice of the uncached run.
    cache = lm.new_cache(model)
    lm.forward(model, ids[:, :5], cache)
    _, tail = lm.forward(model, ids[:, 5:], cache, hidden=True)
    for i, (h, r) in enumerate(zip(tail, ref)):
        assert_close(h, r[:, 5:], atol=ATOL, rtol=RTOL, msg=f"cached hidden state {i} differs from uncached")


@torch.no_grad()
def test_normal_use_emits_no_warnings(model):
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            prefix, tokens = _ids(1, 5), _ids(1, len(PARENTS), seed=3)
            _tree_forward(model, prefix, tokens, PARENTS)
            cache = lm.new_cache(model)
            lm.forward(model, prefix, cache, hidden=True)
            lm.crop(cache, 3)
            lm.gather(cache, [0, 2])
            lm.forward(model, tokens[:, :1], cache)
    finally:
        hf_logger.removeHandler(handler)
    assert not records, f"transformers logged warnings: {[r.getMessage() for r in records]}"
