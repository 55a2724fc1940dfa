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
  * `from_pretrained(dtype=...)` from 4.56; `torch_dtype=` before (and deprecated after).
Every version passes a user-supplied 4D mask through unchanged, to eager and SDPA alike. Eager ADDS it
to the scores (a bool mask there silently masks nothing); SDPA takes bool or additive float. So we always
pass the additive float form (0 = attend, finfo(dtype).min = blocked) in the model's dtype. Some
architectures build their own mask from a 2D one and fail on a 4D mask or ignore it (Bloom's ALiBi: "too
many values to unpack"); `custom_mask_problem` finds them with one tiny probe per model class, and
`forward` refuses them with a message naming the architecture.

Sliding windows (Mistral, Phi-3 checkpoints, Gemma-2's every other layer, Qwen2 with use_sliding_window): a 4D
mask is used AS IS, so HF applies no window to it: `forward` builds the window into the mask itself, one mask
per layer type (a dict {"full_attention": .., "sliding_attention": ..} where both kinds exist, which those
models take). And the cache keeps EVERY position in every layer (`new_cache`): HF's sliding cache layers keep
only the last window - 1 positions, so a cache index is no longer a position, `gather` cannot pick positions,
and `crop` raises once the window is full. With full layers HF's own masks (causal forwards) apply the window
to absolute indices, and ours to the positions a custom mask shows.
"""
from __future__ import annotations

import inspect

import torch
import transformers
from transformers import DynamicCache

__all__ = ["new_cache", "append", "cache_len", "forward", "keep", "crop", "gather", "gather_rows", "attention_mask_4d",
           "dtype_kwargs",
           "forward_last", "context_length", "custom_mask_problem", "require_custom_masks"]


def dtype_kwargs(dtype: torch.dtype) -> dict:
    """The keyword that sets the weights' dtype in `from_pretrained`: `dtype` from 4.56, `torch_dtype` before."""
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def context_length(model) -> int | None:
    """The longest sequence `model` was built for (its position table), or None if its config does not say."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


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
        try:
            from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
        except ImportError:  # no per-layer classes in this version: nothing to replace
            return cache
        for i, layer in enumerate(getattr(cache, "layers", [])):
            if type(layer) is DynamicSlidingWindowLayer:  # keeps only window - 1 positions: keep them all
                cache.layers[i] = DynamicLayer()
        return cache
    return DynamicCache()


def append(cache, keys: torch.Tensor, values: torch.Tensor, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Add keys/values [B, heads, n, d] to one layer of `cache`; returns all of that layer's [B, heads, L + n, d]."""
    return cache.update(keys, values, layer)


def cache_len(cache) -> int:
    """Number of positions held in the cache (0 for None)."""
    return 0 if cache is None else int(cache.get_seq_length())


def attention_mask_4d(mask: torch.Tensor | None, batch: int, past: int, n: int,
                      dtype: torch.dtype, device, window: int | None = None) -> torch.Tensor:
    """Additive mask [B, 1, n, past + n]: 0 where a new token may attend, finfo(dtype).min where not.

    `mask` [n, n] or [B, n, n], True = may attend, says which NEW tokens see which, and every cached
    position is visible to every new token; or [n, past + n] / [B, n, past + n] to say it for the cached
    positions too (a drafter that grows a tree level by level hides the cached siblings). None = causal.
    window: a sliding-window layer's: each token keeps only itself and its window - 1 nearest visible
    predecessors. A token's visible positions are the sequence it would read alone (its path in a tree), so
    these are exactly the ones HF's window (query index - key index < window) keeps in that sequence.
    """
    if mask is None:
        mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()                 # [n, n] causal
    mask = mask.to(device=device, dtype=torch.bool)
    if mask.shape[-1] == n:
        mask = torch.cat([mask.new_ones(*mask.shape[:-1], past), mask], dim=-1)         # [.., n, past+n]
    if mask.shape[-2:] != (n, past + n):
        raise ValueError(f"mask must be [n, n] or [n, past + n] with n={n}, past={past}, got {list(mask.shape)}")
    allowed = mask.expand(batch, n, past + n)[:, None]                                  # [B, 1, n, past+n]
    if window is not None:  # visible keys at this index or later, counted from the right: at most `window`
        allowed = allowed & (allowed.flip(-1).cumsum(-1).flip(-1) <= window)             # [B, 1, n, past+n]
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=device), blocked)   # [B, 1, n, past+n]


def forward(model, ids: torch.Tensor, cache=None, positions: torch.Tensor | None = None,
            mask: torch.Tensor | None = None, hidden: bool = False, last: int | None = None):
    """Run `model` on new tokens `ids` [B, n], extending `cache` in place (None: plain uncached forward).

    positions: absolute position ids [n] or [B, n]; default cache_len(cache) + arange(n).
    mask: bool [n, n] or [B, n, n], True = new token i may attend to new token j (e.g. a tree mask);
          the cached prefix is always visible. Or [(B,) n, past + n] to mask cached positions too.
          None with default positions = ordinary causal attention.
    last: compute only the last `last` positions' logits (the LM head skips the rest; see `forward_last`).
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
        kwargs["attention_mask"] = _custom_masks(model, mask, B, past, n, ids.device)  # [B,1,n,past+n] or a dict
    if cache is not None:
        kwargs[_keywords(model)[1]] = cache
    if last is not None and _keywords(model)[0]:
        kwargs["logits_to_keep"] = last
    out = model(input_ids=ids, use_cache=cache is not None, output_hidden_states=hidden, **kwargs)
    logits = out.logits.float() if last is None else out.logits[:, -last:].float()      # [B, n or last, V]
    return (logits, tuple(out.hidden_states)) if hidden else logits


def _layer_windows(model) -> dict[str, int | None]:
    """{layer type: its sliding window, None for full attention} over the model's attention layers.

    From config.layer_types (Gemma-2, Qwen2, ...) or, without one, as HF's cache reads it: every layer slides
    when config.sliding_window is set (Mistral, Phi-3). Other types (chunked, linear, ...) map to None too;
    `custom_mask_problem` refuses them.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"]
    return {t: window if t == "sliding_attention" else None for t in types}


def _custom_masks(model, mask, batch: int, past: int, n: int, device):
    """`attention_mask_4d` for every layer type of `model`: one mask, or a dict by layer type when it mixes
    sliding and full layers (Gemma-2's forward takes a dict as it is; so do Qwen2's and their kin)."""
    masks = {t: attention_mask_4d(mask, batch, past, n, model.dtype, device, window=w)
             for t, w in _layer_windows(model).items()}                                  # [B, 1, n, past+n] each
    return next(iter(masks.values())) if len(masks) == 1 else masks


_MASK_PROBES: dict[tuple, str | None] = {}  # (model class, attention implementation, layer types) -> problem or None


def custom_mask_problem(model) -> str | None:
    """None when `model` honours a custom 4D attention mask, else why not (probed once per model class).

    The probe: three tokens, once causal and once with token 2 kept from seeing token 0. A model that
    honours the mask changes its logits at token 2; one that fails on the mask, or ignores it, does not.
    A model with sliding-window layers is probed with its window set to 2 for the moment: on 5 tokens, our
    causal masks must give HF's own logits (which apply that window), and must not without the window.
    """
    impl = model.config._attn_implementation
    windows = _layer_windows(model)
    key = (type(model), impl, tuple(sorted(windows)))
    if key not in _MASK_PROBES:
        other = sorted(set(windows) - {"full_attention", "sliding_attention"})
        if impl not in ("eager", "sdpa"):
            problem = f"its attn_implementation {impl!r} takes none (load it with attn_implementation='sdpa')"
        elif other:  # chunked attention (Llama 4), recurrent layers, ...: masks this adapter does not build
            problem = f"its {', '.join(other)} layers need masks of a kind this adapter does not build"
        else:
            try:
                problem = _probe_mask(model) or ("sliding_attention" in windows and _probe_window(model)) or None
            except Exception as e:  # e.g. Bloom reads a 2D mask for its ALiBi: "too many values to unpack"
                problem = f"it fails on them ({type(e).__name__}: {e})"
        _MASK_PROBES[key] = problem
    return _MASK_PROBES[key]


@torch.no_grad()
def _probe_mask(model) -> str | None:
    ids = torch.arange(3, device=model.device)[None]                                        # [1, 3]
    causal = torch.ones(3, 3, dtype=torch.bool).tril()                                      # [3, 3]
    hidden = causal.clone()
    hidden[2, 0] = False                                                                    # 2 may not see 0
    a, b = (model(input_ids=ids, position_ids=ids, use_cache=False,
                  attention_mask=_custom_masks(model, m, 1, 0, 3, ids.device)).logits[0, 2]
            for m in (causal, hidden))                                                      # [V], [V]
    return "it ignores them" if torch.equal(a, b) else None


@torch.no_grad()
def _probe_window(model) -> str | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    saved, config.sliding_window = config.sliding_window, 2
    try:
        ids = torch.arange(5, device=model.device)[None]                                    # [1, 5]
        own = model(input_ids=ids, use_cache=False).logits[0].float()                       # [5, V] HF's window
        ours = model(input_ids=ids, position_ids=ids, use_cache=False,
                     attention_mask=_custom_masks(model, None, 1, 0, 5, ids.device)).logits[0].float()
        full = attention_mask_4d(None, 1, 0, 5, model.dtype, ids.device)                   # no window anywhere
        none = model(input_ids=ids, position_ids=ids, use_cache=False, attention_mask=full).logits[0].float()
    finally:
        config.sliding_window = saved
    error, effect = float((ours - own).abs().max()), float((none - own).abs().max())
    if not error * 10 < effect:
        return (f"its sliding-window layers do not take the window from a custom mask (with a window of 2 on 5 "
                f"tokens, ours is {error:.2g} from its own logits, no window at all {effect:.2g})")
    return None


def require_custom_masks(model, what: str = "tree drafts or lookahead decoding") -> None:
    """Refuse, naming the architecture, a model that `custom_mask_problem` finds fault with."""
    problem = custom_mask_problem(model)
    if problem:
        raise NotImplementedError(f"{type(model).__name__} cannot run {what}: custom 4D attention masks are needed, "
                                  f"and {problem}. Use a chain, DraftModelDrafter(draft, gamma=4), or "
                                  "PromptLookupDrafter(), which need none")


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
        raise ValueError(f"gather indices must be strictly ascending, got {idx.tolist()}")
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


def forward_last(model, ids: torch.Tensor, cache, n: int) -> torch.Tensor:
    """forward(model, ids, cache) restricted to the logits of the last `n` positions: [B, n, V] float32.

    The LM head runs on those positions only (`logits_to_keep`, in every supported version, 4.53 to 5.24),
    so reading a long prompt does not pay for a [T, V] matrix product whose rows nobody looks at: what
    `generate()` does in its prefill. Models without `logits_to_keep` fall back to slicing `forward`.
    """
    keep_ok, cache_keyword = _keywords(model)
    if not keep_ok:
        return forward(model, ids, cache)[:, -n:]
    kwargs = {} if cache is None else {cache_keyword: cache}
    out = model(input_ids=ids, use_cache=cache is not None, logits_to_keep=n, **kwargs)
    return out.logits[:, -n:].float()  # [B, n, V]
