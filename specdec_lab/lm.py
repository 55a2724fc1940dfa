"""A thin adapter over Hugging Face causal LMs: cached forward with positions, a 4D mask and hidden states;
KV-cache crop and gather.

The cache invariant used throughout the course: the cache holds every committed token EXCEPT the last one,
which is the next token fed to the model. After verification we `crop` (chain) or `gather` (tree) the cache
back to the committed prefix (`keep`), so cache_len(cache) == len(committed) - 1 before every forward.

This is the only module that knows about transformers versions for the course's own decoders (tests pass on
4.53 to 5.24; Hugging Face's own generate, the baseline, is driven by `measure.hf_generate`):
  * forward keyword: `cache=` from late 5.2x (`past_key_values=` then warns), `past_key_values=` before
    (4.x and 5.0 to 5.20): read from the model's own forward signature;
  * `Cache.crop`: 4.x and early 5.x take an absolute length or a negative count; from about 5.15 a positive
    value warns, by 5.20 it raises: we always pass the negative count of positions to remove;
  * per-layer tensors: >= 4.54 `cache.layers[i].keys/.values`, older `cache.key_cache[i]/.value_cache[i]`;
  * `DynamicCache(config=...)` exists from 4.56 (it picks sliding/hybrid layer types); `new_cache` turns its
    sliding-window layers into full ones (see below);
  * `from_pretrained(dtype=...)` from 4.56; `torch_dtype=` before (and deprecated after);
  * rotary settings: 5.x reads `rope_parameters`, 4.x `rope_theta` and `rope_scaling` (`rope`).
Custom attention masks (trees, lookahead's window, a ragged batch) are built by `masks`, which also probes
whether a model honours them. Sliding windows (Mistral, Phi-3, Gemma-2, Qwen2): the window lives in those masks,
and the cache keeps EVERY position in every layer (`new_cache`): HF's sliding cache layers keep only the last
window - 1 positions, so a cache index is no longer a position, `gather` cannot pick positions, and `crop`
raises once the window is full.
"""
from __future__ import annotations

import inspect

import torch
import transformers
from transformers import DynamicCache

try:  # >= 4.54: a cache is a list of layers, and sliding-window layers keep only the window
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
except ImportError:
    DynamicLayer = DynamicSlidingWindowLayer = None

from specdec_lab import checks
from specdec_lab.masks import custom_masks, require_custom_masks

__all__ = ["new_cache", "append", "cache_len", "forward", "keep", "crop", "gather", "gather_rows", "dtype_kwargs",
           "context_length", "rope", "kv", "saved_by"]


def _version() -> tuple[int, int]:
    """The installed transformers' (major, minor), read at each call."""
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return major, minor


def saved_by() -> str:
    """A folder name for what this transformers' `save_pretrained` writes, "transformers-5": a tokenizer saved by
    5.x names a class 4.x lacks (TokenizersBackend), so a converted model is kept once per major version."""
    return f"transformers-{_version()[0]}"


def dtype_kwargs(dtype: torch.dtype) -> dict:
    """The keyword that sets the weights' dtype in `from_pretrained`: `dtype` from 4.56, `torch_dtype` before."""
    return {"dtype": dtype} if _version() >= (4, 56) else {"torch_dtype": dtype}


def context_length(model) -> int | None:
    """The longest sequence `model` was built for (its position table), or None if its config does not say."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def rope(config) -> dict | None:
    """The rotary positions a config's model runs with, {"rope_type", "rope_theta", scaling...}, written alike by
    every version (None: no rotary positions, as in GPT-2): 5.x reads them from `rope_parameters`, 4.x from
    `rope_theta` and `rope_scaling` (and keeps a `rope_parameters` key it finds in a 5.x file unread)."""
    if _version()[0] >= 5:
        found = dict(getattr(config, "rope_parameters", None) or {})
    else:
        found = {**(getattr(config, "rope_scaling", None) or {}), "rope_theta": getattr(config, "rope_theta", None)}
    found = {("rope_type" if k == "type" else k): v for k, v in found.items() if v is not None}
    return ({"rope_type": "default"} | found if "rope_theta" in found else found) or None


def _cache_keyword(model) -> str:
    """'cache' on late 5.2x, 'past_key_values' before (read from the model's own forward signature)."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model=None) -> DynamicCache:
    """An empty KV cache for `model` (None: a plain one, for a layer written by hand such as EAGLE's draft).

    Every attention layer keeps every position, sliding-window layers included (see the module's docstring):
    the window lives in the masks, so crop and gather index absolute positions in every layer.
    """
    if model is not None and "config" in inspect.signature(DynamicCache.__init__).parameters:  # >= 4.56
        cache = DynamicCache(config=model.config)
        if DynamicSlidingWindowLayer is None:  # no per-layer classes in this version: nothing to replace
            return cache
        for i, layer in enumerate(getattr(cache, "layers", [])):
            if type(layer) is DynamicSlidingWindowLayer:  # keeps only window - 1 positions: keep them all
                cache.layers[i] = DynamicLayer()
        return cache
    return DynamicCache()


def append(cache, keys: torch.Tensor, values: torch.Tensor, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Add keys/values [B, heads, n, d] to one layer of `cache`; returns all of that layer's [B, heads, L + n, d]."""
    return cache.update(keys, values, layer)


def kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's cached (keys, values), each [B, heads, L, d]: to look at a cache, in either layout."""
    if hasattr(cache, "layers"):                                   # >= 4.54
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))           # 4.53


def cache_len(cache) -> int:
    """Number of positions held in the cache (0 for None)."""
    return 0 if cache is None else int(cache.get_seq_length())


def forward(model, ids: torch.Tensor, cache=None, positions: torch.Tensor | None = None,
            mask: torch.Tensor | None = None, hidden: bool = False, last: int | None = None):
    """Run `model` on new tokens `ids` [B, n], extending `cache` in place (None: plain uncached forward).

    positions: absolute position ids [n] or [B, n]; default cache_len(cache) + arange(n).
    mask: bool [n, n] or [B, n, n], True = new token i may attend to new token j (e.g. a tree mask);
          the cached prefix is always visible. Or [(B,) n, past + n] to mask cached positions too.
          None with default positions = ordinary causal attention.
    last: compute only the last `last` positions' logits: the LM head runs on those only (`logits_to_keep`, in every
          supported version), so reading a long prompt does not pay for a [T, V] product whose rows nobody looks
          at, as `generate()` does in its prefill; models without `logits_to_keep` slice the full logits.
    Returns logits [B, n, V] (or [B, last, V]) as float32; with hidden=True, (logits, hidden_states) where
    hidden_states is HF's tuple of num_layers + 1 tensors [B, n, H]: [0] = input to the first layer (embeddings),
    [i] = output of layer i, [-1] = output of the last layer AFTER the final norm (what the LM head reads).
    Call under torch.no_grad() for inference.
    """
    B, n = ids.shape
    past = cache_len(cache)
    kwargs = {}
    if positions is not None:
        positions = torch.as_tensor(positions, device=ids.device).reshape(-1, n).expand(B, n)  # [B, n]
        kwargs["position_ids"] = positions
    if mask is not None or positions is not None:
        # Explicit positions get an explicit mask too: without one, 5.x reads non-consecutive position ids
        # of an uncached call as packed sequences and masks across them.
        require_custom_masks(model)
        kwargs["attention_mask"] = custom_masks(model, mask, B, past, n, ids.device)  # [B,1,n,past+n] or a dict
    if cache is not None:
        kwargs[_keywords(model)[1]] = cache
    if last is not None and _keywords(model)[0]:
        kwargs["logits_to_keep"] = last
    out = model(input_ids=ids, use_cache=cache is not None, output_hidden_states=hidden, **kwargs)
    logits = out.logits.float() if last is None else out.logits[:, -last:].float()      # [B, n or last, V]
    return (logits, tuple(out.hidden_states)) if hidden else logits


def crop(cache, length: int) -> None:
    """Keep the first `length` cached positions (no-op if length >= cache_len)."""
    remove = cache_len(cache) - length
    if remove > 0:
        cache.crop(-remove)      # a negative count: required by 5.20+, accepted since 4.x


def keep(cache, base: int, nodes=()) -> None:
    """THE rollback: keep the cache's first `base` positions, then the K/V of the drafted `nodes` (ascending).

    After a forward over a draft, node j's K/V sits at position base + j (base = the committed length it was
    drafted after). A chain's accepted drafts are a prefix (0, 1, .., m - 1): a crop. A tree's accepted path
    is not: its few K/V rows move, in place, to the slots right after the committed text, then a crop (the same
    result as `gather` of the base positions and the nodes, without copying the whole cache). Either way nothing
    is recomputed: each kept node's K/V was computed with exactly its own path in view. Used for the target,
    the draft model, EAGLE's draft and lookahead's window alike.
    """
    nodes = list(nodes)
    if nodes != list(range(len(nodes))):  # a tree's path: rows base + j move to base, base + 1, ...
        src = torch.tensor([base + j for j in nodes], dtype=torch.long)                  # [m] ascending
        dst = torch.arange(base, base + len(nodes))                                       # [m], dst <= src

        def move(x):                                                                     # [B, h, L, d] in place
            return x.index_copy_(-2, dst.to(x.device), x.index_select(-2, src.to(x.device)))

        _each_layer(cache, move, cache_len(cache), skip=lambda keys: keys.numel() == 0)
    crop(cache, base + len(nodes))


def gather(cache, indices) -> None:
    """Keep only the cached positions `indices` (1D, ascending absolute positions), in every layer."""
    idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)                         # [k]
    if not bool((idx[1:] > idx[:-1]).all()):
        raise checks.ArgumentError(f"gather indices must be strictly ascending, got {idx.tolist()}")
    if any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", [])):
        raise NotImplementedError("gather does not support sliding-window cache layers")
    _each_layer(cache, lambda x: x.index_select(-2, idx.to(x.device)), len(idx),           # [B, h, k, d]
                skip=lambda keys: keys.numel() == 0)


def gather_rows(cache, rows, index) -> None:
    """A batch's rollback (chapter 09): keep the batch rows `rows` [B'] and, in row b, the cached slots index[b]
    ([B', L'], in that order), in every layer. Row b of the result is old row rows[b]."""
    rows = torch.as_tensor(rows, dtype=torch.long)                                       # [B']
    index = torch.as_tensor(index, dtype=torch.long)                                     # [B', L']
    width = index.shape[1]
    start = int(index[0, 0]) if index.numel() else 0
    # every row kept, each the same run of slots: a slice (a view), no copy
    same = bool((index == start + torch.arange(width)).all()) and bool((rows == torch.arange(len(rows))).all())

    def pick(x):                                                                         # [B, h, L, d]
        if same and len(rows) == x.shape[0]:
            return x[:, :, start:start + width]                                          # [B, h, L', d]
        x = x.index_select(0, rows.to(x.device))                                         # [B', h, L, d]
        return x.gather(2, index.to(x.device)[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))

    _each_layer(cache, pick, width, skip=lambda keys: keys.dim() != 4)                   # [B', h, L', d]


def _each_layer(cache, pick, length: int, skip) -> None:
    """Replace every layer's keys and values x [B, h, L, d] by pick(x), which keeps `length` positions; layers
    where skip(keys) are left alone. The one place that knows both cache layouts."""
    if hasattr(cache, "layers"):                               # >= 4.54: cache.layers[i].keys / .values
        for layer in cache.layers:
            if getattr(layer, "keys", None) is not None and not skip(layer.keys):
                layer.keys, layer.values = pick(layer.keys), pick(layer.values)
    else:                                                      # 4.53: key_cache / value_cache lists
        for i, keys in enumerate(cache.key_cache):
            if not skip(keys):
                cache.key_cache[i], cache.value_cache[i] = pick(keys), pick(cache.value_cache[i])
        cache._seen_tokens = length                            # 4.53 keeps a tally that crop resets too


_FORWARD_KEYWORDS: dict[type, tuple[bool, str]] = {}  # model class -> (takes logits_to_keep, cache keyword)


def _keywords(model) -> tuple[bool, str]:
    """(takes logits_to_keep, cache keyword), read from each model class's signature once: inspect costs ~5% of
    a small model's step."""
    keywords = _FORWARD_KEYWORDS.get(type(model))
    if keywords is None:
        keywords = _FORWARD_KEYWORDS[type(model)] = (
            "logits_to_keep" in inspect.signature(type(model).forward).parameters, _cache_keyword(model))
    return keywords
