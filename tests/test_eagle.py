"""Tests for EAGLE-1/2/3 (chapter 06): the draft layer and its cache, the training-time-test unroll, the dynamic
tree, and EagleDrafter in generate() (the shapes the registry has no row for, a draft vocabulary); the shipped
drafts' τ on the suite. The registry's EAGLE rows go through test_exactness.py."""
import json

import pytest
import torch
from helpers import RUNS, exact_first_tokens, follows_target, prompt_ids, tiny_llama

from specdec_lab import EagleDrafter, MedusaDrafter, generate, lm, measure
from specdec_lab.eagle import EAGLE_DIR, DraftLayer, EagleNet, expand_step, select_nodes
from specdec_lab.medusa import MEDUSA_DIR
from specdec_lab.prompts import load_prompts
from specdec_lab.sampling import Warp
from specdec_lab.training import (_features, cache_states, eagle_accuracy, eagle_loss, train_eagle_net, ttt_mask,
                                  unroll)
from specdec_lab.tree import DraftTree, tree_depths

ZOO = all((EAGLE_DIR / f"eagle{v}" / "eagle.safetensors").exists() for v in (1, 3))


@pytest.fixture(scope="module")
def target():
    return tiny_llama(layers=3, seed=0)


def _net(target, version, seed=0, scale=0.05, mlp=128):
    """A draft with random weights: it guesses, mostly wrong, which is what exactness tests need."""
    net = EagleNet(target, version, heads=4, mlp=mlp)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return net.eval()


# ---- the layer, its cache, the unroll ---------------------------------------------------------------------


def test_layer_with_cache_equals_one_causal_pass():
    torch.manual_seed(0)
    layer = DraftLayer(32, 4, 64)
    x = torch.randn(2, 7, 32)
    full = layer(x, torch.arange(7))  # [2, 7, 32] causal
    cache = lm.new_cache()
    first = layer(x[:, :4], torch.arange(4), None, cache)
    rest = layer(x[:, 4:], torch.arange(4, 7), None, cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)
    assert lm.cache_len(cache) == 7
    lm.keep(cache, 3)
    assert lm.cache_len(cache) == 3 and lm.kv(cache)[0][0].shape == (2, 4, 3, 8)


def test_rope_attention_depends_only_on_relative_positions():
    torch.manual_seed(1)
    layer = DraftLayer(32, 4, 64)
    x = torch.randn(1, 5, 32)
    torch.testing.assert_close(layer(x, torch.arange(5)), layer(x, torch.arange(100, 105)), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(layer(x, torch.arange(5)), layer(x, torch.tensor([0, 2, 4, 6, 8])), atol=1e-3)


def test_ttt_mask_small_case():
    m = ttt_mask(4, 2)  # [4, 12]: step 0 keys, step 1 keys, step 2 keys
    p = 3  # a node 2 levels deep whose true prefix ends at position 1
    assert m[p, :4].tolist() == [True, True, False, False], "true features up to p - 2"
    assert m[p, 4:8].tolist() == [False, False, True, False], "step 1 only at p - 1"
    assert m[p, 8:].tolist() == [False, False, False, True], "step 2 only at p itself"
    assert ttt_mask(5, 0).equal(torch.ones(5, 5, dtype=torch.bool).tril()), "step 0 is causal"


@pytest.mark.parametrize("version", [1, 3])
def test_unroll_step_equals_drafting_from_own_output(target, version):
    """Step i at position p must equal what drafting does: true pairs up to p - i, then i drafted pairs that
    read the previous output."""
    net = _net(target, version, seed=2, scale=0.2)
    x = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(3))
    _, hidden = lm.forward(target, x, hidden=True)
    f = net.true_feature([h[0] for h in hidden])[None, :-1]  # [1, 9, H]
    tokens = x[:, 1:]
    outs = unroll(net, f, tokens, 3)
    for i, p in [(1, 5), (2, 6), (2, 2)]:
        r = p - i  # the last true position
        cache = lm.new_cache()
        o = net(f[:, : r + 1], tokens[:, : r + 1], torch.arange(r + 1), None, cache)[:, -1:]  # [1, 1, H]
        for j in range(1, i + 1):  # drafted pairs: the previous output, the next token
            o = net(o, tokens[:, r + j: r + j + 1], torch.tensor([r + j]), None, cache)
        torch.testing.assert_close(outs[i][:, p], o[:, 0], atol=1e-4, rtol=1e-4)


def test_cached_states_give_the_live_features():
    """Training reads features from cache_states; drafting from generate()'s hidden states: the same thing."""
    deep = tiny_llama(layers=8, seed=8)
    x = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(8))
    _, hidden = lm.forward(deep, x, hidden=True)
    for version in (1, 3):
        net = _net(deep, version, seed=9, scale=0.2)
        assert net.layers == ((2, 4, 8) if version == 3 else ())
        states, best = cache_states(deep, x, net.layers)
        with torch.no_grad():
            live = net.true_feature([h.to(torch.bfloat16).float() for h in hidden])  # the cache stores bf16
            torch.testing.assert_close(_features(net, states), live, atol=1e-5, rtol=1e-5)


def test_training_lowers_the_loss(target):
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, 300, (16, 24), generator=g)
    for version, steps in [(1, 1), (3, 2)]:
        net = EagleNet(target, version, heads=4, mlp=128)
        states, best = cache_states(target, x, net.layers)
        assert states.shape == (16, 24, len(net.layers) + 1, 64) and states.dtype == torch.bfloat16
        before, _ = eagle_loss(net, states, x, best, steps)
        train_eagle_net(net, states, x, best, steps=40, batch=8, lr=3e-3, ttt_steps=steps, progress=False)
        after, _ = eagle_loss(net, states, x, best, steps)
        assert after < 0.9 * before, f"EAGLE-{version}: training should lower the loss ({before:.3f} -> {after:.3f})"
        acc = eagle_accuracy(net, states, x, best, depth=2)
        assert len(acc) == 2 and 0 <= min(acc) and max(acc) <= 1
    assert sum(p.numel() for p in net.parameters()) == (3 * 64 * 64 + 2 * 64 * 64 + 4 * 64 * 64 + 3 * 64 * 128
                                                        + 3 * 64), "the frozen embedding and LM head are not saved"


# ---- EAGLE-2's dynamic tree -----------------------------------------------------------------------------


def test_expand_step_hand_example():
    scores = torch.tensor([-0.1, -1.0])  # two frontier nodes
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05]]))
    rows, tokens, s = expand_step(scores, logp, 2)
    assert rows.tolist() == [0, 1, 0, 1] and tokens.tolist() == [0, 0, 1, 1], "ranked by cumulative log-prob"
    want = torch.tensor([-0.1, -1.0, -0.1, -1.0]) + torch.log(torch.tensor([0.5, 0.9, 0.3, 0.05]))
    torch.testing.assert_close(s, want)
    assert (s[:-1] >= s[1:]).all(), "candidates come best first"


def test_select_nodes_keeps_a_subtree():
    parents = [-1, -1, 0, 0, 1, 2]
    scores = [-0.5, -0.2, -0.5, -0.9, -0.3, -0.6]  # node 2 ties its parent: the parent wins the tie
    assert select_nodes(scores, parents, 3) == [0, 1, 4]
    assert select_nodes(scores, parents, 4) == [0, 1, 2, 4]


def test_dynamic_tree_budget_depth_and_order(target):
    net = _net(target, 1, seed=5, scale=0.2)
    ids = prompt_ids(5)
    for budget, depth, limit in [(10, 4, 9), (6, 5, 2), (30, 3, 9)]:
        drafter = EagleDrafter(net, dynamic=True, topk=3, depth=depth, budget=budget)
        drafter.start(target, ids)
        _, hidden = lm.forward(target, ids, hidden=True)
        ext = torch.cat([ids, torch.tensor([[7]])], 1)  # the prefill's token is pending
        drafter.commit(ext, 0, [], tuple(h[0] for h in hidden))
        tree = drafter.propose(ext, Warp(), limit)
        assert len(tree) == min(budget, 3 + 9 * (min(depth, limit) - 1)), "the budget (or the pool) bounds the tree"
        assert all(p < i for i, p in enumerate(tree.parents)), "parents come before their children"
        assert tree.depth <= min(depth, limit)
        for i, p in enumerate(tree.parents):  # siblings are distinct tokens
            sib = [tree.tokens[j] for j, q in enumerate(tree.parents) if q == p]
            assert len(sib) == len(set(sib))
        assert len(tree_depths(tree.parents)) == len(tree)


# ---- the drafter in generate() -------------------------------------------------------------------------


DRAFTERS = {"chain": dict(branching=[1, 1, 1, 1]), "static": dict(branching=[3, 2, 1])}


@pytest.mark.parametrize("version,kind", [(1, "static"), (3, "chain")])  # not rows of lineup.METHODS
@pytest.mark.parametrize("seed", range(2))
def test_eagle_greedy_equals_target_greedy(target, version, kind, seed):
    drafter = EagleDrafter(_net(target, version, seed), **DRAFTERS[kind])
    ids = prompt_ids(seed)
    want = measure.hf_generate(target, ids, 30).tolist()
    gen = generate(target, ids, drafter, max_new_tokens=30)
    assert gen.tokens == want, f"EAGLE-{version} {kind} must equal greedy decoding"
    assert gen.draft_nodes[0] == 0, "the prefill drafts nothing"


def test_draft_cache_holds_only_true_pairs(target):
    """After every commit the draft's cache equals the pairs (true feature, committed token), recomputed."""
    net = _net(target, 3, seed=6, scale=0.2)
    ids = prompt_ids(6)
    seen = []

    class Watch(EagleDrafter):
        def commit(self, ids_, accepted, path, hidden):
            super().commit(ids_, accepted, path, hidden)
            _, states = lm.forward(target, ids_[:, :-1], hidden=True)  # the target's states, recomputed
            fresh = lm.new_cache()
            f = net.true_feature([h[0] for h in states])[None]  # [1, T-1, H]
            net(f, ids_[:, 1:], torch.arange(ids_.shape[1] - 1), None, fresh)
            assert lm.cache_len(self.cache) == self.n_true == ids_.shape[1] - 1
            torch.testing.assert_close(lm.kv(self.cache)[0][0], lm.kv(fresh)[0][0], atol=1e-4, rtol=1e-4)
            seen.append(lm.cache_len(self.cache))

    gen = generate(target, ids, Watch(net, branching=[2, 2, 1]), max_new_tokens=20)
    assert len(seen) == gen.target_calls and seen == sorted(seen)


def test_perfect_draft_accepts_everything(target):
    """If the draft's output IS the target's next feature, EAGLE-1 accepts every drafted token."""
    ids = prompt_ids(7)
    future = measure.hf_generate(target, ids, 30).tolist()

    class Oracle(EagleDrafter):
        def propose(self, ids_, warp, limit):
            tree = super().propose(ids_, warp, limit)
            if self.root is None or limit < 1:
                return tree
            done = ids_.shape[1] - ids.shape[1]
            return DraftTree.chain(future[done: done + min(3, limit)])

    gen = generate(target, ids, Oracle(_net(target, 1)), max_new_tokens=30)
    assert gen.tokens == future and max(gen.accept_lengths) == 3


def test_a_draft_vocabulary_keeps_sampling_exact():
    """A draft vocabulary of 4 of the 8 tokens: the target often wants a token the draft cannot propose."""
    target = tiny_llama(vocab=8, hidden=16, layers=1, seed=10, init=0.5)
    net = EagleNet(target, 3, heads=2, mlp=32)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    net.eval().use_vocab(torch.tensor([0, 2, 5, 7]))
    drafter = EagleDrafter(net, dynamic=True, topk=2, depth=2, budget=4)
    ids, g = torch.tensor([[1, 5, 2]]), torch.Generator().manual_seed(7)
    samples = [generate(target, ids, drafter, max_new_tokens=3, generator=g, temperature=1.0).tokens for _ in range(RUNS)]
    follows_target(samples, exact_first_tokens(target, ids, Warp(1.0)), "EAGLE-3, draft vocabulary")


def test_a_draft_vocabulary_scores_its_tokens_only_and_survives_saving(target, tmp_path):
    net = _net(target, 3)
    V = target.config.vocab_size
    net.use_vocab(torch.tensor([9, 3, 40, 7]))  # any order: kept ascending
    out = torch.randn(2, 5, net.hidden)
    full, small = net.logits(out), net.draft_logits(out)  # [2, 5, V], [2, 5, 4]
    assert full.shape == (2, 5, V) and small.shape == (2, 5, 4)
    assert torch.equal(full[..., [3, 7, 9, 40]], small) and torch.isinf(full).sum() == 2 * 5 * (V - 4)
    assert net.to_draft(torch.tensor([7, 8, 40])).tolist() == [1, -100, 3]
    net.save(tmp_path / "e3")
    loaded = EagleNet.from_pretrained(target, tmp_path / "e3")
    assert loaded.d2t.tolist() == [3, 7, 9, 40] and loaded.d2t.dtype == torch.long


# ---- the shipped drafts ---------------------------------------------------------------------------------


@pytest.mark.skipif(not ZOO, reason="EAGLE drafts not trained yet (`specdec-lab train-zoo --stage eagle`)")
def test_zoo_eagle_helps_and_eagle2_beats_medusa(pair):
    target, _, tok = pair
    drafters = {"EAGLE-1": EagleDrafter.from_zoo(target, 1), "EAGLE-2": EagleDrafter.from_zoo(target, 1, dynamic=True),
                "EAGLE-3": EagleDrafter.from_zoo(target, 3, dynamic=True)}
    if (MEDUSA_DIR / "heads.safetensors").exists():
        drafters["Medusa"] = MedusaDrafter.from_zoo(target)
    calls, tokens = dict.fromkeys(drafters, 0), dict.fromkeys(drafters, 0)
    for p in load_prompts()[::6]:  # 9 prompts over the three categories; notebook 06 runs every fourth
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        for name, drafter in drafters.items():
            gen = generate(target, ids, drafter, max_new_tokens=24)
            calls[name] += gen.target_calls
            tokens[name] += len(gen.tokens)
    tau = {name: tokens[name] / calls[name] for name in drafters}
    assert tau["EAGLE-1"] > 1.5, f"the shipped EAGLE-1 draft should help: τ = {tau}"
    if "Medusa" in tau:
        assert tau["EAGLE-2"] > tau["Medusa"], f"EAGLE-2 should accept more than Medusa: τ = {tau}"
    for v in (1, 3):
        card = json.loads((EAGLE_DIR / f"eagle{v}" / "config.json").read_text())
        assert card["version"] == v and card["val_accuracy_vs_target"][0] > 0.4


def test_a_block_drafts_in_one_forward_what_its_training_unroll_scores(pair):
    """The block drafter (chapter 12): the root pair's output and gamma - 1 placeholders, one forward after the true
    pairs, give the outputs that training's unroll gives at step j, position root + j (`ttt_mask`: the placeholder
    sees the pairs up to its root and the placeholders before it); and its chains keep greedy output exact."""
    from specdec_lab import training
    from specdec_lab.eagle import BlockDrafter, BlockNet

    target, _, tok = pair
    torch.manual_seed(0)
    net = BlockNet(target, heads=4, mlp=64)
    x = tok("def parse(line):\n    return line.split(',')\n", return_tensors="pt").input_ids  # [1, T]
    with torch.no_grad():
        f = lm.forward(target, x, hidden=True)[1][-1]  # [1, T, H] the target's last states
        outs = training.unroll(net, f[:, :-1], x[:, 1:], steps=4)  # 4 x [1, T - 1, H]
        root, cache = 9, lm.new_cache()
        pairs = net(f[:, :root + 1], x[:, 1:root + 2], torch.arange(root + 1), None, cache)  # [1, root + 1, H]
        block = net.placeholders(torch.arange(3), torch.arange(root + 1, root + 4), None, cache)  # [1, 3, H]
    torch.testing.assert_close(pairs[0, -1], outs[0][0, root])
    for j in range(1, 4):
        torch.testing.assert_close(block[0, j - 1], outs[j][0, root + j], atol=1e-5, rtol=1e-4)
    drafter = BlockDrafter(net, gamma=4)  # the drafter's one forward: the verified pairs, then the placeholders
    drafter.start(target, x[:, :root + 2])
    with torch.no_grad():
        drafter.commit(x[:, :root + 2], 0, [], [f[0, :root + 1]])
    assert lm.cache_len(drafter.cache) == root + 4, "one forward: root + 1 pairs and 3 placeholders in the cache"
    for j in range(4):
        torch.testing.assert_close(drafter.block[j], outs[j][0, root + j], atol=1e-5, rtol=1e-4)
    want = generate(target, x, None, max_new_tokens=24).tokens
    assert generate(target, x, BlockDrafter(net, gamma=4), max_new_tokens=24).tokens == want


def test_a_block_drafters_samples_follow_the_target():
    """Each depth of the block is drawn from its own q_j, independently of the other depths: with that q_j in the
    accept test, the first 3 sampled tokens follow the target's distribution (chi-square over every continuation)."""
    from specdec_lab.eagle import BlockDrafter, BlockNet

    target = tiny_llama(vocab=8, hidden=16, layers=1, seed=10, init=0.5)
    torch.manual_seed(1)
    drafter = BlockDrafter(BlockNet(target, heads=2, mlp=32).eval(), gamma=3)
    ids, g = torch.tensor([[1, 5, 2]]), torch.Generator().manual_seed(7)
    # 6 new tokens, so that the first pass after the prompt drafts the whole block; the first 3 are compared
    gens = [generate(target, ids, drafter, max_new_tokens=6, generator=g, temperature=1.0) for _ in range(RUNS)]
    assert sum(x.draft_lengths[1] == 3 for x in gens) == RUNS, "the block drafts 3 tokens after the prompt"
    assert sum(sum(x.accept_lengths[:2]) for x in gens) > RUNS / 10, "drafts accepted often enough to be tested"
    follows_target([x.tokens[:3] for x in gens], exact_first_tokens(target, ids, Warp(1.0)), "block drafter, sampled")
