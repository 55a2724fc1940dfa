"""Settings that fit the machine: measure what a pass costs HERE, then pick γ, the draft tree, EAGLE-2's tree.

Derived in notebooks/08_showdown.ipynb, section 7.

The chapters' defaults were chosen for τ, or for a GPU, where a pass over 25 tokens costs about one decode step.
On a CPU it costs two or more, and a wide tree loses. The tuner measures, in five to ten seconds on your own device:
  * v(n): one target pass over n new tokens (n = 1 .. 64), in plain decoding steps;
  * c(m): one draft-model forward over m tokens (a tree level of m nodes), in the same unit;
  * e(m): one EAGLE level over m nodes (the net's layer, the LM head, the log-softmax), the same unit;
and, on calibration texts of its own (never the benchmark's prompts), teacher-forced on the target's greedy text:
  * where the target's token ranks among the draft model's top k at every position (`measure.draft_ranks`): what any
    static top-k tree of the draft model would accept (`tree_acceptance`);
  * EAGLE-2's mean accepted length for every depth and node budget, all from one pass that grows the full
    candidate pool at every position (`eagle_acceptance`).
Then it maximises the predicted speedup τ / (v(1 + nodes) + the drafting's cost), chapter 02's formula for
trees: as Sequoia (Chen et al. 2024) chooses its tree from a measured cost per node count,
where EAGLE-2 (Li et al. 2024) fixes its budget by hand.

    costs = tune.measure(target, draft=draft)          # Costs: v(n), c(m) on this device, at this thread count
    pick = tune.best_tree(costs, ranks)                 # Pick: the branching with the best predicted speedup
    drafter, pick = tune.auto_draft_model(target, draft, chain=True)   # all three steps: a tuned DraftModelDrafter
    drafter, pick = tune.auto_eagle(target, net)        # EAGLE-2's top-k, depth and budget, picked the same way

The tuner sits above the methods: it builds drafters with the settings it picked; no drafter calls it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specdec_lab import economics, lm
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.eagle import EagleDrafter
from specdec_lab.measure import best_times, draft_ranks  # the course's one timer; where a draft's guesses rank
from specdec_lab.tree import branchings, tree_depths

__all__ = ["NS", "WIDTHS", "CALIBRATION", "Costs", "Pick", "measure", "calibration_texts", "eagle_acceptance",
           "tree_acceptance", "predict_tree", "best_tree", "predict_eagle", "best_eagle", "medusa_choices",
           "medusa_card", "auto_draft_model", "auto_eagle"]

NS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64)  # target pass sizes timed; v(n) between: linear
WIDTHS = (1, 2, 4, 8, 16)  # draft forward sizes timed (a tree level's frontier)

# Calibration texts: written for the tuner, two like each of the suite's categories (code, edit, doc), none of them
# a benchmark prompt. The tuner's picks are only as good as these are like your workload: pass your own texts.
CALIBRATION = (
    "def merge_dicts(*dicts):\n    \"\"\"Return a new dict holding the items of every dict; later ones win.\"\"\"\n"
    "    result = {}\n    for d in dicts:\n        if not isinstance(d, dict):\n",
    "class Counter:\n    \"\"\"Count how often each key was added.\"\"\"\n\n    def __init__(self):\n"
    "        self.counts = {}\n\n    def add(self, key):\n        self.counts[key] = self.counts.get(key, 0) + 1\n\n"
    "    def most_common(self, n=None):\n",
    "def read_config(path):\n    with open(path, encoding='utf-8') as f:\n        lines = f.read().splitlines()\n"
    "    config = {}\n    for line in lines:\n        if not line or line.startswith('#'):\n            continue\n"
    "        key, value = line.split('=', 1)\n        config[key.strip()] = value.strip()\n    return config\n\n\n"
    "# The same function, reading the file in binary mode:\ndef read_config(path):\n",
    "def total_size(paths):\n    total = 0\n    for path in paths:\n        if os.path.isfile(path):\n"
    "            total += os.path.getsize(path)\n    return total\n\n\n"
    "# The same function with the loop replaced by sum():\ndef total_size(paths):\n",
    "def parse_duration(text):\n    \"\"\"",
    "class LRUCache:\n    def __init__(self, maxsize=128):\n        \"\"\"",
)


def _interp(table: dict[int, float], x: float) -> float:
    """Piecewise-linear value of a {size: ms} table at x (the last segment extended beyond the largest size)."""
    keys = sorted(table)
    if x <= keys[0]:
        return table[keys[0]]
    for a, b in zip(keys, keys[1:]):
        if x <= b or b == keys[-1]:
            return table[a] + (table[b] - table[a]) * (x - a) / (b - a)
    return table[keys[0]]  # one size only


@dataclass
class Costs:
    """What a forward costs on one device at one thread count, in milliseconds (the minimum over interleaved rounds).

    verify[n]: a target pass over n new tokens; draft[m]: a draft-model forward over m tokens; eagle[m]: one EAGLE
    level over m nodes; step: plain decoding's one-token step (None: verify[1]). v, c, e divide by the step: the
    units of chapters 02 and 04. `measure` times each call where the loop makes it: a pass right after drafting,
    a step right after a step, and drafting both right after a pass (the first level of a step: the target's
    weights have just pushed the draft's out of the caches) and right after drafting (the levels after it).
    """

    verify: dict[int, float]
    draft: dict[int, float] = field(default_factory=dict)
    eagle: dict[int, float] = field(default_factory=dict)
    step: float | None = None
    threads: int = 1
    device: str = "cpu"
    draft_next: dict[int, float] | None = None  # a draft forward right after another (None: as after a pass)
    eagle_next: dict[int, float] | None = None

    @property
    def unit(self) -> float:
        return self.verify[1] if self.step is None else self.step

    def v(self, n: float) -> float:
        """A pass over n tokens, in plain decoding steps."""
        return _interp(self.verify, n) / self.unit

    def c(self, m: float = 1, after_pass: bool = True) -> float:
        """One draft-model forward over m tokens, in plain decoding steps: right after a target pass, or not."""
        return _interp(self.draft if after_pass or not self.draft_next else self.draft_next, m) / self.unit

    def e(self, m: float = 1, after_pass: bool = True) -> float:
        """One EAGLE level over m nodes, in plain decoding steps: right after a target pass, or not."""
        return _interp(self.eagle if after_pass or not self.eagle_next else self.eagle_next, m) / self.unit

    @classmethod
    def from_roofline(cls, roofline: economics.Roofline, c: float, e: float | None = None) -> Costs:
        """The costs a roofline predicts (batch 1): v(n) = t(1, n) / t(1, 1); a draft forward costs c and an
        EAGLE level e whatever its width (memory-bound: a few more tokens are free), in one-token passes."""
        t1 = roofline.step_time(1, 1) * 1e3
        verify = {n: roofline.step_time(1, n) * 1e3 for n in NS}
        return cls(verify, {m: c * t1 for m in WIDTHS}, {m: (c if e is None else e) * t1 for m in WIDTHS},
                   threads=0, device="roofline")


@dataclass
class Pick:
    """A tuner's choice: the settings, the predicted τ and pass cost (one-token passes), speedup = τ / cost."""

    settings: dict
    tau: float
    cost: float
    costs: Costs = field(repr=False)

    @property
    def speedup(self) -> float:
        return self.tau / self.cost


@torch.inference_mode()
def measure(target, draft=None, eagle=None, context: int = 128, rounds: int = 10, threads: int | None = None,
            seed: int = 0) -> Costs:
    """Time the forwards the tuner needs, in a shuffled order each round (after a warm-up round), each where the
    decoding loop makes it: a target pass right after a drafter's forward, a draft forward right after a target pass
    (each model's weights partly pushed out of the caches by the other's, as in the loop), plain decoding's step
    right after another step. The minimum over the rounds (`measure.best_times`, the course's one timer), made
    non-decreasing in the number of tokens.

    target at every n in NS; the draft model (when given) and the EAGLE net (when given) at every m in WIDTHS,
    each after `context` cached tokens. threads: run at this many torch threads (None: as now).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        device = next(target.parameters()).device
        gen = torch.Generator().manual_seed(seed)
        vocab = target.config.get_text_config().vocab_size
        prefix = torch.randint(0, vocab, (1, context), generator=gen).to(device)  # [1, context]
        new = torch.randint(0, vocab, (1, max(NS)), generator=gen).to(device)  # [1, 64]
        caches = {"verify": lm.new_cache(target)}
        lm.forward(target, prefix, caches["verify"])
        calls, drafters = [("step", 1)] + [("verify", n) for n in NS], []
        if draft is not None:
            caches["draft"] = lm.new_cache(draft)
            lm.forward(draft, prefix, caches["draft"])
            calls, drafters = calls + [(k, m) for k in ("draft", "draft+") for m in WIDTHS], drafters + ["draft"]
        if eagle is not None:
            caches["eagle"] = lm.new_cache()
            H = eagle.hidden
            feature = torch.randn(1, context + max(WIDTHS), H, generator=gen).to(device, eagle.fc.weight.dtype)
            eagle(feature[:, :context], prefix, torch.arange(context), None, caches["eagle"])
            calls, drafters = calls + [(k, m) for k in ("eagle", "eagle+") for m in WIDTHS], drafters + ["eagle"]

        model_of = {"step": "verify", "draft+": "draft", "eagle+": "eagle"}  # calls that run the same forward

        def run(kind: str, n: int) -> None:
            kind = model_of.get(kind, kind)
            if kind == "verify":
                lm.forward(target, new[:, :n], caches[kind])  # [1, n, V]
            elif kind == "draft":
                lm.forward(draft, new[:, :n], caches[kind])
            else:  # a level: the net over n nodes, the LM head, the log-probabilities the tree grows from
                level = torch.cat([torch.ones(n, context, dtype=torch.bool), torch.eye(n, dtype=torch.bool)], 1)
                out = eagle(feature[:, context:context + n], new[:, :n], torch.full((n,), context), level,
                            caches[kind])  # [1, n, H]: n siblings, each seeing the cache and itself
                F.log_softmax(eagle.logits(out).float(), -1)

        def crop(call: tuple[str, int]) -> None:
            lm.crop(caches[model_of.get(call[0], call[0])], context)

        # what runs just before each call in the loop (untimed): drafting before a pass, a pass before the first
        # level of drafting (a small one: the chains'), a level before the next, a step before a step
        def prelude(kind: str, r: int) -> tuple[str, int]:
            return {"step": ("verify", 1), "verify": (drafters[r % len(drafters)], 1) if drafters else ("verify", 1),
                    "draft+": ("draft", 1), "eagle+": ("eagle", 1)}.get(kind, ("verify", 4))

        def schedule(r: int):
            for i in torch.randperm(len(calls), generator=gen).tolist():
                kind, n = calls[i]
                yield None, lambda kind=kind: (run(*prelude(kind, r)), crop(prelude(kind, r)))
                yield (kind, n), lambda kind=kind, n=n: run(kind, n)

        best = best_times(schedule, rounds, device, after=crop)

        def table(kind: str) -> dict[int, float]:  # a call over more tokens never costs less: a running maximum
            sizes = sorted(n for k, n in best if k == kind)
            return {n: max(best[kind, m] for m in sizes if m <= n) for n in sizes}

        return Costs(table("verify"), table("draft"), table("eagle"), best["step", 1], torch.get_num_threads(),
                     device.type, table("draft+"), table("eagle+"))
    finally:
        torch.set_num_threads(before)


def calibration_texts(target, tokenizer=None, new_tokens: int = 32, texts: Sequence = CALIBRATION
                      ) -> list[tuple[torch.Tensor, int]]:
    """[(ids [1, T + new], T)]: each calibration text followed by the target's own greedy continuation.

    texts: strings (then a tokenizer is needed) or [1, T] id tensors.
    """
    device = next(target.parameters()).device
    out = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt").input_ids if isinstance(text, str) else text
        ids = ids.to(device)
        want = generate(target, ids, None, max_new_tokens=new_tokens).tokens
        out.append((torch.cat([ids, torch.tensor([want], device=device)], 1), ids.shape[1]))
    return out


def tree_acceptance(ranks: list[list[int]], branching: Sequence[int], span: int = 8) -> float:
    """Mean drafts a static top-k tree accepts under greedy verification, from the teacher-forced ranks: starting
    at each position t, level l holds the target's token when its rank at t + l is below branching[l], and the
    pass accepts the levels up to the first that does not. Exact for greedy top-k trees along the target's text
    (the draft on an accepted path reads the true text); unlike chapter 04's model it keeps the correlation
    between neighbouring positions (hard tokens come in runs). The positions: those with `span` tokens after
    them, the same for every tree up to `span` deep."""
    total, count = 0, 0
    for r in ranks:
        for t in range(len(r) - span + 1):
            total += next((l for l, b in enumerate(branching) if r[t + l] >= b), len(branching))
            count += 1
    return total / count


@torch.inference_mode()
def eagle_acceptance(target, net, texts: list[tuple[torch.Tensor, int]], max_depth: int = 8, topks: Sequence[int] = (1, 2, 4),
                     max_budget: int = 64) -> dict[int, list[list[float]]]:
    """{k: acc} with acc[d][b] = EAGLE-2's mean accepted drafts with k children per expanded node, depth d and a
    budget of b nodes (0 where d or b is 0). k = 1 is a chain: the draft's greedy guesses, as EAGLE-1 drafts.

    Teacher-forced on the target's greedy text: at every continuation position each drafter (its cache holding
    true pairs only, as in decoding) grows its full candidate pool `max_depth` deep once; a (d, b) tree is the
    best b of the candidates shallower than d (`select_nodes`' rule), and it accepts the leading nodes of the
    pool's path along the target's tokens that it kept. Averaged over every position, not only where a pass
    begins: close to what decoding sees (a test checks one position against a real pass).
    """
    acc = {}
    for k in topks:
        drafter = EagleDrafter(net, dynamic=True, topk=k, depth=max_depth)
        total, count = [[0.0] * (max_budget + 1) for _ in range(max_depth + 1)], 0
        for full, T in texts:
            drafter.start(target, full[:, :T])
            _, states = lm.forward(target, full, hidden=True)  # the target's states at every position
            rows = tuple(h[0] for h in states)  # layers x [T + n, H]
            for t in range(T, full.shape[1] - max_depth + 1):  # pending token full[t - 1]; drafts predict full[t:]
                drafter.commit(full[:, :t], 0, [], tuple(h[drafter.n_true:t - 1] for h in rows))
                for d, ranks in enumerate(_path_ranks(*drafter.pool(max_depth), full[0, t:t + max_depth].tolist())):
                    for b in range(1, max_budget + 1):  # accepted: the leading path nodes ranked inside the budget
                        total[d][b] += next((j for j, r in enumerate(ranks) if r >= b), len(ranks))
                count += 1
        acc[k] = [[x / count for x in row] for row in total]
    return acc


def _path_ranks(tokens: list[int], parents: list[int], scores: list[float], want: list[int]) -> list[list[int]]:
    """ranks[d]: for a tree of depth d, the rank (by score, ties to the lower index) among the candidates shallower
    than d of each pool node on the path that spells `want`, root first (ranks[0] = [])."""
    path, node = [], -1
    for y in want:  # siblings hold distinct tokens: at most one child matches
        node = next((i for i in range(len(tokens)) if parents[i] == node and tokens[i] == y), None)
        if node is None:
            break
        path.append(node)
    depth = tree_depths(parents)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    ranks = [[]]
    for d in range(1, len(want) + 1):
        rank = {i: r for r, i in enumerate(i for i in order if depth[i] < d)}
        ranks.append([rank[i] for i in path[:d]])
    return ranks


def predict_tree(costs: Costs, ranks: list[list[int]], branching: Sequence[int]) -> Pick:
    """A draft-model tree's predicted τ = 1 + `tree_acceptance` and pass cost: v(1 + nodes) plus one draft forward
    per level over that level's frontier (1 token right after the pass, then the nodes of the level before)."""
    widths, width = [1], 1
    for b in branching[:-1]:
        width *= b
        widths.append(width)
    cost = costs.v(1 + economics.tree_nodes(branching)) + sum(costs.c(w, after_pass=not i) for i, w in enumerate(widths))
    return Pick({"branching": list(branching)}, 1 + tree_acceptance(ranks, branching), cost, costs)


def best_tree(costs: Costs, ranks: list[list[int]], chain: bool = False, max_depth: int = 8, max_branch: int = 4,
              max_nodes: int = 64) -> Pick:
    """The draft-model tree with the best `predict_tree` speedup among the non-increasing branchings (chains only
    with chain=True). Ties go to the tree found first: the narrower, shallower one."""
    best = None
    for branching in branchings(max_nodes, max_depth, 1 if chain else max_branch, non_increasing=True):
        pick = predict_tree(costs, ranks, branching)
        if best is None or pick.speedup > best.speedup + 1e-12:
            best = pick
    return best


def predict_eagle(costs: Costs, acceptance: dict[int, list[list[float]]], topk: int, depth: int, budget: int) -> Pick:
    """EAGLE-2's predicted τ = 1 + acc[topk][depth][budget] and pass cost: v(1 + budget), the commit's forward
    over about τ true pairs, and depth - 1 levels over the top-k frontier."""
    tau = 1 + acceptance[topk][depth][budget]
    cost = costs.v(1 + budget) + costs.e(tau) + (depth - 1) * costs.e(topk, after_pass=False)
    return Pick({"topk": topk, "depth": depth, "budget": budget}, tau, cost, costs)


def best_eagle(costs: Costs, acceptance: dict[int, list[list[float]]]) -> Pick:
    """EAGLE-2's top-k, depth and budget with the best `predict_eagle` speedup (ties: the first found, smaller)."""
    best = None
    for k, acc in acceptance.items():
        for d in range(1, len(acc)):
            for b in range(1, len(acc[d])):
                pick = predict_eagle(costs, acceptance, k, d, b)
                if best is None or pick.speedup > best.speedup + 1e-12:
                    best = pick
    return best


# ---- Medusa's tree: from the heads' measured top-k accuracies, no clock -------------------------------------


def medusa_choices(topk: dict[int, Sequence[float]], nodes: int = 24) -> tuple[list[tuple[int, ...]], float]:
    """The tree of `nodes` choices with the most expected accepted tokens, from measured top-k accuracies.

    topk: {k: [top-k accuracy of head 0, head 1, ...]} for k = 1, 2, ..., kmax (`training.head_accuracy` with
    ks=range(1, kmax + 1)). Head h's rank-r token is right with probability p[h][r] = top-(r+1) - top-r; taking
    the heads as independent (Cai et al. 2024 do the same), the path (r0, r1, ...) is accepted whole with
    probability p[0][r0] * p[1][r1] * ..., and the tree's expected accepted tokens are the sum of its paths'.
    A path is never likelier than its prefix, so the `nodes` likeliest paths form a tree: that one is the best.
    Returns (choices sorted by (len, path), expected accepted tokens per step, the bonus token not counted).
    """
    ks = sorted(topk)
    if ks != list(range(1, len(ks) + 1)):
        raise ValueError(f"topk must hold k = 1, 2, ..., kmax; got {ks}")
    heads = len(topk[1])
    p = [[topk[k][h] - (topk[k - 1][h] if k > 1 else 0.0) for k in ks] for h in range(heads)]  # [K][kmax]
    paths, frontier = {}, [((), 1.0)]
    for depth in range(heads):  # every path up to the heads' depth, pruned to the likeliest `nodes` per level
        frontier = sorted(((c + (r,), q * p[depth][r]) for c, q in frontier for r in range(len(ks))),
                          key=lambda cq: -cq[1])[:nodes]
        paths.update(frontier)
    best = sorted(paths.items(), key=lambda cq: (-cq[1], len(cq[0]), cq[0]))[:nodes]
    return sorted((c for c, _ in best), key=lambda c: (len(c), c)), sum(q for _, q in best)


def medusa_card(topk: dict[int, Sequence[float]]) -> dict:
    """The entries of a heads' config.json that MedusaDrafter takes its tree from: the top-k accuracies
    (`training.head_accuracy` with ks=medusa.TOPK), the tuned choices and their expected accepted tokens per step."""
    choices, expected = medusa_choices(topk)
    return {"val_topk_vs_target": {k: [round(a, 4) for a in v] for k, v in topk.items()}, "choices": choices,
            "expected_accepted": round(expected, 3)}


# ---- tuned drafters: measured once per (models, device, threads), then remembered ---------------------------

_PICKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {key: Pick, costs, texts or ranks}


def _calibration_ids(target, tokenizer=None) -> list[torch.Tensor]:
    """The calibration texts in the target's vocabulary: with `tokenizer`, or the one saved beside the target's
    weights (the zoo's, a Hub checkpoint's); without one, fixed random prompts the target then continues."""
    if tokenizer is None:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(target.name_or_path, local_files_only=True)
        except Exception:  # no tokenizer files there: random prompts still give the target's own continuations
            tokenizer = None
    if tokenizer is not None:
        return [tokenizer(text, return_tensors="pt").input_ids for text in CALIBRATION]
    vocab = target.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (1, 24), generator=gen) for _ in CALIBRATION]


def _memo(target, key, make):
    """make(), computed once per target, key, thread count and device."""
    picks = _PICKS.setdefault(target, {})
    key = key + (torch.get_num_threads(), str(next(target.parameters()).device))
    if key not in picks:
        picks[key] = make()
    return picks[key]


def auto_draft_model(target, draft, chain: bool = False, tokenizer=None) -> tuple[DraftModelDrafter, Pick]:
    """(a DraftModelDrafter, its Pick): the chain (chain=True) or static tree for this pair on this device, from
    `measure`, `measure.draft_ranks` on the calibration texts and `best_tree`. The pick is remembered per (target, draft,
    device, threads): a second call measures nothing."""
    def make():  # the chain and the tree share one measurement and one set of ranks
        costs = _memo(target, ("costs", id(draft)), lambda: measure(target, draft=draft))
        ranks = _memo(target, ("ranks", id(draft)), lambda: draft_ranks(draft, _texts(target, tokenizer)))
        return best_tree(costs, ranks, chain=chain)
    pick = _memo(target, ("chain" if chain else "tree", id(draft)), make)
    return DraftModelDrafter(draft, branching=pick.settings["branching"]), pick


def auto_eagle(target, net, tokenizer=None) -> tuple[EagleDrafter, Pick]:
    """(an EAGLE-2 EagleDrafter, its Pick): the top-k, depth and budget for this target and net on this device,
    from `measure`, `eagle_acceptance` on the calibration texts and `best_eagle`. Remembered per (target, net,
    device, threads)."""
    def make():
        return best_eagle(measure(target, eagle=net), eagle_acceptance(target, net, _texts(target, tokenizer)))
    pick = _memo(target, ("eagle", id(net)), make)
    return EagleDrafter(net, dynamic=True, **pick.settings), pick


def _texts(target, tokenizer):
    """The target's greedy continuations of the calibration texts, once per target: every tuner reads them."""
    return _memo(target, ("texts",), lambda: calibration_texts(target, texts=_calibration_ids(target, tokenizer),
                                                              new_tokens=40))
