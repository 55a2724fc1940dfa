"""From the course's drafters to the serving engines' settings, one function per kind of drafter (each row of
`lineup.METHODS` names its own; `lineup.engine_settings(drafter)` finds it).

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

__all__ = ["ENGINES", "sglang_flags", "draft_model", "prompt_lookup", "medusa", "eagle"]

ENGINES = ("vLLM", "SGLang", "Hugging Face", "llama.cpp")
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


def draft_model(drafter, model: str) -> dict[str, str]:
    """A DraftModelDrafter's chain (a static tree has no engine equivalent)."""
    g = drafter.gamma
    if any(b > 1 for b in drafter.branching):
        return dict.fromkeys(ENGINES, f"{NONE}: a static tree of a draft model ({drafter.branching}); the nearest is a "
                                      f"chain of {g}")
    return {"vLLM": _vllm("draft_model", g, model),
            "SGLang": _sglang("STANDALONE", model, 1, g, g),
            "Hugging Face": f"generate(..., assistant_model=draft) with draft.generation_config."
                            f"num_assistant_tokens = {g}, num_assistant_tokens_schedule = 'constant', "
                            "assistant_confidence_threshold = 0",
            "llama.cpp": f"llama-server -m target.gguf -md {model}.gguf --draft-max {g} --draft-p-min 0"}


def prompt_lookup(drafter, model: str) -> dict[str, str]:
    """A PromptLookupDrafter: every engine has n-gram drafting (no model to load)."""
    k, n = drafter.num_tokens, drafter.max_ngram
    return {"vLLM": _vllm("ngram", k, prompt_lookup_max=n, prompt_lookup_min=1),
            "SGLang": "--speculative-algorithm NGRAM (its own n-gram cache over prompts and outputs)",
            "Hugging Face": f"generate(..., prompt_lookup_num_tokens={k}, max_matching_ngram_size={n})",
            "llama.cpp": f"the lookup example: llama-lookup --draft {k}"}


def medusa(drafter, model: str) -> dict[str, str]:
    """A MedusaDrafter: vLLM only, and as a chain of each head's top-1."""
    depth = max(len(c) for c in drafter.choices)
    return {"vLLM": _vllm("medusa", depth, model) + "  (vLLM drafts each head's top-1: a chain)",
            "SGLang": f"{NONE}: no Medusa algorithm", "Hugging Face": f"{NONE}: no Medusa heads in generate",
            "llama.cpp": f"{NONE}: no Medusa heads"}


def eagle(drafter, model: str) -> dict[str, str]:
    """An EagleDrafter: a chain, or EAGLE-2's dynamic tree (a static EAGLE tree has no engine equivalent)."""
    name = "eagle3" if drafter.net.version == 3 else "eagle"
    if drafter.dynamic:
        topk, depth, budget = drafter.topk, drafter.depth, drafter.budget
    elif all(b == 1 for b in drafter.branching):
        topk, depth, budget = 1, len(drafter.branching), len(drafter.branching)
    else:
        return dict.fromkeys(ENGINES, f"{NONE}: a static EAGLE tree ({drafter.branching}); SGLang grows EAGLE-2's "
                                      "dynamic tree")
    vllm = _vllm(name, depth, model) + ("  (a chain of that depth; vLLM's EAGLE trees are experimental)"
                                        if topk > 1 else "")
    return {"vLLM": vllm, "SGLang": _sglang(name.upper(), model, topk, depth, budget),
            "Hugging Face": f"{NONE}: generate has no EAGLE drafter", "llama.cpp": f"{NONE}: no EAGLE drafter"}
