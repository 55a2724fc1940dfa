"""The tuner (chapter 08, section 3): what it measures, what it picks, and the drafters it tunes."""
import itertools

import pytest
import torch

from specdec_lab import DraftModelDrafter, EagleDrafter, economics, generate, measure, tree, tune
from specdec_lab.checks import ArgumentError
from specdec_lab.eagle import EagleNet


@pytest.fixture(scope="module")
def net(pair):
    return EagleNet.from_zoo(pair[0], 1)


def flat(v_slope: float = 0.0, c: float = 0.0, e: float = 0.0) -> tune.Costs:
    """Synthetic costs: v(n) = 1 + v_slope (n - 1), a draft forward c and an EAGLE level e, whatever the width."""
    return tune.Costs({n: 1 + v_slope * (n - 1) for n in tune.NS}, {m: c for m in tune.WIDTHS},
                      {m: e for m in tune.WIDTHS})


def test_costs_are_in_one_token_passes_and_interpolate():
    costs = tune.Costs({1: 2.0, 4: 5.0, 8: 9.0}, {1: 1.0, 4: 2.0}, {1: 0.5})
    assert costs.v(1) == 1 and costs.v(4) == 2.5 and costs.v(2) == pytest.approx(1.5)
    assert costs.v(16) == pytest.approx(8.5)  # the last segment, extended
    assert costs.c(1) == 0.5 and costs.c(2) == pytest.approx(2 / 3) and costs.e(7) == 0.25


def test_costs_from_the_roofline_are_its_verify_costs():
    roof = economics.QWEN25_7B_ON_H100
    costs = tune.Costs.from_roofline(roof, c=0.1, e=0.05)
    for n in (1, 5, 25, 64):
        assert costs.v(n) == pytest.approx(roof.verify_cost(n - 1))
    assert costs.c(16) == pytest.approx(0.1) and costs.e(1) == pytest.approx(0.05)


def test_branchings_are_the_non_increasing_trees_within_the_limits():
    trees = tree.branchings(20, max_depth=4, max_branch=3, non_increasing=True)
    assert len(trees) == len({tuple(b) for b in trees})
    for b in trees:
        assert 1 <= len(b) <= 4 and b == sorted(b, reverse=True) and economics.tree_nodes(b) <= 20
    assert [1, 1, 1, 1] in trees and [3, 2, 1] in trees and [3, 3] in trees  # 3 + 9 = 12 nodes
    assert [3, 3, 1] not in trees and [3, 2, 1, 1] not in trees  # 21 nodes each
    assert tree.branchings(64, 3, 1, non_increasing=True) == [[1], [1, 1], [1, 1, 1]]


def test_branchings_of_exactly_n_nodes_are_every_full_tree_of_that_size():
    """Chapter 06's 24-node trees: every entry 1 to 4, depth up to 8, exactly 24 nodes, increasing levels too."""
    trees = tree.branchings(24, exact=True)
    assert all(economics.tree_nodes(b) == 24 and len(b) <= 8 and max(b) <= 4 for b in trees)
    assert [4, 1, 1, 1, 1, 1] in trees and [1, 1, 1, 1, 4, 4] in trees  # increasing levels too
    assert [2, 2, 2, 2] not in trees and [1, 1, 2, 4] not in trees  # 30 and 12 nodes
    brute = [list(b) for n in range(1, 9) for b in itertools.product(range(1, 5), repeat=n)
             if economics.tree_nodes(list(b)) == 24]
    assert sorted(trees) == sorted(brute)


def test_tree_acceptance_counts_leading_levels_that_hold_the_target_token():
    ranks = [[0, 0, 1, 3, 0, 0, 0, 2]]  # where the target's token ranked among the draft's guesses, per position
    # span 2: positions 0..6; a chain of 2 accepts 2, 1, 0, 0, 2, 2, 1 drafts there
    assert tune.tree_acceptance(ranks, [1, 1], span=2) == pytest.approx(8 / 7)
    assert tune.tree_acceptance(ranks, [2, 2], span=2) == pytest.approx((2 + 2 + 1 + 0 + 2 + 2 + 1) / 7)
    assert tune.tree_acceptance(ranks, [4, 1], span=2) == pytest.approx((2 + 1 + 1 + 2 + 2 + 2 + 1) / 7)
    assert measure.hit_rates(ranks) == [5 / 8, 6 / 8, 7 / 8, 1.0]


def test_trees_win_where_nodes_are_free_and_lose_where_they_cost():
    gen = torch.Generator().manual_seed(0)
    ranks = [torch.multinomial(torch.tensor([0.6, 0.2, 0.1, 0.05, 0.05]), 200, True, generator=gen).tolist()]
    free = tune.best_tree(flat(0.0, 0.0), ranks)
    assert sum(free.settings["branching"]) > len(free.settings["branching"])  # a real tree
    assert free.tau == max(1 + tune.tree_acceptance(ranks, b) for b in tree.branchings(64, 8, 4, non_increasing=True))
    costly = tune.best_tree(flat(0.3, 0.1), ranks)
    assert set(costly.settings["branching"]) == {1}  # every extra node costs 0.3 of a step: a chain
    chain = tune.best_tree(flat(0.02, 0.2), ranks, chain=True)
    gammas = {g: tune.predict_tree(chain.costs, ranks, [1] * g).speedup for g in range(1, 9)}
    assert chain.settings["branching"] == [1] * max(gammas, key=gammas.get)


@pytest.mark.parametrize("branching", [[1, 1, 1], [2, 2, 1, 1], [3, 1], [4, 2, 1]])
def test_tree_acceptance_matches_a_real_pass(pair, branching):
    """Teacher-forced at the position where decoding drafts first, the estimate is that pass's accepted length."""
    target, draft, tok = pair
    for text in tune.CALIBRATION[:3]:
        ids = tok(text, return_tensors="pt").input_ids
        gen = generate(target, ids, DraftModelDrafter(draft, branching=branching), max_new_tokens=12)
        want = generate(target, ids, None, max_new_tokens=len(branching)).tokens
        full, T = torch.cat([ids, torch.tensor([want])], 1), ids.shape[1]  # one position: the draft's first pass
        ranks = measure.draft_ranks(draft, [(full, T)])  # (the prompt's pass drafts already, unlike EAGLE's)
        assert tune.tree_acceptance(ranks, branching, span=len(branching)) == gen.accept_lengths[0], text


def test_eagle_pick_weighs_tau_against_the_pass():
    # acc[d][b] = min(d, b) * 0.8 for k = 4; a chain accepts less
    acc4 = [[0.8 * min(d, b) for b in range(9)] for d in range(5)]
    acc1 = [[0.5 * min(d, b) for b in range(9)] for d in range(5)]
    free = tune.best_eagle(flat(0.0, 0.0, 0.0), {1: acc1, 4: acc4})
    assert free.settings["topk"] == 4 and free.settings["depth"] == 4 and free.tau == pytest.approx(1 + 3.2)
    assert free.settings["budget"] == 4  # more nodes add nothing here, and ties go to the smaller tree
    dear = tune.best_eagle(flat(0.0, 0.0, 2.0), {1: acc1, 4: acc4})  # a level costs two passes: one level
    assert dear.settings["depth"] == 1


def test_measure_times_every_size_and_restores_the_threads(pair, net):
    target, draft, _ = pair
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the run asks for 1 (2 threads beside a busy core mostly wait): it must restore 2
    try:
        costs = tune.measure(target, draft=draft, eagle=net, rounds=1, threads=1)
        assert torch.get_num_threads() == 2 and costs.threads == 1 and costs.device == "cpu"
    finally:
        torch.set_num_threads(before)
    assert set(costs.verify) == set(tune.NS) and set(costs.draft) == set(costs.eagle) == set(tune.WIDTHS)
    assert set(costs.draft_next) == set(costs.eagle_next) == set(tune.WIDTHS) and costs.step > 0
    assert all(ms > 0 for table in (costs.verify, costs.draft, costs.eagle) for ms in table.values())
    assert tune.measure(target, rounds=1).draft == {}


def test_hit_rates_are_cumulative_and_pool_the_texts(pair):
    target, draft, tok = pair
    texts = tune.calibration_texts(target, tok, new_tokens=12, texts=tune.CALIBRATION[:2])
    ranks = measure.draft_ranks(draft, texts, k=3)
    assert [len(r) for r in ranks] == [12, 12] and all(0 <= x <= 3 for r in ranks for x in r)
    hit = measure.hit_rates(ranks, k=3)
    assert hit == sorted(hit) and 0 < hit[0] <= hit[-1] <= 1
    direct = [measure.topk_hit_rates(target, draft, full[:, :T], 12, 3) for full, T in texts]
    assert hit == pytest.approx([(a + b) / 2 for a, b in zip(*direct)])  # 12 tokens each: the plain mean


@pytest.mark.parametrize("topk, depth, budget", [(4, 3, 7), (2, 4, 6), (1, 4, 4), (4, 6, 24)])
def test_eagle_acceptance_matches_a_real_pass(pair, net, topk, depth, budget):
    """Teacher-forced at the position where decoding drafts first, the estimate is that pass's accepted length."""
    target, _, tok = pair
    for text in tune.CALIBRATION[:3]:
        ids = tok(text, return_tensors="pt").input_ids
        gen = generate(target, ids, EagleDrafter(net, dynamic=True, topk=topk, depth=depth, budget=budget),
                       max_new_tokens=12)
        want = generate(target, ids, None, max_new_tokens=depth + 1).tokens  # the target's greedy text
        full, T = torch.cat([ids, torch.tensor([want])], 1), ids.shape[1] + 1  # one position: after the first token
        acc = tune.eagle_acceptance(target, net, [(full, T)], max_depth=depth, topks=[topk], max_budget=budget)
        assert acc[topk][depth][budget] == gen.accept_lengths[1], text


def test_tuned_drafters_tune_once_and_stay_exact(pair, net):
    target, draft, tok = pair
    ids = tok(tune.CALIBRATION[0], return_tensors="pt").input_ids
    plain = generate(target, ids, None, max_new_tokens=24).tokens
    (chain, chain_pick), (tree, tree_pick), (eagle2, eagle_pick) = (
        tune.auto_draft_model(target, draft, chain=True), tune.auto_draft_model(target, draft),
        tune.auto_eagle(target, net))
    for drafter, pick in ((chain, chain_pick), (tree, tree_pick), (eagle2, eagle_pick)):
        assert generate(target, ids, drafter, max_new_tokens=24).tokens == plain
        assert pick.speedup > 0
    assert set(chain.branching) == {1} and chain.branching == chain_pick.settings["branching"]
    assert tree.branching == tree_pick.settings["branching"]
    assert eagle2.dynamic and (eagle2.depth, eagle2.budget, eagle2.topk) == tuple(
        eagle_pick.settings[k] for k in ("depth", "budget", "topk"))
    again, pick = tune.auto_draft_model(target, draft, chain=True)
    assert pick is chain_pick and again is not chain  # the pick is remembered per (models, device, threads)


def test_auto_settings_name_the_tuner(pair):
    target, draft, _ = pair
    for kwargs in ({"gamma": "auto"}, {"branching": "auto"}, {"gamma": "fast"}):
        with pytest.raises(ArgumentError, match=r"tune\.auto_draft_model\(target, draft"):
            DraftModelDrafter(draft, **kwargs)
    net = EagleNet.from_zoo(target, 1)
    for dynamic in ("auto", "yes"):
        with pytest.raises(ArgumentError, match=r"tune\.auto_eagle\(target, net\)"):
            EagleDrafter(net, dynamic=dynamic)
