"""Draft trees: what every drafter proposes and the verifier checks, in ONE target forward.

Derived in notebooks/04_tree_attention.ipynb.

A drafter returns a `DraftTree`: node i holds a token, the index of its parent node (-1 for a child of the
last committed token) and, for drafters that sample, the distribution q_i the token was drawn from.
Parents always come before their children. A chain (one child per node) is the case of chapter 03.

The target reads the tree as one sequence: each node attends to the committed text, its ancestors and
itself (`tree_mask`, the course's one mask builder), at position len(text) + depth (`tree_positions`), so every
node's logits equal those of its own path computed alone. Drafters that grow a tree one forward per level share
`TreeBuilder` (the frontier, its children, its mask). `verify_tree` is the one verifier, for chains and trees;
the target cache then keeps the accepted path's K/V (`lm.keep`, a gather), with no recomputation.

One index convention: a DraftTree's nodes come AFTER the committed text, parent -1 meaning "child of the last
committed (pending) token", and the target's pass over the pending token and the tree has row 0 at the pending
token and row i + 1 at node i, so node i's children are tested against row i + 1. Chapter 04 also draws the
ROOTED tree, the pending token as node 0 and node i as node i + 1 (`rooted`, the layout of exercise 04.2): the same
pass, numbered from the pending token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product

import torch
from torch import Tensor

from specdec_lab import checks, lm
from specdec_lab.sampling import Warp, verify_candidates, verify_chain

__all__ = ["DraftTree", "branchings", "tree_mask", "tree_depths", "tree_positions", "tree_forward", "tree_logits",
           "TreeBuilder", "branching_parents", "choices_parents", "full_choices", "count_nodes", "rooted",
           "verify_tree_greedy", "verify_tree_sampling", "typical_threshold", "verify_tree_typical",
           "verify_tree"]


@dataclass
class DraftTree:
    """Drafted tokens arranged as a tree over the last committed token.

    tokens: n token ids. parents: n parent indices, -1 for a child of the last committed token, otherwise
    an earlier node. q: [n, V] the distribution each node's token was sampled from, or None when the
    drafter is deterministic (greedy, top-k picks, prompt lookup): the verifier then treats the siblings
    as distinct deterministic picks. Siblings sampled from q must share their q row (drawn i.i.d.).
    """

    tokens: list[int]
    parents: list[int]
    q: Tensor | None = field(default=None, repr=False)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise checks.ArgumentError(f"a tree needs one parent per token, got {len(self.tokens)} tokens and "
                                       f"{len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise checks.ArgumentError(f"node {i} has parent {parent}: parents must be -1 or an earlier node")
        if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != len(self.tokens)):
            raise checks.ArgumentError(f"q must be [n, V] with n = {len(self.tokens)} nodes, got {list(self.q.shape)}")

    @classmethod
    def chain(cls, tokens: Sequence[int], q: Tensor | None = None) -> DraftTree:
        """γ tokens in a row: node i is the child of node i - 1 (node 0 of the committed text)."""
        tokens = [int(t) for t in tokens]
        return cls(tokens, list(range(-1, len(tokens) - 1)), q)

    @property
    def is_chain(self) -> bool:
        """True when every node is the only child of the node before it (an empty tree is a chain too)."""
        return self.parents == list(range(-1, len(self.parents) - 1))

    @property
    def depth(self) -> int:
        """Drafted tokens on the longest root-to-leaf path: the most one target pass can accept."""
        return max(tree_depths(self.parents), default=-1) + 1

    def __len__(self) -> int:
        return len(self.tokens)


# ---- shape: mask, depths, positions -----------------------------------------------------------------


def tree_depths(parents: Sequence[int]) -> list[int]:
    """depth[i] = number of ancestors of node i inside the tree (0 for a child of the committed text)."""
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def tree_mask(parents: Sequence[int]) -> Tensor:
    """[n, n] bool: mask[i, j] is True when node j is node i itself or one of its ancestors."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)  # [n, n] every node sees itself
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]  # ... and everything its parent sees (parents come first)
    return mask


def tree_positions(parents: Sequence[int], offset: int = 0) -> Tensor:
    """[n] position ids: offset + depth. Siblings share a position, as they would in their own paths."""
    return offset + torch.tensor(tree_depths(parents), dtype=torch.long)


# ---- one forward over the tree -------------------------------------------------------------------------


def tree_forward(model, new_ids: Tensor, parents: Sequence[int], tokens: Sequence[int], cache, hidden: bool = False):
    """Feed the uncached committed tokens new_ids [1, k] (k >= 1) and a tree after them in ONE forward.

    The cache holds the committed text before new_ids (`past` positions). The k new tokens attend causally;
    each tree node attends to all committed tokens, its ancestors and itself, at position past + k + depth.
    Returns [n + 1, V] float32 logits: row 0 at the last committed token (it predicts the depth-0 nodes),
    row i + 1 at node i. The cache grows by k + n positions; `lm.keep` keeps the accepted ones.
    hidden=True: (logits, hidden states), HF's tuple of [1, k + n, H] per layer (see lm.forward).
    """
    k, past = new_ids.shape[1], lm.cache_len(cache)
    # the k committed tokens are a chain and the tree hangs off the last of them: ONE tree over k + n tokens
    everything = list(range(-1, k - 1)) + [k - 1 if p < 0 else p + k for p in parents]
    mask = tree_mask(everything)  # [k+n, k+n] causal among the committed; each node: all of them, its path
    positions = tree_positions(everything, past)  # [k+n] past .. past+k-1, then past + k + depth
    x = torch.cat([new_ids, torch.as_tensor([list(tokens)], dtype=torch.long, device=new_ids.device)], 1)
    if hidden:
        logits, states = lm.forward(model, x, cache, positions=positions, mask=mask, hidden=True)
        return logits[0, k - 1:], states  # [n+1, V], layers x [1, k+n, H]
    return lm.forward(model, x, cache, positions=positions, mask=mask)[0, k - 1:]  # [n+1, V]


@torch.no_grad()
def tree_logits(model, prefix_ids: Tensor, tokens: Sequence[int], parents: Sequence[int]) -> Tensor:
    """[n, V] the logits at every node of a tree after prefix_ids [1, T]: the prefix cached, then one forward.

    Row i equals the last-position logits of an ordinary forward over prefix + the path to node i.
    """
    cache = lm.new_cache(model)
    if prefix_ids.shape[1] > 1:
        lm.forward(model, prefix_ids[:, :-1], cache)  # cache the prefix but its last token
    return tree_forward(model, prefix_ids[:, -1:], parents, tokens, cache)[1:]  # [n, V]


# ---- static shapes ---------------------------------------------------------------------------------------


class TreeBuilder:
    """A draft tree grown one level per drafter forward: the draft-model tree, EAGLE's static and dynamic trees.

    `frontier` holds the nodes whose children come next ([-1]: the root, the last committed token). The
    drafter reads the frontier's logits (one row per frontier node), then `grow` adds children: child i holds
    tokens[i] under frontier row rows[i]. `feed` hands the next frontier to the drafter as one forward: each
    node sees the `base` cached committed positions, its ancestors among the nodes fed before, and itself,
    at position base + depth; the nodes fed so far are `fed`, in cache order.
    """

    def __init__(self, base: int = 0):
        self.base, self.tokens, self.parents = base, [], []
        self.rows: list[int] = []  # rows[i]: the row of node i's parent in the frontier it grew from
        self.frontier, self.fed = [-1], []

    def grow(self, rows: Sequence[int], tokens: Sequence[int]) -> list[int]:
        """Add child tokens[i] under frontier row rows[i]; returns the new nodes (the caller picks the frontier)."""
        new = list(range(len(self.tokens), len(self.tokens) + len(tokens)))
        self.parents += [self.frontier[r] for r in rows]
        self.tokens += [int(t) for t in tokens]
        self.rows += [int(r) for r in rows]
        return new

    def grow_each(self, kids: Sequence[Sequence[int]]) -> None:
        """kids[r]: the child tokens of frontier row r; all the children become the new frontier."""
        self.frontier = self.grow([r for r, ks in enumerate(kids) for _ in ks], [t for ks in kids for t in ks])

    def feed(self) -> tuple[list[int], Tensor, Tensor]:
        """The frontier as the drafter's next input: (tokens [m], positions [m], mask [m, base + fed + m])."""
        f, slot = self.frontier, {node: j for j, node in enumerate(self.fed)}  # slot: a fed node's cache index
        up = [self.ancestors(i) for i in f]  # each frontier node's ancestors: all fed already
        seen = [(r, self.base + slot[a]) for r, ancestors in enumerate(up) for a in ancestors]
        mask = torch.zeros(len(f), self.base + len(self.fed) + len(f), dtype=torch.bool)  # [m, base + fed + m]
        mask[:, :self.base] = True  # the committed text
        if seen:  # the fed ancestors on each node's path
            mask[torch.tensor([r for r, _ in seen]), torch.tensor([c for _, c in seen])] = True
        mask[:, self.base + len(self.fed):] = torch.eye(len(f), dtype=torch.bool)  # itself
        self.fed = self.fed + f
        return [self.tokens[i] for i in f], self.base + torch.tensor([len(a) for a in up]), mask

    def ancestors(self, i: int) -> list[int]:
        """Node i's ancestors in the tree, nearest first (their number is its depth)."""
        out = []
        while self.parents[i] >= 0:
            i = self.parents[i]
            out.append(i)
        return out

    def tree(self, q: Tensor | None = None) -> DraftTree:
        return DraftTree(self.tokens, self.parents, q)


def branching_parents(branching: Sequence[int]) -> list[int]:
    """Parents of the full tree where every node of level l has branching[l] children, level by level.

    [2, 2, 1, 1] -> 2 + 4 + 4 + 4 = 14 nodes; a chain of depth γ is [1] * γ.
    """
    grower = TreeBuilder()
    for b in checks.branching(branching):
        grower.grow_each([[0] * b] * len(grower.frontier))  # the tokens do not matter here
    return grower.parents


def count_nodes(branching: Sequence[int]) -> int:
    """Nodes (root excluded) of the full tree with this branching: sum over levels of prod(branching[:l+1])."""
    return len(branching_parents(branching))


def branchings(max_nodes: int, max_depth: int = 8, max_branch: int = 4, exact: bool = False,
               non_increasing: bool = False) -> list[list[int]]:
    """Every branching list (entries 1..max_branch, 1..max_depth levels) whose full tree has at most `max_nodes`
    nodes (exact=True: exactly that many), depth first: [1], [1, 1], ... The course's one enumerator of static
    tree shapes: chapter 06 compares every tree of 24 nodes with EAGLE-2's; the tuner (non_increasing=True: each
    level at most as wide as the one before) searches the draft model's. [4, 1, 1, 1, 1, 1] has 24 nodes."""
    out = []

    def grow(branching, width, nodes):
        if branching and (nodes == max_nodes or not exact):
            out.append(list(branching))
        for b in range(1, (branching[-1] if branching and non_increasing else max_branch) + 1):
            if len(branching) < max_depth and nodes + width * b <= max_nodes:
                grow(branching + [b], width * b, nodes + width * b)

    grow([], 1, 0)
    return out


def choices_parents(choices: Sequence[Sequence[int]]) -> list[int]:
    """Parents for Medusa-style choices: each choice is a path of child ranks, e.g. (0,), (1,), (0, 0), (0, 1).

    Node i is choices[i]; its token will be the choices[i][-1]-th best candidate of head len(choices[i]) - 1.
    Choices must be sorted so every path's prefix comes before it (sort by (len, path) does that).
    """
    index = {(): -1}
    parents = []
    for i, c in enumerate(choices):
        c = tuple(c)
        if not c or c in index or c[:-1] not in index:
            raise checks.ArgumentError(f"choice {i} {c!r}: every choice must be a new, non-empty path whose prefix "
                                       f"{c[:-1]!r} appears earlier; sort choices by (len, path)")
        parents.append(index[c[:-1]])
        index[c] = i
    return parents


def full_choices(branching: Sequence[int]) -> list[tuple[int, ...]]:
    """The choices list of the full tree with this branching, in the order branching_parents numbers it."""
    levels = [list(product(*(range(b) for b in branching[: d + 1]))) for d in range(len(branching))]
    return [c for level in levels for c in level]


# ---- verification ----------------------------------------------------------------------------------------


def rooted(tree: DraftTree, root_token: int) -> tuple[list[int], list[int]]:
    """(parents, tokens) with the last committed token as node 0 and the drafts as nodes 1..n: chapter 04's
    drawing and exercise 04.2's layout (the verifiers below walk the DraftTree itself)."""
    return [-1] + [p + 1 for p in tree.parents], [int(root_token)] + list(tree.tokens)


def _children(tree: DraftTree) -> list[list[int]]:
    """kids[i + 1] = the nodes whose parent is node i, kids[0] the pending token's: the same index as the row of
    the target's logits at that parent."""
    kids: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, parent in enumerate(tree.parents):
        kids[parent + 1].append(i)
    return kids


def verify_tree_greedy(tree: DraftTree, target_logits: Tensor) -> tuple[list[int], int]:
    """Walk down from the pending token, accepting a child only if its token is the target's argmax at its parent.

    target_logits [n + 1, V]: row 0 at the pending token, row i + 1 at node i. Returns (path, bonus): the accepted
    nodes from the top down, and the target's argmax after the deepest of them (the pending token if none).
    """
    best = target_logits.argmax(-1).tolist()  # [n + 1] the target's choice at the pending token and after each node
    kids, path, row = _children(tree), [], 0  # row: the deepest accepted node + 1
    while True:
        match = next((c for c in kids[row] if tree.tokens[c] == best[row]), None)
        if match is None:
            return path, best[row]
        path.append(match)
        row = match + 1


def verify_tree_sampling(tree: DraftTree, p: Tensor, generator: torch.Generator | None = None
                         ) -> tuple[list[int], int]:
    """Exact multi-round rejection down the tree; the emitted text is distributed as the target's.

    p: [n + 1, V] target probabilities at the pending token and after each node. tree.q: [n, V] the distribution
    each node was drawn from, siblings drawn i.i.d. from their shared row; None: every set of siblings is distinct
    deterministic picks. At each node the children are tested one after another with
    `sampling.verify_candidates`; the first accepted one becomes the new node. When all are rejected the residual
    draw ends the walk; at a leaf the bonus token is drawn from p there.
    """
    kids, path, row = _children(tree), [], 0
    while True:
        if not kids[row]:
            return path, int(torch.multinomial(p[row], 1, generator=generator))  # bonus token
        q = None if tree.q is None else tree.q[kids[row][0]]  # [V] the siblings' shared proposal
        if q is not None and not all(torch.equal(tree.q[c], q) for c in kids[row][1:]):
            raise checks.ArgumentError(f"the children of node {row - 1} have different q rows: sampled siblings must "
                                       "be drawn i.i.d. from one distribution (or q=None for deterministic picks)")
        index, token = verify_candidates(p[row], [tree.tokens[c] for c in kids[row]], q, generator)
        if index is None:
            return path, token  # every child rejected: the residual's draw ends this pass
        path.append(kids[row][index])
        row = path[-1] + 1


def typical_threshold(p: Tensor, threshold: float = 0.09, alpha: float = 0.3) -> Tensor:
    """Typical acceptance's bar for target distributions p [.., V]: min(threshold, alpha * exp(-H(p)))."""
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [..]
    return torch.minimum(torch.full_like(entropy, threshold), alpha * torch.exp(-entropy))


def verify_tree_typical(tree: DraftTree, p: Tensor, threshold: float = 0.09, alpha: float = 0.3,
                        generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Medusa's typical acceptance down the tree: LOSSY, the output is no longer the target's.

    A child is accepted when the target gives its token more than min(threshold, alpha * exp(-H(p))) at
    its parent (p [n + 1, V] as in `verify_tree_sampling`); the first such child (in index order) is followed.
    The walk ends with a token drawn from p at the deepest accepted node. Confident targets (low entropy) demand a
    high probability, uncertain ones accept any plausible token: longer acceptance, at the price of exactness
    (chapter 05 measures how much).
    """
    bar = typical_threshold(p, threshold, alpha).tolist()  # [n + 1]
    kids, path, row = _children(tree), [], 0
    while True:
        match = next((c for c in kids[row] if float(p[row, tree.tokens[c]]) > bar[row]), None)
        if match is None:
            return path, int(torch.multinomial(p[row], 1, generator=generator))
        path.append(match)
        row = match + 1


def verify_tree(logits: Tensor, tree: DraftTree, warp: Warp, typical: tuple[float, float] | None = None,
                draws: list[float] | None = None) -> tuple[list[int], list[int]]:
    """The one verifier: (accepted node indices of `tree`, emitted tokens) from the target's logits [n + 1, V].

    Row 0 is the target at the last committed token, row i + 1 at node i. The emitted tokens are the accepted
    nodes' tokens then one corrected or bonus token. A chain (chapter 03): greedy keeps the leading drafts
    equal to the target's argmax (tensor ops, no random numbers), sampling is `sampling.verify_chain`. A tree
    (chapter 04): the walk down from the root, greedy or multi-round rejection. typical=(threshold, alpha)
    switches sampling to Medusa's lossy typical acceptance; greedy decoding stays exact either way. draws: a list
    that receives the uniforms a sampled chain's accept test drew (to show the test that decided).
    """
    if tree.is_chain and typical is None:
        if warp.greedy:
            best = logits.argmax(-1)  # [γ+1] the target's choice after the pending token and after each draft
            drafts = torch.as_tensor(tree.tokens, dtype=best.dtype, device=best.device)  # [γ]
            n = int((best[:len(tree)] == drafts).cumprod(0).sum())  # leading drafts equal to the target's argmax
            emitted = best[: n + 1].tolist()  # accepted drafts (equal to best there), then the target's own token
        else:
            emitted = verify_chain(warp.probs(logits), tree.q, tree.tokens, warp.generator, draws)  # [γ+1, V], [γ, V]
        return list(range(len(emitted) - 1)), emitted
    if warp.greedy:
        path, last = verify_tree_greedy(tree, logits)
    elif typical is not None:
        path, last = verify_tree_typical(tree, warp.probs(logits), *typical, warp.generator)
    else:
        path, last = verify_tree_sampling(tree, warp.probs(logits), warp.generator)
    return path, [tree.tokens[j] for j in path] + [last]
