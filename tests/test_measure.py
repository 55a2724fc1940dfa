"""The course's timing protocol: every (model, n) timed, caches cropped back, c and v(n) derived from it."""

import pytest

from specdec_lab import lm, measure, zoo


@pytest.fixture(scope="module")
def pair():
    target, draft, _ = zoo.load_pair("tiny")
    return target, draft


@pytest.mark.parametrize("pattern", measure.PATTERNS)
def test_every_call_is_timed_and_ratios_follow(pair, pattern):
    target, draft = pair
    times = measure.forward_costs({"target": target, "draft": draft}, ns=[4, 2], context=16, rounds=3,
                                  pattern=pattern)
    assert set(times) == {("target", 1), ("target", 2), ("target", 4), ("draft", 1)}, sorted(times)
    assert all(ms > 0 for ms in times.values())
    c, v = measure.cost_ratios(times)
    assert c == pytest.approx(times[("draft", 1)] / times[("target", 1)])
    assert v[1] == 1.0 and v[4] == pytest.approx(times[("target", 4)] / times[("target", 1)])
    assert measure.cost_ratios({("target", 1): 2.0})[0] is None, "c is None when no draft was timed"


def test_the_caches_end_where_they_started(pair, monkeypatch):
    """Each timed call is cropped back to the context, so every call sees the same cache length."""
    target, _ = pair
    seen = []
    forward = lm.forward
    monkeypatch.setattr(lm, "forward", lambda model, ids, cache, **kw: (seen.append(lm.cache_len(cache)),
                                                                       forward(model, ids, cache, **kw))[1])
    measure.forward_costs({"target": target}, ns=[1, 3], context=8, rounds=2)
    assert seen[0] == 0 and set(seen[1:]) == {8}, f"cache lengths before each call: {seen}"


def test_a_wrong_pattern_says_which_exist(pair):
    with pytest.raises(ValueError, match="pattern='fast'.*'loop'.*'bench'"):
        measure.forward_costs({"target": pair[0]}, pattern="fast")


def test_round_shape_and_predicted_speedup():
    """τ / (v(N + 1) + L·c) from a run's own records, the prompt's pass left out of N and L, v read linearly."""
    from specdec_lab.decoding import Generation

    gens = [Generation(tokens=list(range(9)), target_calls=3, accept_lengths=[0, 2, 3], draft_lengths=[4, 4, 4],
                       draft_nodes=[9, 4, 6]),
            Generation(tokens=list(range(3)), target_calls=2, accept_lengths=[0, 1], draft_lengths=[4, 2],
                       draft_nodes=[9, 2])]
    shape = measure.round_shape(gens)
    assert shape == pytest.approx({"tau": 12 / 5, "nodes": (4 + 6 + 2) / 3, "depth": (4 + 4 + 2) / 3})
    v = {1: 1.0, 2: 1.1, 4: 1.2, 8: 1.6}
    assert measure.predicted_speedup(2.0, 4, 2, v, 0.1) == pytest.approx(2.0 / (1.3 + 2 * 0.1))  # v(5) = 1.3
    assert measure.predicted_speedup(2.0, 5, 0, v, 0.1) == pytest.approx(2.0 / 1.4)  # v(6): halfway from 4 to 8
    assert measure.predicted_speedup(2.0, 20, 0, v, 0.1) == pytest.approx(2.0 / 1.6)  # past the last size: v(8)
