"""The 4D attention masks the course hands a Hugging Face model (trees, lookahead's window, a ragged batch), and the
probe that says whether a model honours them. `lm.forward` builds its masks here and refuses a model that does not.

Every transformers version passes a user-supplied 4D mask through unchanged, to eager and SDPA alike. Eager ADDS
it to the scores (a bool mask there silently masks nothing); SDPA takes bool or additive float. So we always pass
the additive float form (0 = attend, finfo(dtype).min = blocked) in the model's dtype. Some architectures build
their own mask from a 2D one and fail on a 4D mask or ignore it (Bloom's ALiBi: "too many values to unpack");
`custom_mask_problem` finds them with one tiny probe per model class, and `require_custom_masks` refuses them
with a message naming the architecture.

Sliding windows (Mistral, Phi-3 checkpoints, Gemma-2's every other layer, Qwen2 with use_sliding_window): a 4D
mask is used AS IS, so HF applies no window to it: `custom_masks` builds the window into the mask itself, one mask
per layer type (a dict {"full_attention": .., "sliding_attention": ..} where both kinds exist, which those models
take). With full cache layers (`lm.new_cache`) HF's own masks (causal forwards) apply the window to absolute
indices, and ours to the positions a custom mask shows.
"""

from __future__ import annotations

import torch

from specdec_lab import checks

__all__ = ["attention_mask_4d", "custom_masks", "custom_mask_problem", "require_custom_masks"]


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
        raise checks.ArgumentError(f"mask must be [n, n] or [n, past + n] with n={n}, past={past}, got "
                                   f"{list(mask.shape)}")
    allowed = mask.expand(batch, n, past + n)[:, None]                                  # [B, 1, n, past+n]
    if window is not None:  # visible keys at this index or later, counted from the right: at most `window`
        allowed = allowed & (allowed.flip(-1).cumsum(-1).flip(-1) <= window)             # [B, 1, n, past+n]
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=device), blocked)   # [B, 1, n, past+n]


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


def custom_masks(model, mask, batch: int, past: int, n: int, device):
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
                  attention_mask=custom_masks(model, m, 1, 0, 3, ids.device)).logits[0, 2]
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
                     attention_mask=custom_masks(model, None, 1, 0, 5, ids.device)).logits[0].float()
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
