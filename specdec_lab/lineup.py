"""What a benchmark runs: the methods of each table, as functions of a prompt (`bench.Method`) or of a batch of
prompts (`bench.BatchMethod`), each named as the tables print it.

    draft_methods       chapter 03's table: plain decoding (ours and Hugging Face's), the draft model, HF assisted
    showdown_methods    chapter 08's showdown: every method of the course at one temperature, plus HF's
    batch_methods       chapter 09's batched showdown: the chain drafters through `serving.generate_batch`

A method that cannot run here is a string that says why (no trained heads for this target, greedy only), so
the tables keep its line. `bench.run` times them; `report` prints them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

__all__ = ["Method", "BatchMethod", "TEMPERATURES", "draft_methods", "showdown_methods", "batch_methods"]

# A method maps (input_ids [1, T]) to (new token ids, target passes or None to count them with a hook).
Method = Callable[[torch.Tensor], tuple[list[int], int | None]]
# A batch method maps B prompts ([1, T] each) to (new token ids per prompt, target passes per prompt, batched passes).
BatchMethod = Callable[[list[torch.Tensor]], tuple[list[list[int]], list[int], int]]


def draft_methods(target, draft, max_new_tokens: int = 64, gamma: int = 3, eos_token_id=None,
                  naive: bool = False, hf_defaults: bool = True) -> dict[str, Method]:
    """Plain decoding (ours and HF's), the draft-model drafter (cached; naive optional), HF assisted."""
    from specdec_lab import measure  # imported here so that `specdec-lab --help` stays quick
    from specdec_lab.decoding import generate, generate_naive
    from specdec_lab.drafters import DraftModelDrafter

    n, eos = max_new_tokens, eos_token_id

    def ours(drafter_factory):
        def call(ids):
            gen = generate(target, ids, drafter_factory(), max_new_tokens=n, eos_token_id=eos)
            return gen.tokens, gen.target_calls
        return call

    def hf(**kw):
        return lambda ids: (measure.hf_generate(target, ids, n, eos_token_id=eos, **kw).tolist(), None)

    methods = {
        "target only": ours(lambda: None),
        "target only, HF generate": hf(),
        f"draft model γ={gamma}": ours(lambda: DraftModelDrafter(draft, gamma)),
    }
    if naive:
        def naive_call(ids):
            gen = generate_naive(target, draft, ids, gamma=gamma, max_new_tokens=n, eos_token_id=eos)
            return gen.tokens, gen.target_calls
        methods[f"draft model γ={gamma}, no KV cache"] = naive_call
    methods[f"HF assisted, {gamma} tokens"] = hf(assistant=draft, num_assistant_tokens=gamma)
    methods["HF assisted, heuristic schedule"] = hf(assistant=draft, num_assistant_tokens=gamma,
                                                    schedule="heuristic")
    if hf_defaults:  # what assisted generation does when given nothing but the assistant (5.x defaults)
        methods["HF assisted, HF defaults"] = hf(assistant=draft, num_assistant_tokens=20,
                                                 confidence_threshold=0.4)
    return methods



# ---- chapter 08: the showdown ------------------------------------------------------------------------

TEMPERATURES = (0.0, 0.7)  # greedy, and the sampling temperature of the showdown


def showdown_methods(target, draft, max_new_tokens: int = 64, temperature: float = 0.0, eos_token_id=None,
                     gamma: int = 3, branching: Sequence[int] = (2, 2, 1, 1), heads: dict | None = None,
                     drafting: list | None = None, auto: bool = False, small_tree: bool = False
                     ) -> dict[str, Method | str]:
    """Every method of the course at one temperature: {name: method, or a string saying why it cannot run}.

    The settings are the chapters' defaults for the zoo pair: draft chain γ=3 (03: near the peak of the measured
    speedup, which is flat there; which γ is fastest changes from run to run), tree [2, 2, 1, 1]
    (04), Medusa's 24-node tree (05), EAGLE-1 chain γ=4 and EAGLE-2's dynamic tree for EAGLE-2 and -3 (06),
    prompt lookup (10 tokens, n-grams up to 3) and lookahead W=4, N=4, G=4 (07). heads: {method: folder} of
    the Medusa heads and EAGLE drafts to use (None: `heads.find(target)`, the zoo's for the zoo target, else what
    `specdec-lab train-heads` trained for it); a method without any is left out, saying how to train it.
    drafting: a list that receives every module the methods draft with (for `run(..., drafting=)`).
    auto: also the tuned settings (`tune`, chapter 08 section 7), each after its default: the draft model's chain
    and tree (`tune.auto_draft_model`), EAGLE-2's and EAGLE-3's dynamic trees (`tune.auto_eagle`). The tuner
    measures this device here, before any timing, and each name says what it picked.
    small_tree: also EAGLE-2's dynamic tree cut to 6 nodes in 3 levels (top-3), sized for a CPU, where every level
    costs a draft pass and every node adds to the price of the target's (chapter 11; `bench --target` runs it).
    """
    from specdec_lab import measure, tune
    from specdec_lab.decoding import generate
    from specdec_lab.drafters import DraftModelDrafter
    from specdec_lab.lookahead import lookahead_generate
    from specdec_lab.ngram import PromptLookupDrafter

    n, eos, T = max_new_tokens, eos_token_id, temperature

    def ours(make):
        def call(ids):
            gen = generate(target, ids, make(), max_new_tokens=n, temperature=T, eos_token_id=eos)
            return gen.tokens, gen.target_calls
        return call

    def hf(**kw):
        return lambda ids: (measure.hf_generate(target, ids, n, eos_token_id=eos, temperature=T, **kw).tolist(), None)

    def tuned(auto, describe):  # (name, method) of a tuned drafter: the tuner measures here, once (remembered)
        drafter, pick = auto()
        return f"{describe(pick.settings)} (auto)", ours(lambda: drafter)  # generate's start() resets it

    methods: dict[str, Method | str] = {
        "target only": ours(lambda: None),
        f"draft model, chain γ={gamma}": ours(lambda: DraftModelDrafter(draft, gamma)),
    }
    if auto:
        name, method = tuned(lambda: tune.auto_draft_model(target, draft, chain=True),
                             lambda s: f"draft model, chain γ={len(s['branching'])}")
        methods[name] = method
    methods[f"draft model, tree {list(branching)}"] = ours(lambda: DraftModelDrafter(draft, branching=list(branching)))
    if auto:
        name, method = tuned(lambda: tune.auto_draft_model(target, draft),
                             lambda s: f"draft model, tree {s['branching']}")
        methods[name] = method
    from specdec_lab import train_heads as trained
    from specdec_lab.eagle import EagleDrafter, EagleNet
    from specdec_lab.medusa import MedusaDrafter, MedusaHeads

    heads = trained.find(target) if heads is None else heads
    nets = {m: _loaded(target, heads[m], EagleNet.from_pretrained) for m in ("eagle1", "eagle3") if m in heads}
    if "medusa" in heads:
        medusa = MedusaHeads.from_pretrained(target, heads["medusa"])
        methods[f"Medusa, {len(MedusaDrafter(medusa).choices)}-node tree"] = ours(lambda: MedusaDrafter(medusa))
    else:
        methods["Medusa, 24-node tree"] = trained.missing(target, "medusa")
    eagles = [("EAGLE-1, chain γ=4", "eagle1", lambda net: EagleDrafter(net, [1, 1, 1, 1])),
              ("EAGLE-2, dynamic tree", "eagle1", lambda net: EagleDrafter(net, dynamic=True)),
              ("EAGLE-3, dynamic tree", "eagle3", lambda net: EagleDrafter(net, dynamic=True))]
    if small_tree:
        eagles.insert(2, ("EAGLE-2, dynamic tree of 6, depth 3", "eagle1",
                          lambda net: EagleDrafter(net, dynamic=True, topk=3, depth=3, budget=6)))
    for name, method, make in eagles:
        net = nets.get(method)
        methods[name] = ours(lambda make=make, net=net: make(net)) if net else trained.missing(target, method)
        if auto and net and "dynamic" in name:
            tuned_name, tuned_method = tuned(lambda net=net: tune.auto_eagle(target, net),
                                             lambda s: f"{name.split(',')[0]}, tree {s['budget']} nodes, depth {s['depth']}")
            methods[tuned_name] = tuned_method
    if drafting is not None:  # whatever drafts: the draft model (HF's assistant too), heads, nets, the LM head they read
        drafting += [draft, target.get_output_embeddings(), *nets.values()] + ([medusa] if "medusa" in heads else [])
        drafting += [m for net in nets.values() for m in (net.fuse, net.out_norm) if m is not None]  # EAGLE-3's,
        # called outside the net's forward (the fuse of the target's states at commit, the norm before the head)
    methods["prompt lookup (10, 3)"] = ours(lambda: PromptLookupDrafter(10, 3))
    if T == 0:
        def lookahead(ids):
            gen = lookahead_generate(target, ids, n, eos_token_id=eos, window=4, ngram=4, guesses=4)
            return gen.tokens, gen.target_calls
        methods["lookahead (4, 4, 4)"] = lookahead
    else:
        methods["lookahead (4, 4, 4)"] = "greedy only (its Jacobi window and n-gram check compare argmaxes)"
    methods[f"HF assisted, γ={gamma}"] = hf(assistant=draft, num_assistant_tokens=gamma)
    methods["HF prompt lookup, 10"] = hf(prompt_lookup_num_tokens=10)
    return methods


_LOADED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {folder: module}


def _loaded(target, folder, load):
    """`load(target, folder)`, once per target and folder: every temperature of a showdown drafts with the same
    modules, so what `tune` measured for them at the first one (and remembers per module) holds for the next."""
    per_target = _LOADED.setdefault(target, {})
    if str(folder) not in per_target:
        per_target[str(folder)] = load(target, folder)
    return per_target[str(folder)]



# ---- chapter 09: the batched showdown --------------------------------------------------------------------


def batch_methods(target, draft, max_new_tokens: int = 64, temperature: float = 0.0, eos_token_id=None,
                  gamma: int = 3, heads: dict | None = None) -> dict[str, BatchMethod | str]:
    """The chain methods `serving.generate_batch` runs, each decoding a batch of prompts: {name: method, or why
    not}, after "target only, batch 1" (the same prompts one at a time with `generate`: the reference of the
    greedy identity check, and what batching itself gains). The same settings as the showdown's chains: draft
    model γ, EAGLE-1 chain γ=4, prompt lookup (10, 3)."""
    from specdec_lab import train_heads as trained
    from specdec_lab.decoding import generate
    from specdec_lab.drafters import DraftModelDrafter
    from specdec_lab.eagle import EagleDrafter, EagleNet
    from specdec_lab.ngram import PromptLookupDrafter
    from specdec_lab.serving import generate_batch

    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=eos_token_id)

    def one_at_a_time(prompts):
        gens = [generate(target, ids, **kw) for ids in prompts]
        return [g.tokens for g in gens], [g.target_calls for g in gens], sum(g.target_calls for g in gens)

    def batched(drafter):
        def call(prompts):
            out = generate_batch(target, [ids[0].tolist() for ids in prompts], drafter, **kw)
            return out.tokens, [g.target_calls for g in out.rows], out.steps
        return call

    heads = trained.find(target) if heads is None else heads
    eagle = (batched(EagleDrafter(EagleNet.from_pretrained(target, heads["eagle1"]), [1, 1, 1, 1])) if "eagle1" in heads
             else trained.missing(target, "eagle1"))
    return {"target only, batch 1": one_at_a_time, "target only": batched(None),
            f"draft model, chain γ={gamma}": batched(DraftModelDrafter(draft, gamma)), "EAGLE-1, chain γ=4": eagle,
            "prompt lookup (10, 3)": batched(PromptLookupDrafter(10, 3))}
