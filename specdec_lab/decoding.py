"""The speculative loop: propose -> score -> verify -> commit, for every method of the course.

Derived in notebooks/03_draft_target.ipynb.

    gen = generate(target, ids, DraftModelDrafter(draft, gamma=4), max_new_tokens=64)
    gen.tokens, gen.target_calls, gen.tau              # new tokens, target passes, τ

`generate` is a loop over `step`, one round each; `start` checks the arguments and builds the state the rounds
advance (`Decoding`), and `step` returns what its round did (`Round`): widgets.RoundStepper shows those rounds.

One round, for any drafter (drafters.Drafter):
  1. propose: the drafter returns a `DraftTree` (a chain, or from chapter 04 a tree);
  2. score: ONE cached target forward over the pending token(s) and the whole tree (`score`);
  3. verify: `tree.verify_tree` keeps the accepted path plus one corrected or bonus token;
  4. commit: `cut` at the length budget and at EOS (3 and 4: `verify_and_cut`), `lm.keep` the committed K/V
     (`committed_rows`), tell the drafter.
With no drafter the same loop proposes nothing and is plain autoregressive decoding: the baseline every
speedup is measured against.

Cache invariant (asserted every step): before each target forward the cache holds every committed token
except the last one, cache_len == len(committed) - 1; that last, "pending" token is the first input of
the next forward.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec_lab import checks, lm
from specdec_lab.drafters import Drafter
from specdec_lab.lm import context_length
from specdec_lab.sampling import Warp
from specdec_lab.tree import DraftTree, tree_forward, verify_tree

__all__ = ["Generation", "Decoding", "Round", "start", "step", "generate", "generate_naive", "score", "cut",
           "verify_and_cut", "committed_rows", "checked_prompt"]


@dataclass
class Generation:
    """What one call of `generate` produced, and what it cost.

    tokens: the new token ids only (not the prompt), at most max_new_tokens, ending at the first EOS.
    target_calls: target forward passes (the prompt is read in the first one, together with its drafts).
    accept_lengths: per target call, how many drafted tokens the verifier accepted (0 to γ).
    draft_lengths: per target call, how many tokens deep the drafter proposed (γ for a chain, the depth of a
        tree; 0 for plain decoding). draft_nodes: per target call, how many tokens the target verified
        besides the pending one (γ for a chain, every node of a tree).
    seconds: wall-clock time of the whole call.
    """

    tokens: list[int]
    target_calls: int
    accept_lengths: list[int] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)
    draft_nodes: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tau(self) -> float:
        """τ, the mean number of tokens emitted per target call: len(tokens) / target_calls.

        Each call emits its accepted drafts plus one corrected or bonus token, so τ = 1 + mean(accept_lengths)
        except where EOS or the length budget cut the last call short. τ ranges from 1 (plain decoding, or
        nothing accepted) to γ + 1 (everything accepted); it is NOT the per-token acceptance rate α.
        """
        return len(self.tokens) / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_rate(self) -> float:
        """α, the fraction of the drafted tokens the verifier TESTED that it accepted.

        A call that accepts n of its d drafts tested n + 1 of them when n < d (the rejected one is the
        last) and all d when n = d; drafts after a rejection were never tested and do not count. For a
        tree, d is its depth: α is then the chance that a level holds the target's token, given the one
        above did.
        """
        tested = sum(min(n + 1, d) for n, d in zip(self.accept_lengths, self.draft_lengths))
        return sum(self.accept_lengths) / tested if tested else 0.0

    def record(self, accepted: int, depth: int, nodes: int) -> None:
        """One target pass: `accepted` drafts kept, of a proposal `depth` tokens deep with `nodes` tokens."""
        self.target_calls += 1
        self.accept_lengths.append(accepted)
        self.draft_lengths.append(depth)
        self.draft_nodes.append(nodes)


class NoDraft(Drafter):
    """drafter=None: propose nothing, so the loop is plain autoregressive decoding (for a batch too)."""

    def propose(self, ids: Tensor, warp: Warp, limit: int) -> DraftTree:
        return DraftTree.chain([])


def score(target, new_ids: Tensor, tree: DraftTree, cache, hidden: bool = False):
    """ONE target forward over the uncached committed tokens new_ids [1, k] and the drafted tree after them.

    Returns (logits [n + 1, V], hidden states or None): row 0 at the last committed token, row i + 1 at node i.
    A chain needs no tree mask: the causal forward reading only its last n + 1 logits is the same computation,
    cheaper. A tree, or a drafter that reads the target's hidden states, goes through `tree.tree_forward`.
    """
    if tree.is_chain and not hidden:
        x = torch.cat([new_ids, torch.as_tensor([tree.tokens], dtype=torch.long, device=new_ids.device)], 1)
        return lm.forward(target, x, cache, last=len(tree) + 1)[0], None  # [n+1, V]
    out = tree_forward(target, new_ids, tree.parents, tree.tokens, cache, hidden=hidden)
    return out if hidden else (out, None)  # [n+1, V], layers x [1, k+n, H]


def cut(emitted: list[int], budget: int, eos: set[int] | frozenset[int]) -> tuple[list[int], bool]:
    """(the tokens a pass may commit, whether it hit EOS): at most `budget`, ending at the first EOS token,
    even inside an accepted draft."""
    emitted = emitted[:budget]
    hit = next((i for i, t in enumerate(emitted) if t in eos), None)
    return (emitted, False) if hit is None else (emitted[:hit + 1], True)


def verify_and_cut(logits: Tensor, tree: DraftTree, warp: Warp, budget: int, eos, typical=None, draws=None
                   ) -> tuple[list[int], list[int], bool]:
    """Steps 3 and 4 of both loops (generate, and each row of serving.generate_batch): (the accepted nodes, the
    tokens to commit, whether EOS ended the text) from the target's logits [n + 1, V] at the pending token and
    the tree's nodes (`verify_tree`, then `cut` at the length budget and EOS). draws: see `verify_tree`."""
    path, emitted = verify_tree(logits, tree, warp, typical, draws)
    return (path, *cut(emitted, budget, eos))


def committed_rows(uncached: int, path: list[int], k: int) -> list[int]:
    """Which of a pass's input rows hold committed tokens, when `k` tokens were committed: the `uncached`
    committed ones it read first, then the nodes on the accepted path (node j is row uncached + j). Both loops
    hand a drafter that reads the target's states (EAGLE, Medusa) the states of these rows."""
    return list(range(uncached)) + [uncached + j for j in path[:k]]


def checked_prompt(target, input_ids, max_new_tokens) -> tuple[Tensor, int]:
    """(input_ids as a [1, T] long tensor on the target's device, max_new_tokens), or an error that says what to
    change. Every loop (this one, lookahead's, the round stepper) reads its prompt through it."""
    checks.model(target, "target", "load one with AutoModelForCausalLM.from_pretrained(name), or "
                 "target, draft, tok = zoo.load_pair('tiny')")
    vocab = target.config.get_text_config().vocab_size
    return checks.prompt(input_ids, max_new_tokens, vocab, context_length(target), target.device)


@dataclass
class Decoding:
    """The loop's state between rounds: `start` makes it, each `step` advances it by one target pass."""

    target: object
    drafter: Drafter
    warp: Warp
    eos: set[int]
    typical: tuple[float, float] | None
    buf: Tensor  # [1, T0 + max_new_tokens]: the committed text, then room for the rest
    T0: int  # the prompt's length
    T: int  # the committed text's length
    max_new_tokens: int
    cache: object  # the target's KV cache: every committed token but the last (the "pending" one)
    gen: Generation
    done: bool = False  # EOS was committed, or max_new_tokens were

    @property
    def ids(self) -> Tensor:
        """The committed text, [1, T]."""
        return self.buf[:, :self.T]


@dataclass
class Round:
    """What one `step` did: the drafter's proposal, the target's pass over it, the verifier's verdict.

    logits [n + 1, V]: the target at the pending token (row 0) and at each node (row i + 1). path: the accepted
    nodes, top down. emitted: the tokens committed (the accepted nodes' tokens, then the correction or bonus; cut at
    EOS and the length budget). u: the uniforms of the chain's accept test u·q(x) < p(x), one per draft (sampling a
    chain; empty otherwise). cache: the target cache's length before the pass, after it, after the rollback.
    """

    tree: DraftTree
    logits: Tensor
    path: list[int]
    emitted: list[int]
    u: list[float]
    cache: tuple[int, int, int]


def start(target, input_ids, drafter=None, max_new_tokens: int = 64, temperature: float = 0.0,
          top_k: int | None = None, top_p: float | None = None, eos_token_id: int | Sequence[int] | None = None,
          generator: torch.Generator | None = None, typical: tuple[float, float] | None = None) -> Decoding:
    """The loop's state before its first round, every argument checked (see `generate` for what they mean)."""
    drafter = checks.drafter(drafter) or NoDraft()
    warp, eos, typical = Warp(temperature, top_k, top_p, generator), checks.eos_ids(eos_token_id), checks.typical(typical)
    ids, max_new_tokens = checked_prompt(target, input_ids, max_new_tokens)  # [1, T0]
    drafter.start(target, ids)
    buf = torch.cat([ids, ids.new_empty(1, max_new_tokens)], 1)
    return Decoding(target, drafter, warp, eos, typical, buf, ids.shape[1], ids.shape[1], max_new_tokens,
                    lm.new_cache(target), Generation(tokens=[], target_calls=0), done=max_new_tokens == 0)


@torch.inference_mode()
def step(s: Decoding) -> Round:
    """One round: 1. propose, 2. ONE target pass (score), 3. verify, 4. commit (cut, roll the cache back, tell the
    drafter). Advances `s` and returns what the round did."""
    if s.done:
        raise RuntimeError("the text is complete (EOS or max_new_tokens): start() a new one")
    T, budget = s.T, s.max_new_tokens - (s.T - s.T0)  # tokens we may still emit; a pass emits at most depth + 1
    tree = s.drafter.propose(s.ids, s.warp, budget - 1)  # 1. propose
    if tree.depth > budget - 1:
        raise RuntimeError(f"the drafter proposed {tree.depth} tokens deep when at most {budget - 1} were allowed")
    past = lm.cache_len(s.cache)
    assert past == (T - 1 if s.gen.target_calls else 0), f"target cache holds {past}, committed {T}"
    logits, states = score(s.target, s.buf[:, past:T], tree, s.cache, s.drafter.needs_hidden)  # 2. [n+1, V]
    scored, u = lm.cache_len(s.cache), []
    path, emitted, eos = verify_and_cut(logits, tree, s.warp, budget, s.eos, s.typical, u)  # 3. verify, 4. commit
    k = len(emitted)
    lm.keep(s.cache, T, path[:k - 1])  # the committed text's K/V but the new pending token's
    if states is not None:  # the target's states at the committed tokens it read: the uncached ones, the nodes
        rows = torch.tensor(committed_rows(T - past, path, k), device=s.buf.device)
        states = tuple(h[0].index_select(0, rows) for h in states)  # layers x [m, H]
    s.buf[0, T:T + k] = torch.as_tensor(emitted)
    s.T = T + k
    assert lm.cache_len(s.cache) == s.T - 1, f"target cache holds {lm.cache_len(s.cache)}, committed {s.T}"
    s.gen.record(len(path), tree.depth, len(tree))
    s.done = eos or s.T - s.T0 >= s.max_new_tokens
    if not eos:
        s.drafter.commit(s.ids, len(path), path[:k], states)
    return Round(tree, logits, path, emitted, u, (past, scored, lm.cache_len(s.cache)))


@torch.inference_mode()
def generate(target, input_ids, drafter=None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, eos_token_id: int | Sequence[int] | None = None,
             generator: torch.Generator | None = None, typical: tuple[float, float] | None = None) -> Generation:
    """Decode up to max_new_tokens tokens after input_ids with `target`, speculating with `drafter`.

    drafter: None (plain decoding) or a drafters.Drafter. temperature 0 is greedy; otherwise softmax(logits / T)
    with optional top-k / top-p, the same Warp for target and drafter; a seeded `generator` makes it repeat.
    Output: exactly the target's own distribution (greedy: identical tokens); stops after max_new_tokens tokens
    or at the first eos_token_id (included). Arguments are checked before any model runs (see checks).
    typical: (threshold, alpha) verifies by Medusa's typical acceptance instead, a LOSSY rule (chapter 05).
    """
    began = time.perf_counter()
    s = start(target, input_ids, drafter, max_new_tokens, temperature, top_k, top_p, eos_token_id, generator, typical)
    while not s.done:
        step(s)
    s.gen.tokens, s.gen.seconds = s.buf[0, s.T0:s.T].tolist(), time.perf_counter() - began
    return s.gen


@torch.inference_mode()
def generate_naive(target, draft, input_ids, gamma: int = 3, max_new_tokens: int = 64, temperature: float = 0.0,
                   top_k: int | None = None, top_p: float | None = None, eos_token_id=None,
                   generator: torch.Generator | None = None) -> Generation:
    """The textbook loop without caches: both models re-read the whole text at every step.

    Same draws in the same order as `generate(..., DraftModelDrafter(draft, gamma))`, so with equal seeds
    the two emit the same tokens (up to fp32 rounding in the logits). Kept as the reference the cached
    loop is checked and timed against; like it, drafts only while the draft's context has room.
    """
    start = time.perf_counter()
    gamma = checks.integer(gamma, "gamma", "tokens drafted per step")
    checks.model(draft, "draft", "pass the draft model itself (generate_naive(target, draft, ids))")
    ids, max_new_tokens = checked_prompt(target, input_ids, max_new_tokens)
    ids = ids[0].tolist()
    warp, eos, T0 = Warp(temperature, top_k, top_p, generator), checks.eos_ids(eos_token_id), len(ids)
    draft_context = context_length(draft) or float("inf")
    gen = Generation(tokens=[], target_calls=0)
    while len(ids) - T0 < max_new_tokens:
        budget = max_new_tokens - (len(ids) - T0)
        n = max(min(gamma, budget - 1, draft_context - len(ids) + 1), 0)  # the draft reads up to len(ids)+n-2
        drafted, qs = list(ids), []
        for _ in range(n):  # the draft re-reads everything, then appends one token
            logits = lm.forward(draft, torch.tensor([drafted]))[0, -1]  # [V]
            if warp.greedy:
                drafted.append(int(logits.argmax()))
            else:
                q = warp.probs(logits[None])  # [1, V]
                drafted.append(int(warp.sample(q)))
                qs.append(q)
        tree = DraftTree.chain(drafted[len(ids):], torch.cat(qs) if qs else None)
        logits = lm.forward(target, torch.tensor([drafted]))[0, len(ids) - 1:]  # [n+1, V]
        path, emitted = verify_tree(logits, tree, warp)
        gen.record(len(path), n, n)
        emitted, done = cut(emitted, budget, eos)
        ids += emitted
        if done:
            break
    gen.tokens = ids[T0:]
    gen.seconds = time.perf_counter() - start
    return gen
