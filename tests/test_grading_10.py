"""The capstone's grader: it passes the solution's suffix drafter and names what is wrong with broken drafters.

The harness is shrunk here (4 held-out prompts, 12 new tokens, 600 sampling runs) so the tests stay quick; the
notebook runs it whole.
"""
import pytest
import torch
from helpers import exercise_functions, grader_tests

from specdec_lab import grading
from specdec_lab.decoding import generate
from specdec_lab.drafters import DraftModelDrafter, Drafter
from specdec_lab.grading import ch10
from specdec_lab.ngram import PromptLookupDrafter
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
    assert "target passes;" in out and "outside them (drafting, the loop)" in out  # the line under the table


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


def test_a_biased_sampled_drafter_fails_the_chi_square_test(monkeypatch):
    monkeypatch.setattr(ch10, "_check_suffix_behaviour", lambda *a: None)  # not a suffix drafter: the harness alone
    with pytest.raises(AssertionError, match="do not follow the target"):
        grading.check_capstone(lambda target: LiesAboutQ())


def test_a_drafter_that_is_never_accepted_is_not_a_drafter(monkeypatch):
    monkeypatch.setattr(ch10, "_check_suffix_behaviour", lambda *a: None)  # not a suffix drafter: the harness alone
    with pytest.raises(AssertionError, match="never accepted"):
        grading.check_capstone(lambda target: Useless())


def _rule_drafter(longest=True, pick="vote", narrow=True):
    """A suffix drafter written plainly, with one rule that can be changed: the shortest earlier match instead of
    the longest; the earliest or the most recent continuation instead of the vote; the vote over every occurrence
    at each draft instead of over those the chain so far kept."""
    class Rule(Drafter):
        def propose(self, ids, warp, limit):
            text = ids[0].tolist()
            T = len(text)
            for n in (range(min(24, T - 1), 0, -1) if longest else range(1, T)):
                ends = [e for e in range(n, T) if text[e - n:e] == text[T - n:]]  # right after each occurrence
                if ends:
                    break
            else:
                return DraftTree.chain([])
            chain, kept = [], ends
            for j in range(min(limit, 8)):
                nexts = [text[e + j] for e in (kept if narrow else ends) if e + j < T]
                if not nexts:
                    break
                token = {"vote": max(nexts, key=nexts.count), "earliest": nexts[0], "recent": nexts[-1]}[pick]
                chain.append(token)
                kept = [e for e in kept if e + j < T and text[e + j] == token]
            return DraftTree.chain(chain)
    return Rule


def test_the_crafted_texts_pass_the_right_rule(suffix):
    ch10._check_suffix_behaviour(lambda target: _rule_drafter()(), None)
    ch10._check_suffix_behaviour(lambda target: suffix(), None)


class HiddenChain(Drafter):
    """Reads the target's states (as an MTP head does) and drafts a chain of `depth` copies of the last token."""

    needs_hidden = True

    def __init__(self, depth):
        self.depth = depth

    def propose(self, ids, warp, limit):
        return DraftTree.chain([int(ids[0, -1])] * min(limit, self.depth))


class ShiftingTree(Drafter):
    """A tree whose shape changes from step to step: not option C's static tree."""

    def propose(self, ids, warp, limit):
        self.step = getattr(self, "step", 0) + 1
        t = int(ids[0, -1])
        if limit < 2:
            return DraftTree.chain([t] if limit else [])
        return DraftTree([t, t, t], [-1, -1, 0] if self.step % 2 else [-1, 0, -1])


# a broken suffix rule fails before the harness runs; options B and C are checked on the drafter's proposals
WRONG = [
    (grading.check_capstone, lambda target: TooDeep(), "never draft deeper than `limit`"),
    (grading.check_capstone, lambda target: _rule_drafter(longest=False)(), "LONGEST"),
    (grading.check_capstone, lambda target: _rule_drafter(pick="recent")(), "MOST OFTEN"),
    (grading.check_capstone, lambda target: _rule_drafter(pick="earliest")(), "MOST OFTEN"),
    (grading.check_capstone, lambda target: _rule_drafter(narrow=False)(), "narrow the matches"),
    (grading.check_capstone, (lambda target: PromptLookupDrafter(), "B"), "set needs_hidden = True"),
    (grading.check_capstone, (lambda target: HiddenChain(3), "B"), "a chain of one or two tokens"),
    (grading.check_capstone, (lambda target: PromptLookupDrafter(), "C"), "every proposal of your drafter was a chain"),
    (grading.check_capstone, (lambda target: ShiftingTree(), "C"), "2 different shapes"),
]


test_graders = grader_tests(WRONG)


def _proposals(drafter, target, prompts):
    recorder = ch10._Recorder(drafter)
    for ids in prompts:
        generate(target, ids, recorder, max_new_tokens=12)
    return recorder.trees


def test_options_b_and_c_pass_their_own_shapes(pair):
    target, draft, tok = pair
    prompts = ch10._held_out(tok)[:2]
    ch10._check_tree_shapes("B", True, _proposals(HiddenChain(2), target, prompts))
    ch10._check_tree_shapes("C", False, _proposals(DraftModelDrafter(draft, branching=[2, 2, 1]), target, prompts))


def test_an_unknown_option_is_named():
    with pytest.raises(AssertionError, match="option should be"):
        grading.check_capstone(lambda target: None, option="D")
