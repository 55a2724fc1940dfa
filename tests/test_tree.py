"""Tests for tree drafts (tree.py) and the tree path of generate() and DraftModelDrafter (chapter 04): masks,
shapes, caches, greedy identity over several shapes, the zoo tree's τ. The registry's tree row (greedy with EOS and
budget, exact sampling) goes through test_exactness.py."""
import pytest
import torch
from helpers import noisy_copy, prompt_ids, tiny_llama

from specdec_lab import DraftModelDrafter, generate, grading, lm, measure, zoo
from specdec_lab.sampling import Warp
from specdec_lab.tree import (DraftTree, branching_parents, choices_parents, count_nodes, full_choices,
                              tree_depths, tree_logits, tree_mask, tree_positions, verify_tree,
                              verify_tree_greedy, verify_tree_sampling)

TOL = 1e-4  # fp32: a node's logits in the tree vs its path computed alone


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(layers=3, seed=0)
    return target, noisy_copy(target, 0.05, seed=1)


def _path_tokens(parents, tokens, i):
    path = []
    while i >= 0:
        path.append(tokens[i])
        i = parents[i]
    return path[::-1]


def _random_parents(n, g):
    return [int(torch.randint(-1, i, (1,), generator=g)) if i else -1 for i in range(n)]


# ---- shapes ------------------------------------------------------------------------------------------


def test_mask_depths_positions():
    parents = [-1, 0, -1, 1, 2, 2]  # two roots' children: 0 -> 1 -> 3 and 2 -> {4, 5}
    assert tree_depths(parents) == [0, 1, 0, 2, 1, 1]
    assert tree_positions(parents, offset=10).tolist() == [10, 11, 10, 12, 11, 11]
    sees = {0: {0}, 1: {0, 1}, 2: {2}, 3: {0, 1, 3}, 4: {2, 4}, 5: {2, 5}}  # each node: itself and its ancestors
    mask = tree_mask(parents)
    for i, want in sees.items():
        assert set(mask[i].nonzero()[:, 0].tolist()) == want, f"row {i} of the tree mask"


def test_static_shapes():
    assert count_nodes([2, 2, 1, 1]) == 14 and count_nodes([3, 3, 2]) == 30  # exercise 04.3's two trees
    assert branching_parents([1, 1, 1]) == [-1, 0, 1], "branching [1] * γ is the chain"
    assert branching_parents([2, 2]) == [-1, -1, 0, 0, 1, 1]
    assert choices_parents(full_choices([2, 2, 1])) == branching_parents([2, 2, 1])
    assert choices_parents([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]) == [-1, -1, 0, 0, 1, 2]
    assert DraftTree([1, 2, 3, 4], [-1, -1, 0, 2]).depth == 3 and DraftTree.chain([]).depth == 0
    with pytest.raises(ValueError, match="prefix"):
        choices_parents([(0, 0), (0,)])
    with pytest.raises(ValueError, match="branching"):
        branching_parents([2, 0])


# ---- tree attention equals per-path computation ------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_tree_logits_equal_per_path_logits(pair, seed):
    target, _ = pair
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(3, 16, (1,), generator=g))
    parents = _random_parents(n, g)
    tokens = torch.randint(0, 300, (n,), generator=g).tolist()
    prefix = prompt_ids(seed, n=int(torch.randint(1, 12, (1,), generator=g)))
    got = tree_logits(target, prefix, tokens, parents)  # [n, V]
    for i in range(n):
        ids = torch.cat([prefix, torch.tensor([_path_tokens(parents, tokens, i)])], 1)
        want = lm.forward(target, ids)[0, -1]
        torch.testing.assert_close(got[i], want, atol=TOL, rtol=0,
                                   msg=lambda m: f"node {i} of tree {parents}: tree logits differ from its path: {m}")


@pytest.mark.skipif(not (zoo.EMBEDDED["tiny"] / "target" / "model.safetensors").exists(), reason="zoo not trained")
def test_tree_logits_on_the_zoo_target():
    target, _, _ = zoo.load_pair("tiny")
    g = torch.Generator().manual_seed(7)
    parents = _random_parents(20, g)
    tokens = torch.randint(0, 4096, (20,), generator=g).tolist()
    prefix = torch.randint(0, 4096, (1, 30), generator=g)
    got = tree_logits(target, prefix, tokens, parents)
    for i in range(20):
        want = lm.forward(target, torch.cat([prefix, torch.tensor([_path_tokens(parents, tokens, i)])], 1))[0, -1]
        torch.testing.assert_close(got[i], want, atol=TOL, rtol=0)


def test_keep_holds_exactly_the_path_kv(pair):
    target, _ = pair
    prefix = prompt_ids(3, n=9)
    parents, tokens = [-1, -1, 0, 0, 1, 3], [5, 6, 7, 8, 9, 10]
    cache = lm.new_cache(target)
    lm.forward(target, prefix[:, :-1], cache)
    from specdec_lab.tree import tree_forward
    tree_forward(target, prefix[:, -1:], parents, tokens, cache)
    lm.keep(cache, prefix.shape[1], [0, 3, 5])  # the path 5 -> 8 -> 10
    fresh = lm.new_cache(target)
    lm.forward(target, torch.cat([prefix, torch.tensor([[5, 8, 10]])], 1), fresh)
    assert lm.cache_len(cache) == lm.cache_len(fresh) == 12
    for (keys_a, values_a), (keys_b, values_b) in zip(lm.kv(cache), lm.kv(fresh)):
        torch.testing.assert_close(keys_a, keys_b, atol=TOL, rtol=0)
        torch.testing.assert_close(values_a, values_b, atol=TOL, rtol=0)


# ---- verification --------------------------------------------------------------------------------------


def test_verify_tree_greedy_contract():
    # row 0 is the pending token, row i + 1 node i: the target predicts 8 there, 3 after node 1, 4 after node 3
    tree = DraftTree([7, 8, 1, 3, 9], [-1, -1, 0, 1, 1])
    logits = torch.full((6, 10), -1.0)
    for row, best in [(0, 8), (1, 2), (2, 3), (3, 0), (4, 4), (5, 5)]:
        logits[row, best] = 1.0
    assert verify_tree_greedy(tree, logits) == ([1, 3], 4)
    logits[0] = -1.0
    logits[0, 6] = 1.0  # no child of the pending token matches: only the corrected token
    assert verify_tree_greedy(tree, logits) == ([], 6)
    # exercise 04.2's rooted layout (the pending token as node 0) walks the same path, shifted by one
    assert grading.rooted_walk([-1, 0, 0, 1, 2, 2], [0, 7, 8, 1, 3, 9], logits) == ([0], 6)


def test_verify_tree_maps_back_to_draft_indices():
    tree = DraftTree([7, 8, 1, 3, 9], [-1, -1, 0, 1, 1])
    logits = torch.full((6, 10), -1.0)
    for node, best in [(0, 8), (1, 2), (2, 3), (3, 0), (4, 4), (5, 5)]:
        logits[node, best] = 1.0
    assert verify_tree(logits, tree, Warp()) == ([1, 3], [8, 3, 4])


def test_sampling_siblings_must_share_q():
    q = torch.tensor([[0.5, 0.5], [0.2, 0.8]])
    with pytest.raises(ValueError, match="i.i.d."):
        verify_tree_sampling(DraftTree([0, 1], [-1, -1], q), torch.full((3, 2), 0.5))


# ---- generate() with tree drafters -----------------------------------------------------------------------


SHAPES = [[2, 2, 1, 1], [3, 2, 1], [4, 1], [1, 3, 1, 1, 2]]


@pytest.mark.parametrize("branching", SHAPES, ids=str)
def test_tree_greedy_equals_target_greedy(pair, branching):
    target, draft = pair
    for seed in range(3):
        ids = prompt_ids(seed)
        want = measure.hf_generate(target, ids, 30).tolist()
        gen = generate(target, ids, DraftModelDrafter(draft, branching=branching), max_new_tokens=30)
        assert gen.tokens == want, f"branching {branching}, prompt {seed}: tree decoding changed the output"
        assert gen.draft_nodes[0] == count_nodes(branching) and gen.target_calls < 30


def test_chain_branching_is_gamma(pair):
    target, draft = pair
    a = generate(target, prompt_ids(1), DraftModelDrafter(draft, branching=[1, 1, 1, 1]), max_new_tokens=25,
                 temperature=1.0, generator=torch.Generator().manual_seed(5))
    b = generate(target, prompt_ids(1), DraftModelDrafter(draft, gamma=4), max_new_tokens=25,
                 temperature=1.0, generator=torch.Generator().manual_seed(5))
    assert a.tokens == b.tokens and a.accept_lengths == b.accept_lengths
    with pytest.raises(ValueError, match="disagree"):
        DraftModelDrafter(draft, gamma=3, branching=[2, 2])
    with pytest.raises(ValueError, match="branching"):
        DraftModelDrafter(draft, branching=[])


class _CacheChecking(DraftModelDrafter):
    """After every commit, the draft cache must equal a fresh forward over the committed text it covers."""

    def commit(self, ids, accepted, path, hidden):
        super().commit(ids, accepted, path, hidden)
        held = lm.cache_len(self.cache)
        assert ids.shape[1] - 2 <= held <= ids.shape[1] - 1
        fresh = lm.new_cache(self.model)
        lm.forward(self.model, ids[:, :held], fresh)
        for a, b in zip(lm.kv(self.cache), lm.kv(fresh)):
            torch.testing.assert_close(a, b, atol=TOL, rtol=0)
        self.checked = getattr(self, "checked", 0) + 1


def test_draft_cache_is_compacted_to_the_accepted_path(pair):
    target, draft = pair
    drafter = _CacheChecking(draft, branching=[2, 2, 1])
    gen = generate(target, prompt_ids(2), drafter, max_new_tokens=40)
    assert drafter.checked == gen.target_calls and max(gen.accept_lengths) == 3


def test_draft_tree_levels_match_per_path_top_k(pair):
    """Each level's one masked draft forward picks the same children as running each path alone."""
    target, draft = pair
    ids = prompt_ids(6)
    drafter = DraftModelDrafter(draft, branching=[3, 2, 1])
    drafter.start(target, ids)
    tree = drafter.propose(ids, Warp(), limit=10)
    for i, parent in enumerate(tree.parents):
        context = torch.cat([ids, torch.tensor([_path_tokens(tree.parents, tree.tokens, parent)], dtype=torch.long)], 1)
        top = lm.forward(draft, context)[0, -1].topk(3).indices.tolist()
        assert tree.tokens[i] in top[: [3, 2, 1][tree_depths(tree.parents)[i]]]


@pytest.mark.skipif(not (zoo.EMBEDDED["tiny"] / "target" / "model.safetensors").exists(), reason="zoo not trained")
def test_zoo_tree_beats_the_chain_on_the_suite():
    """τ of the chain and the chapter's tree on every eighth suite prompt (notebook 04 runs them on every fourth)."""
    from specdec_lab.prompts import load_prompts

    target, draft, tok = zoo.load_pair("tiny")  # not this file's `pair` (random models)
    suite = [tok(p["prompt"], return_tensors="pt").input_ids for p in load_prompts()[::8]]
    taus = {}
    for branching in ([1, 1, 1, 1], [2, 2, 1, 1]):
        calls = tokens = 0
        for ids in suite:
            gen = generate(target, ids, DraftModelDrafter(draft, branching=branching), max_new_tokens=24,
                           eos_token_id=tok.eos_token_id)
            calls, tokens = calls + gen.target_calls, tokens + len(gen.tokens)
        taus[str(branching)] = tokens / calls
    print("τ on the suite:", {k: round(v, 3) for k, v in taus.items()})
    assert taus["[2, 2, 1, 1]"] > taus["[1, 1, 1, 1]"], f"the tree should beat the chain: {taus}"
