"""From the course's drafters to the serving engines' settings: `engine_settings(drafter)`.

Derived in notebooks/08_showdown.ipynb. Every engine exposes the same few numbers under other names:

    course                                   vLLM speculative_config     SGLang server flags
    γ (draft tokens per pass)                num_speculative_tokens      --speculative-num-steps
    tree depth / top-k per level (EAGLE-2)   (chains)                    --speculative-num-steps / --speculative-eagle-topk
    nodes verified per pass, root excluded   (= γ)                       --speculative-num-draft-tokens, root INCLUDED

Hugging Face `generate` reads the draft length from the assistant's generation_config (see measure.hf_generate);
llama.cpp's server takes a draft model with -md and its length with --draft-max. The strings below are the
flags as those projects document them; engines change fast, so check your version's documentation.
"""

from __future__ import annotations

import json

from specdec_lab import checks
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.eagle import EagleDrafter
from specdec_lab.medusa import MedusaDrafter
from specdec_lab.ngram import PromptLookupDrafter

__all__ = ["engine_settings", "sglang_flags"]

NONE = "no equivalent"


def sglang_flags(topk: int, depth: int, budget: int) -> dict[str, int]:
    """SGLang's three tree numbers for the course's EAGLE-2 settings (EagleDrafter(dynamic=True, topk, depth,
    budget)); a chain of γ drafts is topk=1, depth=budget=γ. SGLang counts the root (the pending token the target
    re-reads) among its draft tokens, so --speculative-num-draft-tokens is budget + 1."""
    if min(topk, depth, budget) < 1:
        raise checks.ArgumentError(f"topk, depth and budget must all be >= 1, got {topk}, {depth}, {budget}")
    most = topk + (depth - 1) * topk * topk  # every level keeps topk nodes, each offering topk children
    if budget > most:
        raise checks.ArgumentError(f"a top-{topk} tree {depth} levels deep offers at most {most} nodes, not {budget}")
    if topk == 1 and budget != depth:
        raise checks.ArgumentError(f"a chain (topk=1) of depth {depth} has exactly {depth} nodes, not {budget}")
    return {"--speculative-num-steps": depth, "--speculative-eagle-topk": topk,
            "--speculative-num-draft-tokens": budget + 1}


def _vllm(method: str | None, tokens: int, model: str | None = None, **extra) -> str:
    config = ({"method": method} if method else {}) | ({"model": model} if model else {})
    config |= {"num_speculative_tokens": tokens, **extra}
    return f"--speculative-config '{json.dumps(config)}'"


def _sglang(algorithm: str, model: str, topk: int, depth: int, budget: int) -> str:
    flags = " ".join(f"{k} {v}" for k, v in sglang_flags(topk, depth, budget).items())
    return f"--speculative-algorithm {algorithm} --speculative-draft-model-path {model} {flags}"


def engine_settings(drafter, model: str = "<draft>") -> dict[str, str]:
    """The settings that ask vLLM, SGLang, Hugging Face generate and llama.cpp for what `drafter` does.

    drafter: None (plain decoding) or a course drafter: DraftModelDrafter, PromptLookupDrafter, MedusaDrafter,
    EagleDrafter. model: the path or Hub id of the draft model / heads the engine should load.
    Returns {engine: flags or "no equivalent: why"}.
    """
    if drafter is None:
        return dict.fromkeys(["vLLM", "SGLang", "Hugging Face", "llama.cpp"], "leave speculative decoding off")
    if isinstance(drafter, DraftModelDrafter):
        g = drafter.gamma
        if any(b > 1 for b in drafter.branching):
            tree = f"{NONE}: a static tree of a draft model ({drafter.branching}); the nearest is a chain of {g}"
            return {"vLLM": tree, "SGLang": tree, "Hugging Face": tree, "llama.cpp": tree}
        return {"vLLM": _vllm("draft_model", g, model),
                "SGLang": _sglang("STANDALONE", model, 1, g, g),
                "Hugging Face": f"generate(..., assistant_model=draft) with draft.generation_config."
                                f"num_assistant_tokens = {g}, num_assistant_tokens_schedule = 'constant', "
                                "assistant_confidence_threshold = 0",
                "llama.cpp": f"llama-server -m target.gguf -md {model}.gguf --draft-max {g} --draft-p-min 0"}
    if isinstance(drafter, PromptLookupDrafter):
        k, n = drafter.num_tokens, drafter.max_ngram
        return {"vLLM": _vllm("ngram", k, prompt_lookup_max=n, prompt_lookup_min=1),
                "SGLang": "--speculative-algorithm NGRAM (its own n-gram cache over prompts and outputs)",
                "Hugging Face": f"generate(..., prompt_lookup_num_tokens={k}, max_matching_ngram_size={n})",
                "llama.cpp": f"the lookup example: llama-lookup --draft {k}"}
    if isinstance(drafter, MedusaDrafter):
        depth = max(len(c) for c in drafter.choices)
        return {"vLLM": _vllm("medusa", depth, model) + "  (vLLM drafts each head's top-1: a chain)",
                "SGLang": f"{NONE}: no Medusa algorithm", "Hugging Face": f"{NONE}: no Medusa heads in generate",
                "llama.cpp": f"{NONE}: no Medusa heads"}
    if isinstance(drafter, EagleDrafter):
        v = drafter.net.version
        name = "eagle3" if v == 3 else "eagle"
        if drafter.dynamic:
            topk, depth, budget = drafter.topk, drafter.depth, drafter.budget
        elif all(b == 1 for b in drafter.branching):
            topk, depth = 1, len(drafter.branching)
            budget = depth
        else:
            static = f"{NONE}: a static EAGLE tree ({drafter.branching}); SGLang grows EAGLE-2's dynamic tree"
            return {"vLLM": static, "SGLang": static, "Hugging Face": static, "llama.cpp": static}
        vllm = _vllm(name, depth, model) + ("  (a chain of that depth; vLLM's EAGLE trees are experimental)"
                                            if topk > 1 else "")
        return {"vLLM": vllm, "SGLang": _sglang(name.upper(), model, topk, depth, budget),
                "Hugging Face": f"{NONE}: generate has no EAGLE drafter", "llama.cpp": f"{NONE}: no EAGLE drafter"}
    raise checks.ArgumentError(f"no engine mapping for {type(drafter).__name__}: expected None or a DraftModelDrafter, "
                               "PromptLookupDrafter, MedusaDrafter or EagleDrafter")
