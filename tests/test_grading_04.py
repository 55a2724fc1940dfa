"""Chapter 04's graders: they pass right answers and name the mistake in wrong ones."""
import torch
from helpers import STUB_HINT, grader_tests, stub, stub_rows

from specdec_lab import grading, lm, tree
from specdec_lab.economics import QWEN25_7B_ON_H100 as GPU
from specdec_lab.sampling import residual


# ---- exercise 1: mask and positions ------------------------------------------------------------------


def _mask_positions(mask_kind="ancestors", position_kind="depth"):
    def mask_and_positions(parents, offset):
        n = len(parents)
        depth, mask = [], torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(parents):
            depth.append(0 if p == -1 else depth[p] + 1)
            node = i
            while node >= 0:  # climb from the node to the root, marking each one
                mask[i, node] = True
                node = parents[node]
                if mask_kind == "parent" and node >= 0 and node != parents[i]:
                    break
        if mask_kind == "transposed":
            mask = mask.T
        elif mask_kind == "no self":
            mask &= ~torch.eye(n, dtype=torch.bool)
        elif mask_kind == "causal":
            mask = torch.ones(n, n, dtype=torch.bool).tril()
        positions = {"depth": offset + torch.tensor(depth), "index": offset + torch.arange(n),
                     "no offset": torch.tensor(depth), "plus one": offset + torch.tensor(depth) + 1}[position_kind]
        return mask, positions

    return mask_and_positions


# ---- exercise 2: greedy tree verification ------------------------------------------------------------


def _walk(own_row=False, keep_walking=True, bonus_at_root=False, any_node=False):
    def verify_tree_greedy(parents, tokens, target_logits):
        best = target_logits.argmax(-1).tolist()
        path = [0]
        while True:
            node = path[-1]
            pool = range(1, len(parents)) if any_node else [c for c in range(len(parents)) if parents[c] == node]
            match = [c for c in pool if c not in path and tokens[c] == (best[c] if own_row else best[node])]
            if not match or (not keep_walking and len(path) > 1):
                return path, best[0] if bonus_at_root else best[node]
            path.append(match[0])

    return verify_tree_greedy


# ---- exercise 3: node count and verify cost ------------------------------------------------------------


def _count(kind="right"):
    def count_nodes(branching):
        widths, w = [], 1
        for b in branching:
            w *= b
            widths.append(w)
        return {"right": sum(widths), "root": sum(widths) + 1, "last": widths[-1], "sum": sum(branching)}[kind]

    return count_nodes


def _cost(kind="right"):
    def verify_cost(branching, batch):
        n = _count()(branching)
        tokens = {"right": 1 + n, "no pending": n, "times batch": batch * (1 + n)}.get(kind, 1 + n)
        ratio = GPU.step_time(batch, tokens) / GPU.step_time(batch, 1)
        return 1 / ratio if kind == "inverted" else ratio

    return verify_cost


# ---- exercise 4: multi-round rejection for two candidates ------------------------------------------------


def _multi_round(kind="right"):
    def multi_round(p, q, x1, x2, generator=None):
        u1, u2 = torch.rand(2, generator=generator).tolist()
        if u1 * q[x1] < p[x1]:
            return x1
        r1 = residual(p, q)
        if u2 * q[x2] < (p if kind == "naive" else r1)[x2]:
            return x2
        last = {"right": residual(r1, q), "naive": r1, "fallback p": p, "fallback first residual": r1,
                "fallback q": q}[kind]
        return int(torch.multinomial(last, 1, generator=generator))

    return multi_round


# ---- exercise 5: tree forward and compaction --------------------------------------------------------------


def _tree_step(positions="depth", mask_kind="ancestors", compaction="gather"):
    def forward_tree(model, cache, tokens, parents):
        n, L = len(parents), lm.cache_len(cache)
        depth = torch.tensor(tree.tree_depths(parents))
        pos = {"depth": L + depth, "index": L + torch.arange(n), "plus one": L + depth + 1,
               "no offset": depth}[positions]
        mask = tree.tree_mask(parents)
        if mask_kind == "parent":
            mask = torch.eye(n, dtype=torch.bool)
            for i, p in enumerate(parents):
                if p >= 0:
                    mask[i, p] = True
        elif mask_kind == "causal":
            mask = torch.ones(n, n, dtype=torch.bool).tril()
        return lm.forward(model, torch.tensor([tokens]), cache, positions=pos, mask=mask)[0]

    def compact(cache, prefix_len, path):
        if compaction == "gather":
            lm.gather(cache, list(range(prefix_len)) + [prefix_len + j for j in path])
        elif compaction == "first slots":
            lm.crop(cache, prefix_len + len(path))
        elif compaction == "no root":
            lm.gather(cache, list(range(prefix_len)) + [prefix_len + j for j in path[1:]])

    return forward_tree, compact


WRONG = [
    (grading.check_mask_positions, _mask_positions(mask_kind="transposed"), "transposed"),
    (grading.check_mask_positions, _mask_positions(mask_kind="no self"), "attends to itself"),
    (grading.check_mask_positions, _mask_positions(mask_kind="causal"), "causal mask"),
    (grading.check_mask_positions, _mask_positions(mask_kind="parent"), "ALL its ancestors"),
    (grading.check_mask_positions, _mask_positions(position_kind="index"), "flattened indices"),
    (grading.check_mask_positions, _mask_positions(position_kind="no offset"), "add the prefix length"),
    (grading.check_mask_positions, _mask_positions(position_kind="plus one"), "one too high"),
    (grading.check_verify_tree_greedy, _walk(own_row=True), "ITS OWN row"),
    (grading.check_verify_tree_greedy, _walk(keep_walking=False), "keep walking down"),
    (grading.check_verify_tree_greedy, _walk(bonus_at_root=True), "you took it at the root"),
    (grading.check_verify_tree_greedy, _walk(any_node=True), "not its child"),
    (grading.check_verify_tree_greedy, lambda parents, tokens, logits: ([1], 0), "start at the root"),
    (grading.check_tree_size, (_count("root"), _cost()), "counts the root"),
    (grading.check_tree_size, (_count("last"), _cost()), "only the last level"),
    (grading.check_tree_size, (_count("sum"), _cost()), "sum of the branching factors"),
    (grading.check_tree_size, (_count(), _cost("no pending")), "pending token"),
    (grading.check_tree_size, (_count(), _cost("inverted")), "upside down"),
    (grading.check_tree_size, (_count(), _cost("times batch")), "already multiplies by the batch"),
    (grading.check_multi_round, _multi_round("naive"), "ORIGINAL p"),
    (grading.check_multi_round, _multi_round("fallback p"), "not from p"),
    (grading.check_multi_round, _multi_round("fallback first residual"), "not from r itself"),
    (grading.check_multi_round, _multi_round("fallback q"), "not distributed as p"),
    (grading.check_multi_round, lambda p, q, x1, x2, generator=None: x2, "return x1"),
    (grading.check_tree_forward_compact, _tree_step(positions="index"), "prefix_len + the node's index"),
    (grading.check_tree_forward_compact, _tree_step(positions="plus one"), "one too high"),
    (grading.check_tree_forward_compact, _tree_step(positions="no offset"), "add the prefix length"),
    (grading.check_tree_forward_compact, _tree_step(mask_kind="parent"), "ALL its ancestors"),
    (grading.check_tree_forward_compact, _tree_step(mask_kind="causal"), "the mask is causal"),
    (grading.check_tree_forward_compact, _tree_step(compaction="first slots"), "kept the first"),
    (grading.check_tree_forward_compact, _tree_step(compaction="no root"), "root included"),
    (grading.check_tree_forward_compact, _tree_step(compaction="none"), "still holds all"),
    *stub_rows(grading.check_mask_positions, grading.check_verify_tree_greedy, grading.check_multi_round),
    (grading.check_tree_size, (stub, stub), STUB_HINT),
    (grading.check_tree_forward_compact, (stub, stub), STUB_HINT),
]

RIGHT = [
    (grading.check_mask_positions, _mask_positions()),
    (grading.check_verify_tree_greedy, _walk()),
    (grading.check_tree_size, (_count(), _cost())),
    (grading.check_multi_round, _multi_round()),
    (grading.check_tree_forward_compact, _tree_step()),
]


test_graders = grader_tests(WRONG, RIGHT)
