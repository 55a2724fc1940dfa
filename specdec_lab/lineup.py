"""The course's methods, one row each (`METHODS`), and what a benchmark runs: the methods of each table, as functions
of a prompt (`bench.Method`) or of a batch of prompts (`bench.BatchMethod`), each named as the tables print it.

    METHODS             the registry: name, how to build the drafter, what it needs, sampled or greedy only,
                        batchable, the serving engines' settings; every table and tests/test_exactness.py read it
    draft_methods       chapter 03's table: plain decoding (ours and Hugging Face's), the draft model, HF assisted
    showdown_methods    chapter 08's showdown: every row at one temperature, plus HF's two
    batch_methods       chapter 09's batched showdown: the batchable rows through `serving.generate_batch`
    engine_settings     the flags that ask vLLM, SGLang, HF generate and llama.cpp for what a drafter does

A new drafter is its module plus one row here. A method that cannot run here is a string that says why (no trained
heads for this target, greedy only), so the tables keep its line. `bench.run` times them; `report` prints them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec_lab import checks, engines, measure, tune
from specdec_lab import train_heads as trained
from specdec_lab.decoding import Generation, generate, generate_naive
from specdec_lab.drafters import Drafter, DraftModelDrafter
from specdec_lab.eagle import BlockDrafter, BlockNet, EagleDrafter, EagleNet
from specdec_lab.lookahead import lookahead_generate
from specdec_lab.medusa import DEFAULT_CHOICES, MedusaDrafter, MedusaHeads
from specdec_lab.ngram import PromptLookupDrafter
from specdec_lab.serving import generate_batch

__all__ = ["Method", "BatchMethod", "Kit", "Row", "METHODS", "TEMPERATURES", "kit", "draft_methods",
           "showdown_methods", "batch_methods", "engine_settings"]

# A method maps (input_ids [1, T]) to (new token ids, target passes or None to count them with a hook).
Method = Callable[[torch.Tensor], tuple[list[int], int | None]]
# A batch method maps B prompts ([1, T] each) to (new token ids per prompt, target passes per prompt, batched passes).
BatchMethod = Callable[[list[torch.Tensor]], tuple[list[list[int]], list[int], int]]


# ---- the registry ----------------------------------------------------------------------------------------


@dataclass
class Kit:
    """What a row builds its drafter from: the pair, the trained modules loaded for the target ({kind: module},
    kinds as `train_heads.RECIPES` names them), and the settings the showdown's names print."""

    target: object
    draft: object
    nets: dict
    gamma: int = 3
    branching: tuple[int, ...] = (2, 2, 1, 1)

    def names(self) -> dict:
        """What a row's name may say: {gamma}, {branching}, {medusa_nodes} (the Medusa tree's size)."""
        heads = self.nets.get("medusa")
        return dict(gamma=self.gamma, branching=list(self.branching),
                    medusa_nodes=len((heads is not None and heads.choices) or DEFAULT_CHOICES))


@dataclass(frozen=True)
class Row:
    """One method of the course, as every table runs it.

    name: as the tables print it (see Kit.names). make: (kit) -> a fresh drafter (None: plain decoding), decoded by
    `decoding.generate`; or loop: (target, ids, max_new_tokens, eos_token_id) -> Generation, a loop of its own.
    kind: the drafter's class (`engine_settings` finds the row by it). needs: the trained module it drafts with
    (a key of `train_heads.RECIPES`), or None. greedy_only: why it cannot sample ("" : exact at every temperature).
    batch: `serving.generate_batch` runs it (chapter 09). engines: (drafter, model) -> {engine: flags}, or None
    (no engine runs it). tuned: (kit) -> (drafter, name), the tuned variant `auto=True` adds after it (chapter
    08). extra: only when asked for (the CPU-sized tree: showdown_methods(small_tree=True)).
    """

    name: str
    make: Callable[[Kit], Drafter | None] | None = None
    loop: Callable[..., Generation] | None = None
    kind: type | None = None
    needs: str | None = None
    greedy_only: str = ""
    batch: bool = False
    engines: Callable[[Drafter, str], dict[str, str]] | None = None
    tuned: Callable[[Kit], tuple[Drafter, str]] | None = None
    extra: bool = False


def _tuned_chain(k: Kit) -> tuple[Drafter, str]:
    drafter, pick = tune.auto_draft_model(k.target, k.draft, chain=True)
    return drafter, f"draft model, chain γ={len(pick.settings['branching'])} (auto)"


def _tuned_tree(k: Kit) -> tuple[Drafter, str]:
    drafter, pick = tune.auto_draft_model(k.target, k.draft)
    return drafter, f"draft model, tree {pick.settings['branching']} (auto)"


def _tuned_eagle(kind: str, label: str) -> Callable[[Kit], tuple[Drafter, str]]:
    def tuned(k: Kit) -> tuple[Drafter, str]:
        drafter, pick = tune.auto_eagle(k.target, k.nets[kind])
        return drafter, f"{label}, tree {pick.settings['budget']} nodes, depth {pick.settings['depth']} (auto)"
    return tuned


def _lookahead(target, ids, max_new_tokens, eos_token_id) -> Generation:
    return lookahead_generate(target, ids, max_new_tokens, eos_token_id=eos_token_id, window=4, ngram=4, guesses=4)


# The chapters' defaults for the zoo pair: draft chain γ=3 (03: near the peak of the measured speedup, which is flat
# there), tree [2, 2, 1, 1] (04), Medusa's tree (05), EAGLE-1 chain γ=4 and EAGLE-2's dynamic tree for EAGLE-2 and
# -3 (06), prompt lookup (10 tokens, n-grams up to 3) and lookahead W=4, N=4, G=4 (07); the tables keep this order.
METHODS: list[Row] = [
    Row("target only", lambda k: None, batch=True),
    Row("draft model, chain γ={gamma}", lambda k: DraftModelDrafter(k.draft, k.gamma), kind=DraftModelDrafter,
        batch=True, engines=engines.draft_model, tuned=_tuned_chain),
    Row("draft model, tree {branching}", lambda k: DraftModelDrafter(k.draft, branching=list(k.branching)),
        kind=DraftModelDrafter, engines=engines.draft_model, tuned=_tuned_tree),
    Row("Medusa, {medusa_nodes}-node tree", lambda k: MedusaDrafter(k.nets["medusa"]), kind=MedusaDrafter,
        needs="medusa", engines=engines.medusa),
    Row("EAGLE-1, chain γ=4", lambda k: EagleDrafter(k.nets["eagle1"], [1, 1, 1, 1]), kind=EagleDrafter,
        needs="eagle1", batch=True, engines=engines.eagle),
    Row("EAGLE-2, dynamic tree", lambda k: EagleDrafter(k.nets["eagle1"], dynamic=True), kind=EagleDrafter,
        needs="eagle1", engines=engines.eagle, tuned=_tuned_eagle("eagle1", "EAGLE-2")),
    Row("EAGLE-2, dynamic tree of 6, depth 3", kind=EagleDrafter, needs="eagle1", engines=engines.eagle, extra=True,
        make=lambda k: EagleDrafter(k.nets["eagle1"], dynamic=True, topk=3, depth=3, budget=6)),
    Row("EAGLE-3, dynamic tree", lambda k: EagleDrafter(k.nets["eagle3"], dynamic=True), kind=EagleDrafter,
        needs="eagle3", engines=engines.eagle, tuned=_tuned_eagle("eagle3", "EAGLE-3")),
    Row("block drafter, γ=4", lambda k: BlockDrafter(k.nets["block"], 4), kind=BlockDrafter, needs="block"),
    Row("prompt lookup (10, 3)", lambda k: PromptLookupDrafter(10, 3), kind=PromptLookupDrafter, batch=True,
        engines=engines.prompt_lookup),
    Row("lookahead (4, 4, 4)", loop=_lookahead,
        greedy_only="greedy only (its Jacobi window and n-gram check compare argmaxes)"),
]


def kit(target, draft, heads: dict | None = None, gamma: int = 3, branching: Sequence[int] = (2, 2, 1, 1)) -> Kit:
    """The rows' materials for this pair: heads {kind: folder} (None: `train_heads.find(target)`, the zoo's for the zoo
    target, else what `specdec-lab train-heads` trained for it), each loaded once per target and folder."""
    heads = trained.find(target) if heads is None else heads
    load = {m: MedusaHeads.from_pretrained if recipe.version is None else
            BlockNet.from_pretrained if recipe.block else EagleNet.from_pretrained
            for m, recipe in trained.RECIPES.items() if not recipe.draft_layers}  # a draft model: the pair's draft
    return Kit(target, draft, {m: _loaded(target, folder, load[m]) for m, folder in heads.items() if m in load},
               gamma, tuple(branching))


def _why_not(row: Row, k: Kit, temperature: float) -> str:
    """Why `row` cannot run here ("" when it can)."""
    if row.needs and row.needs not in k.nets:
        return trained.missing(k.target, row.needs)
    return row.greedy_only if temperature > 0 else ""


def _method(row: Row, k: Kit, max_new_tokens: int, temperature: float, eos_token_id, drafter=None) -> Method:
    """`row` as a function of one prompt: (new tokens, target passes). drafter: reuse this one (tuned), rather
    than a fresh `row.make(k)` per prompt."""
    def call(ids):
        if row.loop is not None:
            gen = row.loop(k.target, ids, max_new_tokens, eos_token_id)
        else:
            gen = generate(k.target, ids, drafter if drafter is not None else row.make(k), max_new_tokens,
                           temperature, eos_token_id=eos_token_id)
        return gen.tokens, gen.target_calls
    return call


def engine_settings(drafter, model: str = "<draft>") -> dict[str, str]:
    """The settings that ask vLLM, SGLang, Hugging Face generate and llama.cpp for what `drafter` does, from its
    row's `engines` (engines.py). drafter: None (plain decoding) or a drafter of a row. model: the path or Hub id
    of the draft model or heads the engine should load. Returns {engine: flags or "no equivalent: why"}."""
    if drafter is None:
        return dict.fromkeys(engines.ENGINES, "leave speculative decoding off")
    row = next((r for r in METHODS if r.kind is type(drafter)), None) or next(  # its own class first (a subclass)
        (r for r in METHODS if r.kind is not None and isinstance(drafter, r.kind)), None)
    if row is None:
        kinds = ", ".join(sorted({r.kind.__name__ for r in METHODS if r.kind}))
        raise checks.ArgumentError(f"no engine mapping for {type(drafter).__name__}: expected None or the drafter of a "
                                   f"row of lineup.METHODS ({kinds})")
    if row.engines is None:
        return dict.fromkeys(engines.ENGINES, f"{engines.NONE}: no engine runs {type(drafter).__name__}")
    return row.engines(drafter, model)


def draft_methods(target, draft, max_new_tokens: int = 64, gamma: int = 3, eos_token_id=None,
                  naive: bool = False, hf_defaults: bool = True) -> dict[str, Method]:
    """Plain decoding (ours and HF's), the draft-model drafter (cached; naive optional), HF assisted."""
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
    """Every row of `METHODS` at one temperature, then HF's assisted generation and prompt lookup: {name: method,
    or a string saying why it cannot run}.

    gamma, branching: the draft model's chain and tree. heads: {kind: folder} of the Medusa heads and EAGLE drafts
    to use (see `kit`); a row without its module says how to train it. drafting: a list that receives every module
    the methods draft with (for `bench.run(..., drafting=)`). auto: also each row's tuned variant (`tune`, chapter
    08 section 7), after it; the tuner measures this device here, before any timing, and each name says what it
    picked. small_tree: also EAGLE-2's dynamic tree cut to 6 nodes in 3 levels (top-3), sized for a CPU, where
    every level costs a draft pass and every node adds to the price of the target's (chapter 11).
    """
    k = kit(target, draft, heads, gamma, branching)
    methods: dict[str, Method | str] = {}
    for row in METHODS:
        if row.extra and not small_tree:
            continue
        why = _why_not(row, k, temperature)
        methods[row.name.format(**k.names())] = why or _method(row, k, max_new_tokens, temperature, eos_token_id)
        if auto and row.tuned and not why:
            drafter, name = row.tuned(k)  # measured here, once (remembered); generate's start() resets it
            methods[name] = _method(row, k, max_new_tokens, temperature, eos_token_id, drafter)
    if drafting is not None:  # whatever drafts: the draft model (HF's assistant too), heads, nets, the LM head they read
        drafting += [draft, target.get_output_embeddings(), *k.nets.values()]
        drafting += [m for net in k.nets.values() for m in (getattr(net, "fuse", None), getattr(net, "out_norm", None))
                     if m is not None]  # EAGLE-3's, called outside the net's forward (the fuse at commit, the norm)

    def hf(**kw):
        return lambda ids: (measure.hf_generate(target, ids, max_new_tokens, eos_token_id=eos_token_id,
                                                temperature=temperature, **kw).tolist(), None)
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
    """The batchable rows of `METHODS`, each decoding a batch of prompts with `serving.generate_batch`: {name:
    method, or why not}, after "target only, batch 1" (the same prompts one at a time with `generate`: the
    reference of the greedy identity check, and what batching itself gains). Settings as the showdown's."""
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=eos_token_id)

    def one_at_a_time(prompts):
        gens = [generate(target, ids, **kw) for ids in prompts]
        return [g.tokens for g in gens], [g.target_calls for g in gens], sum(g.target_calls for g in gens)

    def batched(drafter):
        def call(prompts):
            out = generate_batch(target, [ids[0].tolist() for ids in prompts], drafter, **kw)
            return out.tokens, [g.target_calls for g in out.rows], out.steps
        return call

    k = kit(target, draft, heads, gamma)
    methods: dict[str, BatchMethod | str] = {"target only, batch 1": one_at_a_time}
    for row in METHODS:
        if row.batch:
            methods[row.name.format(**k.names())] = _why_not(row, k, temperature) or batched(row.make(k))
    return methods
