"""The capstone's grader (exercises/10_capstone.ipynb): a drafter of the learner's own, run through the course's
own harness.

`check_capstone(make_drafter)` takes a function target -> a new drafter (drafters.Drafter's protocol) and runs:

1. the protocol: `start` and `propose` on a suite prompt (a stub still in place becomes a hint), a `DraftTree`
   no deeper than the limit it was given;
2. greedy identity on held-out prompts: every 4th prompt of the suite (13 prompts over the three categories),
   48 new tokens with the zoo pair, token for token equal to plain greedy decoding (`decoding.generate`), with
   the first differing position named;
3. sampling: the joint distribution of the first 3 tokens from a tiny random 8-token model (its exact distribution
   enumerated), 2,000 seeded runs at T = 1 with the learner's drafter, Pearson's chi-square with small cells pooled;
   the p-value is printed and must exceed `P_VALUE_MIN`;
4. τ and speed beside the course's rows in ONE interleaved run (`bench.run`) on the same 13 prompts: plain
   decoding, prompt lookup (10, 3) and the draft-model chain γ = 3, with the learner's drafter; its τ must exceed
   1.1 (a drafter whose proposals are never accepted is not yet a drafter). Speed is reported, not graded: it
   depends on the machine;
5. the chosen option's own rule. Option A (the suffix drafter), on crafted texts (`SUFFIX_CASES`), before the
   harness runs: it drafts a chain whose first token continues the LONGEST earlier match of the text's suffix,
   with the token that followed that match MOST OFTEN (not the earliest or the most recent occurrence), and
   whose second token is voted among the occurrences that the first token kept (the matches narrow token by
   token). Options B and C, on the proposals the greedy runs of step 2 made: B (an MTP module) reads the
   target's states (`needs_hidden`) and drafts chains of one or two tokens; C (an early exit verified as a
   static tree) drafts trees, not chains, of one shape whenever the budget leaves room for the whole tree.
6. after the table, the learner's row beside prompt lookup's: target passes, and the seconds spent inside the
   target's forwards and outside them (drafting and the loop), which is what separates two drafters of equal τ.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_lab import bench, checks, report, zoo
from specdec_lab.decoding import generate
from specdec_lab.drafters import Drafter, DraftModelDrafter
from specdec_lab.grading._common import P_VALUE_MIN, call, check, chi_square, grader, one_thread, passed, seeded
from specdec_lab.ngram import PromptLookupDrafter
from specdec_lab.sampling import Warp
from specdec_lab.tree import DraftTree

NEW_TOKENS = 48  # per held-out prompt
RUNS = 2000  # sampling runs


def _held_out(tok) -> list[torch.Tensor]:
    """Every 4th prompt of the suite: 13 prompts, all three categories."""
    return bench.suite_prompts(tok)[::4]


@torch.no_grad()
def _exact_first_three(model, prompt: list[int], warp: Warp) -> torch.Tensor:
    """P(first 3 tokens) of plain sampling with `warp`, by enumerating every continuation: [V^3]."""
    vocab = model.config.vocab_size
    joint, conts = torch.ones(1, dtype=torch.float64), torch.zeros(1, 0, dtype=torch.long)
    for _ in range(3):
        seqs = torch.cat([torch.tensor([prompt]).expand(len(conts), -1), conts], 1)  # [m, T + t]
        p = warp.probs(model(input_ids=seqs).logits[:, -1].float()).double()  # [m, V]
        joint = (joint[:, None] * p).reshape(-1)
        conts = torch.cat([conts.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(len(conts))[:, None]], 1)
    return joint


def _tiny_model():
    """A random Llama with 8 tokens, so the first 3 tokens' distribution has 512 cells."""
    with torch.random.fork_rng():
        torch.manual_seed(31)
        config = LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             initializer_range=0.5, eos_token_id=None, bos_token_id=None, pad_token_id=None)
        return LlamaForCausalLM(config).eval()


def _pooled_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square p-value, the cells expected fewer than 5 times pooled into one."""
    expected = probs * counts.sum()
    big = expected >= 5
    return chi_square(torch.cat([counts[big], counts[~big].sum()[None]]),
                      torch.cat([probs[big], probs[~big].sum()[None]]))[1]


# Option A's own rule, on crafted texts (token ids; the drafter is model-free): (text, the chain it must start with,
# for each of those tokens what a drafter that drafts something else got wrong). B = 0 1 2 3, the repeated block.
_B = [0, 1, 2, 3]
SUFFIX_CASES = [
    ([4, 5, 6, 7, 9, 0, 5, 6, 7, 8, 0, 5, 6, 7, 8, 0, 4, 5, 6, 7], [9],
     ["the text ends in 4 5 6 7, which occurred once before, followed by 9; the shorter suffix 5 6 7 occurred more "
      "recently and more often, followed by 8. Continue the LONGEST earlier match of the suffix"]),
    ([10, *_B, 7, 5, 11, *_B, 8, 6, 12, *_B, 9, 5, 13, *_B, 8, 6, 14, *_B, 8, 4, 15, *_B, 7, 5, 16, *_B], [8, 6],
     ["the longest earlier match of the suffix, 0 1 2 3, occurred six times, followed by 7, 8, 9, 8, 8, 7: continue "
      "with the token that followed MOST OFTEN (8), not the earliest or the most recent one (7)",
      "after the first draft 8, keep the occurrences that continued with 8 (then followed by 6, 6, 4) and vote "
      "again: 6. Over all six occurrences the next token would be 5: narrow the matches token by token"]),
]


def _check_suffix_behaviour(make_drafter: Callable, target) -> None:
    """Option A: the chain drafted after each crafted text starts with the tokens the rule gives."""
    for text, want, why in SUFFIX_CASES:
        ids = torch.tensor([text])
        drafter = make_drafter(target)
        call(drafter.start, target, ids)
        tree = call(drafter.propose, ids, Warp(0.0), 8)
        check(tree.is_chain, f"on the text {text} your drafter proposed a tree (parents {tree.parents}); the "
              "suffix drafter drafts a chain: DraftTree.chain(tokens)")
        check(len(tree.tokens) > 0, f"on the text {text} your drafter drafts nothing, expected a chain starting "
              f"with {want[0]}: {why[0]}")
        for j, (token, hint) in enumerate(zip(want, why)):
            if j < len(tree.tokens):  # a shorter chain is allowed (max_tokens, factor); a wrong token is not
                check(tree.tokens[j] == token, f"on the text {text} your drafter's chain is {tree.tokens}, "
                      f"expected draft {j + 1} to be {token}: {hint}")


class _Recorder(Drafter):
    """The learner's drafter, unchanged, with every tree it proposes recorded as (limit, tree)."""

    def __init__(self, inner):
        self.inner, self.trees = inner, []
        self.needs_hidden = inner.needs_hidden

    def start(self, target, ids):
        self.inner.start(target, ids)

    def propose(self, ids, warp, limit):
        tree = self.inner.propose(ids, warp, limit)
        self.trees.append((limit, tree))
        return tree

    def commit(self, ids, accepted, path, hidden):
        self.inner.commit(ids, accepted, path, hidden)


def _check_tree_shapes(option: str, needs_hidden: bool, trees: list[tuple[int, DraftTree]]) -> None:
    """Options B and C: the shape of what the drafter proposed during the greedy runs."""
    trees = [(limit, t) for limit, t in trees if len(t)]
    check(trees, "your drafter proposed nothing during the greedy runs")
    if option == "B":
        check(needs_hidden, "option B's MTP module drafts from the target's final state: set needs_hidden = True, "
              "and commit() then receives the target's states (as Medusa's and EAGLE's drafters do)")
        bad = next((t for _, t in trees if not t.is_chain or t.depth > 2), None)
        check(bad is None, f"option B drafts a chain of one or two tokens; your drafter proposed a tree with "
              f"parents {bad.parents if bad else None}")
    else:
        check(any(not t.is_chain for _, t in trees), "option C verifies a TREE of early-exit drafts (chapter 04); "
              "every proposal of your drafter was a chain: give it a static tree shape")
        full = max(t.depth for _, t in trees)
        shapes = {tuple(t.parents) for limit, t in trees if limit >= full}
        check(len(shapes) == 1, f"option C's tree is static, one shape at every step; your drafter proposed "
              f"{len(shapes)} different shapes (parents) where the budget allowed the whole tree")


@grader
def check_capstone(make_drafter: Callable, option: str = "A") -> None:
    """The capstone: make_drafter(target) -> a new drafter, exact and useful on the course's harness, that keeps
    to the rule of the capstone option you built: "A" (the suffix drafter), "B" (an MTP head) or "C" (an early
    exit verified as a static tree). make_drafter must accept any causal LM: the sampling test passes a random
    1-layer model with 8 tokens."""
    check(option in ("A", "B", "C"), f"option should be 'A', 'B' or 'C', got {option!r}")
    target, draft, tok = zoo.load_pair("tiny", device="cpu")
    prompts, eos = _held_out(tok), tok.eos_token_id
    with one_thread():
        # 1. the protocol
        drafter = call(make_drafter, target)
        checks.drafter(drafter)
        call(drafter.start, target, prompts[0])
        tree = call(drafter.propose, prompts[0], Warp(0.0), 5)
        check(isinstance(tree, DraftTree), f"propose should return a DraftTree (DraftTree.chain(tokens) for a "
              f"chain), got {type(tree).__name__}")
        check(tree.depth <= 5, f"propose(ids, warp, limit=5) returned a tree {tree.depth} tokens deep: never "
              "draft deeper than `limit` (the length budget)")
        if option == "A":  # 5. the suffix rule, on crafted texts (fast: before the harness)
            _check_suffix_behaviour(make_drafter, target)
        # 2. greedy identity on held-out prompts (every proposal recorded, for options B and C)
        proposed = []
        for i, ids in enumerate(prompts):
            want = generate(target, ids, None, max_new_tokens=NEW_TOKENS, eos_token_id=eos).tokens
            recorder = _Recorder(make_drafter(target))
            got = generate(target, ids, recorder, max_new_tokens=NEW_TOKENS, eos_token_id=eos).tokens
            proposed += recorder.trees
            first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            check(got == want, f"held-out prompt {i} ({ids.shape[1]} tokens): greedy output differs from plain "
                  f"decoding at new token {first}. The verifier keeps the output exact for ANY proposal, so look at "
                  "what your drafter changes besides proposing: its tree (parents, q), or state it shares")
        if option != "A":  # 5. the option's tree shape
            _check_tree_shapes(option, recorder.needs_hidden, proposed)
        # 3. sampling: the first 3 tokens of a tiny model against its exact distribution
        small, prompt, warp = _tiny_model(), [1, 2, 3, 1, 2, 3, 1], Warp(1.0)
        counts, g, drafted = torch.zeros(8 ** 3, dtype=torch.float64), seeded(10), 0
        for _ in range(RUNS):
            gen = generate(small, [prompt], make_drafter(small), max_new_tokens=3, temperature=1.0, generator=g)
            a, b, c = gen.tokens
            counts[a * 64 + b * 8 + c] += 1
            drafted += sum(gen.draft_lengths)
        pvalue = _pooled_p_value(counts, _exact_first_three(small, prompt, warp))
        print(f"sampling at T = 1 on a random 8-token model: chi-square p-value {pvalue:.3f} over {RUNS} runs "
              f"({drafted / RUNS:.2f} drafted tokens per run)")
        check(pvalue > P_VALUE_MIN, f"sampled outputs do not follow the target (p-value {pvalue:.2g}): a sampled "
              "drafter must set tree.q to the distributions it drew from (warp.probs), a deterministic one None")
        # 4. τ and speed beside the course's chains, in one interleaved run
        n = NEW_TOKENS

        def ours(make):
            def run(ids):
                gen = generate(target, ids, make(), max_new_tokens=n, eos_token_id=eos)
                return gen.tokens, gen.target_calls
            return run

        methods = {"target only": ours(lambda: None), "prompt lookup (10, 3)": ours(lambda: PromptLookupDrafter()),
                   "draft model, chain γ=3": ours(lambda: DraftModelDrafter(draft, 3)),
                   "your drafter": ours(lambda: make_drafter(target))}
        rows = bench.run(target, methods, prompts, warmup=1, drafting=())  # times the target's forwards
    print(report.format_table(rows))
    base, lookup, yours = rows[0], rows[1], rows[-1]
    # 6. the learner's row beside prompt lookup's: where the time goes
    inside = [sum(r.forward_each) for r in (lookup, yours)]  # seconds inside the target's forwards
    outside = [r.seconds - s for r, s in zip((lookup, yours), inside)]  # the rest: drafting and the loop
    print(f"prompt lookup and your drafter: {lookup.target_calls} and {yours.target_calls} target passes; "
          f"{inside[0]:.2f} s and {inside[1]:.2f} s inside the target's forwards, {outside[0]:.2f} s and "
          f"{outside[1]:.2f} s outside them (drafting, the loop)")
    check(yours.tau > 1.1, f"your drafter's τ is {yours.tau:.2f} on the held-out prompts: its proposals are "
          "(almost) never accepted, so it only costs time; check what it proposes after the committed text")
    rule = {"A": "it drafts the longest match's most frequent continuation, narrowing the matches; ",
            "B": "it drafts chains of one or two tokens from the target's states; ",
            "C": "it drafts one static tree; "}[option]
    passed(rule + f"your drafter is exact (greedy {len(prompts)}/{len(prompts)} held-out prompts, sampling p-value "
           f"{pvalue:.3f}) with τ {yours.tau:.2f} ({yours.tokens_per_second / base.tokens_per_second:.2f}x plain "
           "decoding in this run)")
