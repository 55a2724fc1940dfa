"""The capstone's grader: it passes the solution's suffix drafter and names what is wrong with broken drafters.

The harness is shrunk here (4 held-out prompts, 12 new tokens, 600 sampling runs) so the tests stay quick; the
notebook runs it whole.
"""
import pytest
import torch
from helpers import exercise_functions

from specdec_lab import grading
from specdec_lab.drafters import Drafter
from specdec_lab.grading import ch10
from specdec_lab.tree import DraftTree


@pytest.fixture(autouse=True)
def small_harness(monkeypatch):
    monkeypatch.setattr(ch10, "NEW_TOKENS", 12)
    monkeypatch.setattr(ch10, "RUNS", 600)
    held_out = ch10._held_out
    monkeypatch.setattr(ch10, "_held_out", lambda tok: held_out(tok)[:4])


@pytest.fixture(scope="module")
def suffix():
    return exercise_functions("10_capstone.ipynb")["SuffixDrafter"]


def test_the_solution_passes(suffix, capsys):
    grading.check_capstone(lambda target: suffix())
    out = capsys.readouterr().out
    assert "chi-square p-value" in out and "your drafter" in out and out.strip().splitlines()[-1].startswith("PASS")


def test_the_stub_fails_with_a_hint():
    stubs = exercise_functions("10_capstone.ipynb", folder="exercises")["SuffixDrafter"]
    with pytest.raises(AssertionError, match="start is not implemented yet"):
        grading.check_capstone(lambda target: stubs())


class TooDeep(Drafter):
    def propose(self, ids, warp, limit):
        return DraftTree.chain([1] * (limit + 2))


class Useless(Drafter):  # exact, but proposes a token that never follows
    def propose(self, ids, warp, limit):
        return DraftTree.chain([0] if limit else [])


class LiesAboutQ(Drafter):
    """Draws its token uniformly but tells the verifier its q was nearly all on token 0: biased when sampling."""

    def propose(self, ids, warp, limit):
        if warp.greedy or not limit:
            return DraftTree.chain([int(ids[0, -1])] if limit else [])
        vocab = 8
        token = int(torch.randint(1, vocab, (1,), generator=warp.generator))
        q = torch.full((1, vocab), 1e-3)
        q[0, 0], q[0, token] = 1.0 - 1e-3 * (vocab - 1) - 0.01, 1e-3 + 0.01
        return DraftTree.chain([token], q / q.sum())


def test_a_tree_deeper_than_the_limit_is_named():
    with pytest.raises(AssertionError, match="never draft deeper than `limit`"):
        grading.check_capstone(lambda target: TooDeep())


def test_a_biased_sampled_drafter_fails_the_chi_square_test():
    with pytest.raises(AssertionError, match="do not follow the target"):
        grading.check_capstone(lambda target: LiesAboutQ())


def test_a_drafter_that_is_never_accepted_is_not_a_drafter():
    with pytest.raises(AssertionError, match="never accepted"):
        grading.check_capstone(lambda target: Useless())


def _broken_suffix(suffix, rule):
    """The solution's drafter with one rule changed: the most recent continuation instead of the vote, or the
    shortest earlier match instead of the longest."""
    class Broken(suffix):
        def propose(self, ids, warp, limit):
            tree = super().propose(ids, warp, limit)
            text = ids[0].tolist()
            n = 4 if rule == "recent" else 1  # the match length the broken rule uses
            ends = [e for e in range(n, len(text)) if text[e - n:e] == text[-n:]]
            if not ends or not tree.tokens:
                return tree
            token = text[ends[-1]] if rule == "recent" else max(set(text[e] for e in ends),
                                                                   key=[text[e] for e in ends].count)
            return DraftTree.chain([token] + tree.tokens[1:])
    return Broken


@pytest.mark.parametrize("rule, hint", [("recent", "MOST OFTEN"), ("shortest", "LONGEST")])
def test_the_suffix_rule_is_checked_on_crafted_texts(suffix, rule, hint):
    broken = _broken_suffix(suffix, rule)
    with pytest.raises(AssertionError, match=hint):
        ch10._check_suffix_behaviour(lambda target: broken(), None)
    ch10._check_suffix_behaviour(lambda target: suffix(), None)


def test_an_unknown_option_is_named():
    with pytest.raises(AssertionError, match="option should be"):
        grading.check_capstone(lambda target: None, option="D")
