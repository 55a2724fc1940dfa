"""Chapter 06's graders (exercises/06_eagle.ipynb): EAGLE's draft network, tree expansion and training.

All three run the learner's code on a small random `eagle.EagleNet` over a random 2-layer Llama and compare
with the library:

1. `check_eagle_forward`: fc([embed(next token), feature]) -> one decoder layer -> the target's LM head,
   against the net's own forward; hints for the concatenation order and a skipped layer or head.
2. `check_expand`: EAGLE-2's expansion step, the k best children by cumulative log-probability
   (`eagle.expand_step`).
3. `check_ttt_unroll`: EAGLE-3's training-time test, each unrolled step reading the draft's own previous
   outputs shifted by one, through one cache (`training.unroll`); hints for true features, no shift, no cache.
4. `check_dynamic_tree`: a whole EAGLE-2 tree grown from a deterministic fake draft (`next_logp`, log-probs
   for any path of tokens), against the library's own `EagleDrafter._dynamic` run on the same fake draft;
   trees are compared as sets of token paths (any order with parents first passes); hints for a frontier
   chosen by the children's own log-probs, one level too many or too few, a pool holding only the frontier,
   a kept node whose parent was dropped, parents not re-indexed to the kept nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_lab import lm
from specdec_lab.eagle import EagleDrafter, EagleNet, expand_step
from specdec_lab.training import ttt_mask, unroll
from specdec_lab.grading._common import call, check, grader, passed, seeded


def _eagle_case(version: int = 1, seed: int = 0):
    """A random 2-layer Llama target (vocab 50, hidden 32) and an EagleNet with random weights for it."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    target = LlamaForCausalLM(config).eval()
    net = EagleNet(target, version, heads=4, mlp=48)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=seeded(seed + 1)) * 0.2)
    return target, net.eval()


@grader
def check_eagle_forward(eagle_forward: Callable) -> None:
    """Exercise 06.1: eagle_forward(net, feature [B, T, H], tokens [B, T]) -> (out [B, T, H], logits [B, T, V])."""
    target, net = _eagle_case()
    g = seeded(5)
    feature = torch.randn(2, 6, 32, generator=g)  # [B, T, H]
    tokens = torch.randint(0, 50, (2, 6), generator=g)  # [B, T] the token after each position
    with torch.no_grad():
        got = call(eagle_forward, net, feature, tokens)
        want_out = net(feature, tokens, torch.arange(6))
        want_logits = net.logits(want_out)
    check(isinstance(got, (tuple, list)) and len(got) == 2, f"return (out, logits), got {type(got).__name__}")
    out, logits = got
    check(isinstance(out, Tensor) and out.shape == (2, 6, 32),
          f"out should be [B, T, H] = [2, 6, 32], got {getattr(out, 'shape', out)}")
    check(isinstance(logits, Tensor) and logits.shape == (2, 6, 50),
          f"logits should be [B, T, V] = [2, 6, 50] (the target's LM head over out), got {getattr(logits, 'shape', logits)}")
    if not torch.allclose(out, want_out, atol=1e-4):
        with torch.no_grad():
            swapped = net.layer(net.fc(torch.cat([feature, net._embed(tokens)], -1)), torch.arange(6))
            no_layer = net.fc(torch.cat([net._embed(tokens), feature], -1))
        check(not torch.allclose(out, swapped, atol=1e-4), "you concatenated [feature, embedding]: the fc was "
              "trained on [embed(tokens), feature], in that order (torch.cat([..], dim=-1))")
        check(not torch.allclose(out, no_layer, atol=1e-4), "out is fc's output: run it through net.layer(x, "
              "positions) too, with positions = torch.arange(T)")
        check(False, "out differs from net.layer(net.fc(cat([embed(tokens), feature], -1)), arange(T)); "
              "check the concatenation dim (-1) and the positions")
    check(torch.allclose(logits, want_logits, atol=1e-4), "logits must be the target's LM head over out "
          "(net.logits(out)), not over the feature or fc's output")
    passed("exercise 1: fc([embed(next token), feature]) -> one decoder layer -> the target's LM head")


@grader
def check_expand(expand: Callable) -> None:
    """Exercise 06.2: expand(scores [m], logp [m, V], k) -> the k best children (rows, tokens, scores), best first."""
    g = seeded(6)
    for m, V, k in [(1, 10, 3), (3, 12, 3), (4, 9, 2)]:
        scores = -torch.rand(m, generator=g) * 3  # [m] cumulative log-probs of the frontier
        logp = torch.log_softmax(torch.randn(m, V, generator=g) * 2, -1)  # [m, V]
        got = call(expand, scores, logp, k)
        check(isinstance(got, (tuple, list)) and len(got) == 3, f"return (rows, tokens, scores), got {got!r}")
        rows, tokens, sc = (torch.as_tensor(x).reshape(-1) for x in got)
        w_rows, w_tokens, w_sc = (x[:k] for x in expand_step(scores, logp, k))
        check(len(rows) == len(tokens) == len(sc) == k, f"m={m}, k={k}: keep exactly k = {k} children in all "
              f"(the best of the m * k candidates), got {len(rows)}, {len(tokens)}, {len(sc)}")
        if not torch.allclose(sc.double(), w_sc.double(), atol=1e-5):
            own = logp.reshape(-1).topk(k).values
            check(not torch.allclose(sc.double(), own.double(), atol=1e-5), f"m={m}: the scores are the children's own "
                  "log-probs: add each parent's score (the cumulative log-prob of the whole path)")
            check(False, f"m={m}, k={k}: scores {sc.tolist()}, expected {w_sc.tolist()} (parent score + child "
                  "log-prob, best first)")
        check(rows.tolist() == w_rows.tolist() and tokens.tolist() == w_tokens.tolist(),
              f"m={m}, k={k}: (rows, tokens) {list(zip(rows.tolist(), tokens.tolist()))}, expected "
              f"{list(zip(w_rows.tolist(), w_tokens.tolist()))}: rows index the frontier, tokens the vocabulary")
    passed("exercise 2: children scored by cumulative log-prob; the k best of m * k kept")


@grader
def check_ttt_unroll(ttt_unroll: Callable) -> None:
    """Exercise 06.3: ttt_unroll(net, feature [B, T, H], tokens [B, T], steps) -> outputs of every unrolled step."""
    _, net = _eagle_case(version=3, seed=2)
    g = seeded(7)
    feature = torch.randn(1, 7, 32, generator=g)
    tokens = torch.randint(0, 50, (1, 7), generator=g)
    with torch.no_grad():
        got = call(ttt_unroll, net, feature, tokens, 3)
        want = unroll(net, feature, tokens, 3)
    check(isinstance(got, (list, tuple)) and len(got) == 3, f"return a list with one [B, T, H] output per step "
          f"(3 here), got {type(got).__name__} of length {len(got) if hasattr(got, '__len__') else '?'}")
    check(all(isinstance(o, Tensor) and o.shape == (1, 7, 32) for o in got), "each step's output is [B, T, H]")
    check(torch.allclose(got[0], want[0], atol=1e-4), "step 0 is the ordinary causal pass over the TRUE features "
          "(positions arange(T), mask ttt_mask(T, 0))")
    if not torch.allclose(got[1], want[1], atol=1e-4):
        with torch.no_grad():
            cache = lm.new_cache()
            net(feature, tokens, torch.arange(7), ttt_mask(7, 0), cache)
            no_shift = net(want[0], tokens, torch.arange(7), ttt_mask(7, 1), cache)
            fresh = net(torch.cat([torch.zeros_like(want[0][:, :1]), want[0][:, :-1]], 1), tokens, torch.arange(7))
            cache = lm.new_cache()
            net(feature, tokens, torch.arange(7), ttt_mask(7, 0), cache)
            shifted_true = net(torch.cat([torch.zeros_like(feature[:, :1]), feature[:, :-1]], 1), tokens,
                               torch.arange(7), ttt_mask(7, 1), cache)
        check(not torch.allclose(got[1], shifted_true, atol=1e-4), "step 1 reads the TRUE features shifted: feed the "
              "draft's own outputs of the previous step instead, as drafting must (that is the training-time test)")
        check(not torch.allclose(got[1], no_shift, atol=1e-4), "step 1 feeds position p the output at p - 1 (the "
              "feature the draft predicted for p): shift the previous outputs right by one, zeros at position 0")
        check(not torch.allclose(got[1], fresh, atol=1e-4), "step 1 ran without the cache of step 0: keep ONE KVCache "
              "for all steps and pass ttt_mask(T, i), so a drafted position sees the true features before it")
        check(False, "step 1 differs: input = previous step's outputs shifted right by one (zeros first), same "
              "tokens and positions, mask ttt_mask(T, 1), the same cache")
    check(torch.allclose(got[2], want[2], atol=1e-4), "step 2 differs: each step reads the step before it, not the "
          "true features or step 0")
    passed("exercise 3: each unrolled step reads the draft's own previous outputs, as drafting does")


# ---- exercise 06.4: the whole dynamic tree -------------------------------------------------------------------


def fake_draft(vocab: int, seed: int, sharpness: float = 1.5) -> Callable:
    """A deterministic stand-in for the draft network: next_logp(paths) -> log-probs [m, V], one row per path
    (a tuple of token ids below the root; () is the root), the same row whenever the same path is asked for."""

    def next_logp(paths) -> Tensor:
        rows = []
        for path in paths:
            key = seed
            for t in path:
                key = (key * 1000003 + int(t) + 1) % 2**31
            rows.append(torch.log_softmax(torch.randn(vocab, generator=seeded(key)) * sharpness, -1))
        return torch.stack(rows)  # [m, V]

    return next_logp


def _library_tree(next_logp: Callable, topk: int, depth: int, budget: int) -> tuple[list[int], list[int]]:
    """EAGLE-2's tree as the library grows it: `EagleDrafter._dynamic` with `next_logp` standing in for the
    draft's forward. Returns the kept (tokens, parents)."""
    def feed(grower, out):  # the drafter's one forward over the frontier, replaced by the fake draft
        return out, next_logp([_path(grower.tokens, grower.parents, i) for i in grower.frontier])

    stub = SimpleNamespace(topk=topk, budget=budget, n_true=0, root=torch.zeros(1), _feed=feed,
                           net=SimpleNamespace(logits=lambda out: next_logp([()])))
    stub.pool = lambda d: EagleDrafter.pool(stub, d)  # the candidate pool, grown by the library's own code
    tree = EagleDrafter._dynamic(stub, depth)
    return tree.tokens, tree.parents


def _path(tokens, parents, i) -> tuple:
    """The tokens from the root down to node i."""
    out = []
    while i >= 0:
        out.append(tokens[i])
        i = parents[i]
    return tuple(reversed(out))


def _paths(tokens, parents) -> list[tuple]:
    return [_path(tokens, parents, i) for i in range(len(tokens))]


def _variant_tree(next_logp, topk, depth, budget, frontier_by="cumulative", pool="all", raw=False):
    """The kept paths under a rule with one thing changed (a typical mistake), for the hints. raw: instead,
    the kept (tokens, parents) in grown order with the parents left as indices among ALL grown nodes."""
    paths, scores, own, parents = [], [], [], []
    frontier = [-1]
    for _ in range(max(depth, 0)):
        logp = next_logp([paths[f] if f >= 0 else () for f in frontier]).float()  # [m, V]
        base = torch.tensor([scores[f] if f >= 0 else 0.0 for f in frontier])  # [m]
        top = logp.topk(topk, -1)  # [m, k]
        cand = (base[:, None] + top.values).reshape(-1)  # [m * k]
        local = top.values.reshape(-1)
        order = cand.argsort(descending=True, stable=True).tolist()
        chosen = (order if frontier_by == "cumulative" else local.argsort(descending=True, stable=True).tolist())[:topk]
        new = {}
        for c in order:
            if pool == "all" or c in chosen:
                f = frontier[c // topk]
                new[c] = len(paths)
                parents.append(f)
                paths.append((paths[f] if f >= 0 else ()) + (int(top.indices.reshape(-1)[c]),))
                scores.append(float(cand[c]))
                own.append(float(local[c]))
        frontier = [new[c] for c in chosen]
    keep = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:budget]
    if raw:
        keep = sorted(keep)
        return [paths[i][-1] for i in keep], [parents[i] for i in keep]
    return {paths[i] for i in keep}


DYNAMIC_CASES = [  # topk, depth, budget, vocab, seed
    (2, 3, 5, 10, 11), (3, 4, 10, 12, 12), (4, 5, 16, 16, 13), (2, 6, 7, 8, 14), (3, 2, 20, 9, 15), (1, 4, 3, 7, 16),
    (3, 5, 40, 11, 17),
]


@grader
def check_dynamic_tree(dynamic_tree: Callable) -> None:
    """Exercise 06.4: dynamic_tree(next_logp, topk, depth, budget) -> (tokens, parents) of EAGLE-2's tree."""
    for topk, depth, budget, V, seed in DYNAMIC_CASES:
        draft = fake_draft(V, seed)
        asked = []

        def next_logp(paths, draft=draft, asked=asked):
            paths = [tuple(int(t) for t in p) for p in paths]
            asked.extend(paths)
            return draft(paths)

        case = f"dynamic_tree(next_logp, topk={topk}, depth={depth}, budget={budget})"
        got = call(dynamic_tree, next_logp, topk, depth, budget)
        check(isinstance(got, (tuple, list)) and len(got) == 2, f"return (tokens, parents), got {got!r}")
        tokens, parents = ([int(x) for x in torch.as_tensor(v).reshape(-1).tolist()] for v in got)
        want_tokens, want_parents = _library_tree(draft, topk, depth, budget)
        grown = _variant_tree(draft, topk, depth, budget=10**9)  # every node the tree grows
        want = set(_paths(want_tokens, want_parents))
        deepest = max((len(p) for p in asked), default=-1)
        check(deepest < depth, f"one level too many: {case} asked next_logp about a path of {deepest} tokens; "
              f"the tree has {depth} levels, so the deepest frontier is at depth {depth - 1}")
        check(len(tokens) == len(parents), f"{case}: {len(tokens)} tokens but {len(parents)} parents; one of each "
              "per kept node")
        check(len(tokens) <= budget, f"keep at most budget nodes: {case} returned {len(tokens)}")
        raw = _variant_tree(draft, topk, depth, budget, raw=True)
        check((tokens, parents) != raw or raw[1] == want_parents, f"parents not re-indexed: in {case} the parents "
              "are indices among all the nodes grown; map each to its index among the KEPT nodes (-1: the root)")
        if not all(-1 <= p < i for i, p in enumerate(parents)):
            check(False, _parent_hint(case, parents))
        paths = _paths(tokens, parents)
        if set(paths) == want and len(paths) == len(want):
            continue
        twice = next((p for i, p in enumerate(paths) if p in paths[:i]), None)
        check(twice is None, f"a kept node's parent was dropped, or a node joined twice: {case} holds the path "
              f"{list(twice or ())} twice; keep every kept node's ancestors, and each candidate once")
        hints = [(dict(frontier_by="local"), "frontier chosen by local score: expand the k children with the best "
                  "CUMULATIVE log-prob (the whole path's), not the best log-prob of their own"),
                 (dict(depth=depth - 1), "one level too few: grow exactly depth levels below the root"),
                 (dict(depth=depth + 1), "one level too many: grow exactly depth levels below the root"),
                 (dict(pool="frontier"), "only the expanded nodes joined the tree: every level's m·k children are "
                  "candidates for the final selection, not only the k that get expanded")]
        for change, hint in hints:
            args = dict(topk=topk, depth=depth, budget=budget) | change
            if set(paths) == _variant_tree(draft, **args) != want:
                check(False, f"{hint} ({case})")
        dropped = [p for p in paths if p not in grown]
        check(not dropped, f"a kept node's parent was dropped: {case} holds the path "
              f"{list(dropped[0]) if dropped else ''}, "
              "which the tree never grew; keep every kept node's ancestors and map each parent to its index among "
              "the kept nodes")
        missing = sorted(want - set(paths), key=len)
        check(not missing or len(paths) >= len(want), f"{case} kept {len(paths)} nodes, expected {len(want)}: the "
              "budget best of all grown nodes (or all of them, if fewer)")
        check(False, f"{case}: your tree lacks the path {list(missing[0]) if missing else '?'}: keep the budget "
              "nodes with the best cumulative log-prob of all the tree grew")
    passed("exercise 4: EAGLE-2's dynamic tree, level by level from the k best paths, then the budget best nodes")


def _parent_hint(case, parents) -> str:
    """Hint for parents that are not -1 or an earlier index of the returned list."""
    bad = next(i for i, p in enumerate(parents) if not -1 <= p < i)
    tree = all(-1 <= p < len(parents) for p in parents)
    for i in range(len(parents)):  # a tree in another order: every node reaches the root
        seen, j = 0, i
        while tree and j >= 0 and seen <= len(parents):
            j, seen = parents[j], seen + 1
        tree = tree and j < 0
    if not tree:
        return (f"parents not re-indexed: in {case}, node {bad}'s parent is {parents[bad]}; map each parent to its "
                "index among the KEPT nodes (-1 for the root)")
    return (f"parents first: in {case}, node {bad}'s parent is {parents[bad]}; list the kept nodes with every "
            "parent before its children (the order they were grown in does that)")
