"""Chapter 04's graders (exercises/04_tree_attention.ipynb): tree drafts and tree attention.

1. `check_mask_positions`: a tree's attention mask (each node sees its ancestors and itself) and position ids
   (offset + depth) on hand-made and random trees, against `tree.tree_mask` and `tree.tree_positions`.
2. `check_verify_tree_greedy`: the greedy walk down a tree, accepting a child whose token is the target's
   argmax at its parent, then the bonus token, against `tree.verify_tree_greedy` on 33 trees.
3. `check_tree_size`: the node count of a full tree (`economics.tree_nodes`) and the cost of verifying it
   at a batch size on chapter 02's roofline (`Roofline.verify_cost`).
4. `check_multi_round`: two candidates drawn from q, verified in two rounds of rejection sampling: the emitted
   token must follow p (chi-square); `_two_round_outcomes` gives the exact distributions of three typical
   wrong rules, so the hint can name the one the learner wrote.

5. `check_tree_forward_compact`: one forward over a rooted tree after a cached prefix (tiny random Llama, fp32):
   every node's logits must equal a fresh forward of the prefix and its root-to-node path alone (atol 1e-4), and
   after compaction to an accepted path the cache must give the next token's logits of a fresh forward of the
   committed text; the library's forwards with wrong positions or masks, and a crop instead of a gather, name the
   mistake.

The wrong answers the hints name are the mistakes themselves (a transposed or causal mask, positions by
index, a child compared with its own row, a verify pass without the pending token).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from specdec_lab import economics, lm, tree
from specdec_lab.economics import QWEN25_7B_ON_H100
from specdec_lab.grading._common import (P_VALUE_MIN, call, check, chi_square, counts_of, fmt, grader, one_thread,
                                         passed, seeded, tiny_llama, token)
from specdec_lab.sampling import residual as _residual


def _random_tree(n: int, g: torch.Generator) -> list[int]:
    """A random tree of n nodes, parents before children (-1: a child of the committed text)."""
    return [int(torch.randint(-1, i, (1,), generator=g)) if i else -1 for i in range(n)]


@grader
def check_mask_positions(mask_and_positions: Callable) -> None:
    """Exercise 04.1: mask_and_positions(parents, offset) -> (mask [n, n] bool, positions [n])."""
    g = seeded(40)
    cases = [([-1, 0, 1], 0), ([-1, 0, 0, 1, 1, 2], 10), ([-1, -1, -1], 4), ([-1, -1, 0, 0, 1, 1, 2, 3], 25),
             ([-1, 0, 1, 1, 0, 4], 3)] + [(_random_tree(n, g), 7) for n in (9, 14, 20)]
    for parents, offset in cases:
        case = f"parents = {parents}, offset = {offset}"
        out = call(mask_and_positions, list(parents), offset)
        check(isinstance(out, (tuple, list)) and len(out) == 2,
              f"mask_and_positions should return two tensors (mask, positions), got {out!r}")
        mask, positions = (torch.as_tensor(x) for x in out)
        n = len(parents)
        want = tree.tree_mask(parents)
        depth = torch.tensor(tree.tree_depths(parents))
        want_positions = tree.tree_positions(parents, offset)
        check(tuple(mask.shape) == (n, n), f"{case}: the mask should be [n, n] = [{n}, {n}], got {list(mask.shape)}")
        mask = mask.bool()
        if not torch.equal(mask, want):
            eye = torch.eye(n, dtype=torch.bool)
            check(not torch.equal(mask, want.T), f"{case}: your mask is transposed: row i must be what node i "
                  "attends to (its ancestors and itself), not the nodes that attend to it")
            check(not torch.equal(mask, want & ~eye), f"{case}: the diagonal is missing: a node attends to itself")
            check(not torch.equal(mask, torch.ones(n, n, dtype=torch.bool).tril()),
                  f"{case}: that is a causal mask: node i would see every node before it, siblings and cousins "
                  "included; it may see only its ancestors and itself")
            parent_only = eye.clone()
            for i, p in enumerate(parents):
                if p >= 0:
                    parent_only[i, p] = True
            check(not torch.equal(mask, parent_only), f"{case}: node i sees only itself and its parent; it must "
                  "see ALL its ancestors (the parent's parent too, up to the first level)")
            i, j = ((mask != want).nonzero()[0]).tolist()
            check(False, f"{case}: mask[{i}, {j}] is {bool(mask[i, j])}, expected {bool(want[i, j])} (node {j} "
                  f"{'is' if want[i, j] else 'is not'} node {i} or an ancestor of it)")
        check(positions.dim() == 1 and len(positions) == n, f"{case}: positions should be [n] = [{n}], got shape "
              f"{list(positions.shape)}")
        positions = positions.long()
        if not torch.equal(positions, want_positions):
            check(not torch.equal(positions, offset + torch.arange(n)), f"{case}: positions {positions.tolist()} "
                  "are the flattened indices; a node's position is offset + its depth (siblings share a position)")
            check(not torch.equal(positions, depth) or offset == 0, f"{case}: positions {positions.tolist()} are "
                  "the depths; add the prefix length `offset`")
            check(not torch.equal(positions, offset + depth + 1), f"{case}: positions {positions.tolist()} are one "
                  "too high: a child of the committed text (parent -1) has depth 0 and sits at position `offset`")
            check(False, f"{case}: positions {positions.tolist()}, expected {want_positions.tolist()} (offset + depth)")
    passed(f"exercise 1: tree mask (ancestors and self) and positions (offset + depth) right on {len(cases)} trees")


def _greedy_tree_case(parents: list[int], g: torch.Generator, vocab: int = 12, follow: float = 0.8):
    """Distinct sibling tokens and logits whose argmax often (`follow`) matches one of a node's children."""
    n = len(parents)
    children = [[c for c in range(n) if parents[c] == i] for i in range(n)]
    tokens = [int(torch.randint(0, vocab, (1,), generator=g))] + [0] * (n - 1)
    for i in range(n):
        picks = torch.randperm(vocab, generator=g)[: len(children[i])].tolist()
        for c, t in zip(children[i], picks):
            tokens[c] = t
    logits = torch.randn(n, vocab, generator=g)
    for i in range(n):
        if children[i] and float(torch.rand(1, generator=g)) < follow:
            c = children[i][int(torch.randint(0, len(children[i]), (1,), generator=g))]
            logits[i, tokens[c]] = 5.0  # the target agrees with child c
    return tokens, logits


def rooted_walk(parents: list[int], tokens: list[int], target_logits) -> tuple[list[int], int]:
    """`tree.verify_tree_greedy` in exercise 04.2's rooted layout: (path from node 0, bonus)."""
    drafts = tree.DraftTree(list(tokens[1:]), [p - 1 for p in parents[1:]])  # node i + 1 -> DraftTree node i
    path, bonus = tree.verify_tree_greedy(drafts, target_logits)
    return [0] + [j + 1 for j in path], bonus


def _walk_own_row(parents: list[int], tokens: list[int], best: list[int]):
    """A typical mistake: the greedy walk comparing each child with the argmax of its OWN row."""
    path = [0]
    while True:
        node = path[-1]
        match = [c for c in range(len(parents)) if parents[c] == node and tokens[c] == best[c]]
        if not match:
            return path, best[node]
        path.append(match[0])


@grader
def check_verify_tree_greedy(verify_tree_greedy: Callable) -> None:
    """Exercise 04.2: verify_tree_greedy(parents, tokens, target_logits) -> (path, bonus)."""
    g = seeded(41)
    shapes = [[-1, 0, 0, 1, 1, 2, 2], [-1, 0, 1, 2, 3], [-1, 0, 0, 0, 1, 2, 3, 4, 5, 6]]
    shapes += [[-1] + [p + 1 for p in _random_tree(n, g)] for n in (8, 12, 16, 20, 25)]
    cases = [(parents, *_greedy_tree_case(parents, g)) for parents in shapes for _ in range(4)]
    # exercise 04.2's worked example by hand: the target predicts 8 after the root, 3 after node 2, 4 after node 4
    hand_logits = torch.full((6, 10), -1.0)
    for node, best in [(0, 8), (1, 2), (2, 3), (3, 0), (4, 4), (5, 5)]:
        hand_logits[node, best] = 1.0
    cases.insert(0, ([-1, 0, 0, 1, 2, 2], [0, 7, 8, 1, 3, 9], hand_logits))
    deepest = 0
    for parents, tokens, logits in cases:
        case = f"parents = {parents}, tokens = {tokens}"
        out = call(verify_tree_greedy, list(parents), list(tokens), logits.clone())
        check(isinstance(out, (tuple, list)) and len(out) == 2,
              f"{case}: verify_tree_greedy should return (path, bonus), got {out!r}")
        path, bonus = out
        path = [int(i) for i in path]
        best = logits.argmax(-1).tolist()
        right, own_row = rooted_walk(parents, tokens, logits), _walk_own_row(parents, tokens, best)
        check((path, int(bonus)) == right or (path, int(bonus)) != own_row, f"{case}: you compare each child's "
              "token with the argmax of ITS OWN row; row i predicts the token AFTER node i, so compare a child's "
              "token with the argmax of its parent's row")
        check(len(path) > 0 and path[0] == 0, f"{case}: the path {path} should start at the root, node 0 (the "
              "committed token)")
        for a, b in zip(path, path[1:]):
            check(parents[b] == a, f"{case}: path {path} goes from node {a} to node {b}, which is not its child: "
                  "only a child of the last accepted node can be accepted")
            if tokens[b] != best[a]:
                check(tokens[b] != best[b], f"{case}: you accepted node {b} because its token equals the argmax of "
                      f"ITS OWN row; row i predicts the token AFTER node i, so compare a child's token with the "
                      f"argmax of its parent's row ({a})")
                check(False, f"{case}: node {b} (token {tokens[b]}) was accepted, but the target's argmax after "
                      f"node {a} is {best[a]}: accept a child only if its token equals that argmax")
        last = path[-1]
        match = [c for c in range(len(parents)) if parents[c] == last and tokens[c] == best[last]]
        check(not match, f"{case}: your path {path} stops at node {last}, but its child {match[0] if match else ''} "
              f"carries the target's argmax {best[last]} after node {last}: keep walking down while a child matches "
              "(row i of target_logits predicts the token after node i)")
        check(int(bonus) == best[last], f"{case}: bonus {int(bonus)}; it should be the target's argmax after the "
              f"deepest accepted node {last}, which is {best[last]}"
              + (" (you took it at the root)" if int(bonus) == best[0] else ""))
        deepest = max(deepest, len(path) - 1)
    passed(f"exercise 2: greedy tree verification right on {len(cases)} trees (up to {deepest} drafts accepted)")


@grader
def check_tree_size(count_nodes: Callable[[list[int]], int], verify_cost: Callable[[list[int], int], float]) -> None:
    """Exercise 04.3: node count of a branching; a verify pass's cost at a batch size."""
    gpu = QWEN25_7B_ON_H100
    for branching in ([2, 2, 1, 1], [3, 3, 2], [1, 1, 1, 1], [4], [2, 3, 1, 2], [1, 5, 1]):
        got = call(count_nodes, list(branching))
        want = economics.tree_nodes(branching)
        widths = [math.prod(branching[: l + 1]) for l in range(len(branching))]
        if got != want:
            check(got != want + 1, f"count_nodes({branching}) = {got} counts the root; count draft nodes only")
            check(got != widths[-1], f"count_nodes({branching}) = {got} counts only the last level; add every level")
            check(got != sum(branching), f"count_nodes({branching}) = {got} is the sum of the branching factors; "
                  "level l has b0·b1·…·bl nodes (every node of the level above has bl children)")
            check(False, f"count_nodes({branching}) = {got}, expected {want}, levels of {widths} nodes (notebook 04, "
                  "section 7)")
    for branching, batch in [([2, 2, 1, 1], 1), ([2, 2, 1, 1], 64), ([3, 3, 2], 64), ([1, 1, 1, 1], 128),
                             ([3, 3, 2], 256), ([4, 2], 16)]:
        n = economics.tree_nodes(branching)
        got = float(call(verify_cost, list(branching), batch))
        want = gpu.verify_cost(n, batch)  # step_time(batch, 1 + n) / step_time(batch, 1)
        if abs(got - want) > 1e-3 * want:
            case = f"verify_cost({branching}, batch={batch}) = {got:.4g}"
            check(abs(got - gpu.step_time(batch, n) / gpu.step_time(batch, 1)) > 1e-6, f"{case}: the pass also "
                  "reads the pending token (node 0): 1 + nodes tokens per request")
            check(abs(got - gpu.step_time(batch, 1) / gpu.step_time(batch, 1 + n)) > 1e-6, f"{case} is upside "
                  "down: divide the pass's time by the decode step's")
            check(abs(got - gpu.step_time(batch, batch * (1 + n)) / gpu.step_time(batch, 1)) > 1e-6, f"{case}: "
                  "step_time(batch, tokens_per_request) already multiplies by the batch; pass 1 + nodes per request")
            check(False, f"{case}, expected {want:.4g} = step_time(batch, 1 + nodes) / step_time(batch, 1) "
                  "(notebook 04, section 7)")
    passed("exercise 3: [2, 2, 1, 1] has 14 nodes, [3, 3, 2] has 30; at batch 64 verifying them costs "
           f"{gpu.verify_cost(14, 64):.1f} and {gpu.verify_cost(30, 64):.1f} decode steps")


# Exercise 4's distributions (notebook 04's Monte Carlo uses the same pair; the exercise notebook shows neither).
MULTI_P = [0.35, 0.25, 0.2, 0.12, 0.08]
MULTI_Q = [0.05, 0.45, 0.3, 0.05, 0.15]


def _two_round_outcomes(p: Tensor, q: Tensor) -> dict[str, Tensor]:
    """Exact output distributions of three typical wrong rules, two candidates drawn from q (the right
    rule's is p itself)."""
    r1 = _residual(p, q)
    first = torch.minimum(p, q)  # P(round 1 emits x) = q(x) min(1, p(x)/q(x))
    miss1 = 1 - first.sum()
    second = torch.minimum(r1, q)
    miss2 = 1 - second.sum()
    return {
        "naive": first + miss1 * first + miss1 ** 2 * r1,  # both against p, then residual(p, q)
        "fallback p": first + miss1 * (second + miss2 * p),
        "fallback first residual": first + miss1 * (second + miss2 * r1),
    }


@grader
def check_multi_round(multi_round: Callable) -> None:
    """Exercise 04.4: multi_round(p, q, x1, x2, generator) -> token; x1, x2 drawn i.i.d. from q; exact for p."""
    g = seeded(42)
    flat = torch.full((4,), 0.25)
    for _ in range(50):
        x1, x2 = torch.multinomial(flat, 2, replacement=True, generator=g).tolist()
        got = token(multi_round, flat, flat, x1, x2, g)
        check(got == x1, f"p == q == {fmt(flat)}, candidates ({x1}, {x2}): returned {got}. When p == q the first "
              "candidate always passes u·q(x) < p(x), so return x1")
    p, q = torch.tensor(MULTI_P), torch.tensor(MULTI_Q)
    for _ in range(50):  # token 0: p(0) = 0.35 > q(0) = 0.05, always accepted in round 1
        got = token(multi_round, p, q, 0, 1, g)
        check(got == 0, f"p = {MULTI_P}, q = {MULTI_Q}, candidates (0, 1): returned {got}, but p(0) > q(0), so "
              "the first candidate is always accepted")
    draws = 20_000
    xs = torch.multinomial(q, 2 * draws, replacement=True, generator=g).view(draws, 2).tolist()
    out = [token(multi_round, p, q, x1, x2, g) for x1, x2 in xs]
    counts = counts_of(out, len(p))
    _, pvalue = chi_square(counts, p)
    if pvalue < P_VALUE_MIN:
        freq = fmt((counts / draws).tolist())
        for name, dist in _two_round_outcomes(p, q).items():
            if chi_square(counts, dist)[1] > 1e-3:
                hint = {
                    "naive": "you tested the second candidate against the ORIGINAL p: after x1 is rejected, the "
                             "target becomes r = residual(p, q), and x2 must pass u·q(x2) < r(x2)",
                    "fallback p": "when both candidates are rejected, draw from the residual of the residual, "
                                  "residual(residual(p, q), q), not from p",
                    "fallback first residual": "when both candidates are rejected, draw from what round 2 leaves, "
                                               "residual(r, q) with r = residual(p, q), not from r itself",
                }[name]
                check(False, f"over {draws} draws your tokens have frequencies {freq}, p is {MULTI_P} "
                      f"(chi-square p-value {pvalue:.2g}): {hint}")
        check(False, f"over {draws} draws your tokens have frequencies {freq}, not distributed as p = {MULTI_P} "
              f"(chi-square p-value {pvalue:.2g}). Round 1: accept x1 if u·q(x1) < p(x1); else p <- "
              "residual(p, q); round 2 the same with the new p; both rejected: draw from the last residual")
    passed(f"exercise 4: over {draws} draws the emitted token follows p (chi-square p-value {pvalue:.2f})")


# ---- exercise 5: one forward over the tree, then compaction ----------------------------------------------------

TREE_VOCAB = 40


def _variant_logits(model, prefix: Tensor, tokens: list[int], parents: list[int], kind: str) -> Tensor:
    """[n, V] the tree forward as a typical mistake computes it (kind "right": as it should)."""
    n, L = len(parents), prefix.shape[1]
    depth = torch.tensor(tree.tree_depths(parents))
    mask, positions = tree.tree_mask(parents), L + depth
    if kind == "index":
        positions = L + torch.arange(n)
    elif kind == "no offset":
        positions = depth
    elif kind == "plus one":
        positions = L + depth + 1
    elif kind == "causal":
        mask = torch.ones(n, n, dtype=torch.bool).tril()
    elif kind == "parent only":
        mask = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(parents):
            if p >= 0:
                mask[i, p] = True
    cache = lm.new_cache(model)
    lm.forward(model, prefix, cache)
    return lm.forward(model, torch.tensor([tokens]), cache, positions=positions, mask=mask)[0]


_TREE_HINTS = {
    "index": "the positions are prefix_len + the node's index; a node sits at prefix_len + its depth (siblings "
             "share a position, as in their own paths)",
    "no offset": "the positions are the depths alone; add the prefix length (the cache's length)",
    "plus one": "the positions are one too high: the root (node 0) comes right after the prefix, at prefix_len",
    "causal": "the mask is causal: a node would see its siblings and cousins; it may see only its ancestors and "
              "itself",
    "parent only": "a node sees only itself and its parent; it must see ALL its ancestors, up to the root",
}


@grader
def check_tree_forward_compact(forward_tree: Callable, compact: Callable) -> None:
    """Exercise 04.5: forward_tree(model, cache, tokens, parents) -> [n, V] logits; compact(cache, prefix_len, path)."""
    with one_thread(), torch.no_grad():
        _check_tree_forward_compact(forward_tree, compact)


def _check_tree_forward_compact(forward_tree: Callable, compact: Callable) -> None:
    model = tiny_llama(TREE_VOCAB, hidden=32, layers=2, seed=44)
    g = seeded(45)
    shapes = [([-1, 0, 0, 1, 1, 2], 5), ([-1, 0, 1, 2], 3), ([-1, 0, 0, 0], 7)]
    shapes += [([-1] + [p + 1 for p in _random_tree(n, g)], L) for n, L in ((7, 4), (10, 9))]
    nodes = 0
    for parents, L in shapes:
        n = len(parents)
        prefix = torch.randint(0, TREE_VOCAB, (1, L), generator=g)
        tokens = torch.randint(0, TREE_VOCAB, (n,), generator=g).tolist()
        case = f"a {L}-token prefix, parents = {parents}"
        cache = lm.new_cache(model)
        lm.forward(model, prefix, cache)
        out = call(forward_tree, model, cache, list(tokens), list(parents))
        check(isinstance(out, Tensor) and out.shape == (n, TREE_VOCAB), f"{case}: forward_tree should return "
              f"[n, V] = [{n}, {TREE_VOCAB}] logits, got {list(out.shape) if isinstance(out, Tensor) else out!r}")
        check(lm.cache_len(cache) == L + n, f"{case}: after forward_tree the cache holds {lm.cache_len(cache)} "
              f"positions; it should hold the prefix and every node ({L} + {n}): feed all nodes in ONE forward "
              "with the cache")
        ancestry = []
        for i in range(n):
            path, node = [], i
            while node >= 0:
                path.append(node)
                node = parents[node]
            ancestry.append(path[::-1])
        fresh = torch.stack([lm.forward(model, torch.cat([prefix, torch.tensor([[tokens[j] for j in path]])], 1))[0, -1]
                             for path in ancestry])  # [n, V] each node's path alone
        bad = [i for i in range(n) if not torch.allclose(out[i].float(), fresh[i], atol=1e-4)]
        if bad:
            for kind, hint in _TREE_HINTS.items():
                wrong = _variant_logits(model, prefix, tokens, parents, kind)
                if torch.allclose(out.float(), wrong, atol=1e-4):
                    check(False, f"{case}: {hint} (notebook 04, section 2)")
            i = bad[0]
            check(False, f"{case}: node {i}'s logits differ from a fresh forward of the prefix and its path "
                  f"{ancestry[i]} alone (max difference {float((out[i] - fresh[i]).abs().max()):.3g}): each node "
                  "must see the cached prefix, its ancestors and itself, at the positions it has in its own path")
        nodes += n
        # compaction: accept the path to the deepest node with the highest index (not a prefix of the nodes,
        # unless the tree is a chain), and the root alone
        for path in (ancestry[max(range(n), key=lambda i: (len(ancestry[i]), i))], [0]):
            c2 = lm.new_cache(model)
            lm.forward(model, prefix, c2)
            lm.forward(model, torch.tensor([tokens]), c2, positions=L + torch.tensor(tree.tree_depths(parents)),
                       mask=tree.tree_mask(parents))
            crop_variant = c2
            mine = cache if path != [0] else None
            if mine is None:  # the second compaction starts again from a fresh tree forward
                mine = lm.new_cache(model)
                lm.forward(model, prefix, mine)
                call(forward_tree, model, mine, list(tokens), list(parents))
            pcase = f"{case}, accepted path {path}"
            got = call(compact, mine, L, list(path))
            check(got is None, f"{pcase}: compact should change the cache in place and return None, got {got!r}")
            k = lm.cache_len(mine)
            check(k != L + n or len(path) == n, f"{pcase}: after compact the cache still holds all {L + n} "
                  "positions: keep only the prefix and the path's nodes")
            check(k == L + len(path), f"{pcase}: after compact the cache holds {k} positions; the committed text "
                  f"but its new last token is the prefix and the path's {len(path)} nodes (root included): "
                  f"{L + len(path)}")
            bonus = int(torch.randint(0, TREE_VOCAB, (1,), generator=g))
            text = torch.cat([prefix, torch.tensor([[tokens[j] for j in path] + [bonus]])], 1)
            want = lm.forward(model, text)[0, -1]  # [V] a fresh forward of the committed text
            got_next = lm.forward(model, torch.tensor([[bonus]]), mine)[0, -1]
            if not torch.allclose(got_next, want, atol=1e-4):
                lm.crop(crop_variant, L + len(path))
                first_k = lm.forward(model, torch.tensor([[bonus]]), crop_variant)[0, -1]
                check(not torch.allclose(got_next, first_k, atol=1e-4), f"{pcase}: compact kept the first "
                      f"{len(path)} slots after the prefix; the path's nodes are not those: node j's K/V sits at "
                      "prefix_len + j, keep exactly the path's (notebook 04, section 5)")
                check(False, f"{pcase}: after compact, the next token's logits differ from a fresh forward of the "
                      "committed text (max difference "
                      f"{float((got_next - want).abs().max()):.3g}): keep the prefix, then the path's nodes in order")
    passed(f"exercise 5: every one of {nodes} nodes' logits equal its path alone; after compaction the cache "
           "reads the next token as a fresh forward of the committed text")
