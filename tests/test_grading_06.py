"""Chapter 06's graders: they pass right answers and name the mistake in wrong ones."""
import torch
from helpers import grader_tests, stub_rows

from specdec_lab import grading, lm
from specdec_lab.eagle import expand_step
from specdec_lab.training import ttt_mask, unroll


def _forward(order="embed first", layer=True, head="out"):
    def eagle_forward(net, feature, tokens):
        e = net._embed(tokens)
        x = net.fc(torch.cat([e, feature] if order == "embed first" else [feature, e], -1))
        o = net.layer(x, torch.arange(tokens.shape[1])) if layer else x
        return o, net.logits(o if head == "out" else x)
    return eagle_forward


def _expand(cumulative=True, per_parent=False):
    def expand(scores, logp, k):
        top = logp.topk(k, -1)
        cand = (scores[:, None] + top.values if cumulative else top.values).reshape(-1)
        order = cand.argsort(descending=True, stable=True)
        order = order if per_parent else order[:k]
        return torch.div(order, k, rounding_mode="floor"), top.indices.reshape(-1)[order], cand[order]
    return expand


def _unroll(shift=True, shared_cache=True, true_features=False):
    def ttt_unroll(net, feature, tokens, steps):
        T = feature.shape[1]
        cache, outs, first = lm.new_cache(), [], feature
        for i in range(steps):
            if i:
                prev = first if true_features else outs[-1]
                feature = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], 1) if shift else prev
            if shared_cache:
                outs.append(net(feature, tokens, torch.arange(T), ttt_mask(T, i), cache))
            else:
                outs.append(net(feature, tokens, torch.arange(T)))
        return outs
    return ttt_unroll


def _tree(frontier_by="cumulative", levels=0, pool="all", reindex=True, select_by="cumulative", order="index",
          batched=True):
    """EAGLE-2's dynamic tree as a learner might write it; each keyword is one typical mistake."""
    def dynamic_tree(next_logp, topk, depth, budget):
        tokens, parents, scores, own, paths = [], [], [], [], []
        frontier = [-1]
        for _ in range(depth + levels):
            asked = [paths[f] if f >= 0 else () for f in frontier]
            logp = next_logp(asked) if batched else torch.cat([next_logp([a]) for a in asked])
            base = torch.tensor([scores[f] if f >= 0 else 0.0 for f in frontier])
            top = logp.topk(topk, -1)
            cand = (base[:, None] + top.values).reshape(-1)
            local = top.values.reshape(-1)
            order_ = cand.argsort(descending=True, stable=True).tolist()
            chosen = (order_ if frontier_by == "cumulative" else local.argsort(descending=True).tolist())[:topk]
            new = {}
            for c in order_:
                if pool == "all" or c in chosen:
                    f = frontier[c // topk]
                    new[c] = len(tokens)
                    t = int(top.indices.reshape(-1)[c])
                    tokens.append(t)
                    parents.append(f)
                    scores.append(float(cand[c]))
                    own.append(float(local[c]))
                    paths.append((paths[f] if f >= 0 else ()) + (t,))
            frontier = [new[c] for c in chosen]
        key = scores if select_by == "cumulative" else own
        best = sorted(range(len(key)), key=lambda i: -key[i])[:budget]
        keep = sorted(best, reverse=order != "index")
        index = {old: new for new, old in enumerate(keep)}
        if not reindex:
            return [tokens[i] for i in keep], [parents[i] for i in keep]
        return [tokens[i] for i in keep], [index.get(parents[i], -1) for i in keep]
    return dynamic_tree


def test_tree_reference_is_the_library(capsys):
    from specdec_lab.grading.ch06 import DYNAMIC_CASES, _library_tree, _paths, _variant_tree, fake_draft
    for topk, depth, budget, V, seed in DYNAMIC_CASES:
        draft = fake_draft(V, seed)
        tokens, parents = _library_tree(draft, topk, depth, budget)
        assert set(_paths(tokens, parents)) == _variant_tree(draft, topk, depth, budget)
        assert len(tokens) == min(budget, topk + (depth - 1) * topk * topk)


def test_tree_cases_have_no_near_ties():
    from specdec_lab.grading.ch06 import DYNAMIC_CASES, _variant_tree, fake_draft
    for topk, depth, budget, V, seed in DYNAMIC_CASES:
        draft = fake_draft(V, seed)
        scores = []
        frontier, paths = [()], {}
        for _ in range(depth):
            logp = draft(frontier)
            nxt = []
            for path, row in zip(frontier, logp):
                top = row.topk(topk)
                for v, t in zip(top.values.tolist(), top.indices.tolist()):
                    paths[path + (t,)] = paths.get(path, 0.0) + v
                    nxt.append(path + (t,))
            frontier = sorted(nxt, key=lambda p: -paths[p])[:topk]
        s = sorted(paths.values(), reverse=True)
        assert all(a - b > 1e-4 for a, b in zip(s, s[1:])), (topk, depth, budget)


WRONG = [
    (grading.check_eagle_forward, _forward(order="feature first"), "concatenated [feature, embedding]"),
    (grading.check_eagle_forward, _forward(layer=False), "run it through net.layer"),
    (grading.check_eagle_forward, _forward(head="x"), "LM head over out"),
    (grading.check_eagle_forward, lambda net, f, t: (f, f), "logits should be"),
    (grading.check_expand, _expand(cumulative=False), "add each parent's score"),
    (grading.check_expand, _expand(per_parent=True), "keep exactly k"),
    (grading.check_ttt_unroll, _unroll(shift=False), "shift the previous outputs right by one"),
    (grading.check_ttt_unroll, _unroll(shared_cache=False), "keep ONE KVCache"),
    (grading.check_ttt_unroll, _unroll(true_features=True), "draft's own outputs"),
    (grading.check_ttt_unroll, lambda net, f, t, steps: [net(f, t, torch.arange(f.shape[1]))],
     "one [B, T, H] output per step"),
    (grading.check_dynamic_tree, _tree(frontier_by="local"), "frontier chosen by local score"),
    (grading.check_dynamic_tree, _tree(levels=1), "one level too many"),
    (grading.check_dynamic_tree, _tree(levels=-1), "one level too few"),
    (grading.check_dynamic_tree, _tree(pool="frontier"), "only the expanded nodes joined the tree"),
    (grading.check_dynamic_tree, _tree(reindex=False), "parents not re-indexed"),
    (grading.check_dynamic_tree, _tree(select_by="local"), "parent was dropped"),
    (grading.check_dynamic_tree, _tree(order="reversed"), "parents first"),
    (grading.check_dynamic_tree, lambda f, k, d, b: _tree()(f, k, d, b + 1), "keep at most budget"),
    *stub_rows(grading.check_eagle_forward, grading.check_expand, grading.check_ttt_unroll,
               grading.check_dynamic_tree),
]

RIGHT = [
    (grading.check_eagle_forward, _forward()),
    (grading.check_expand, _expand()),
    (grading.check_expand, lambda s, l, k: tuple(x[:k] for x in expand_step(s, l, k))),
    (grading.check_ttt_unroll, _unroll()),
    (grading.check_ttt_unroll, unroll),
    (grading.check_dynamic_tree, _tree()),
    (grading.check_dynamic_tree, _tree(batched=False)),
]


test_graders = grader_tests(WRONG, RIGHT)
