"""Chapter 06's graders (exercises/06_eagle.ipynb): EAGLE's draft network, tree expansion and training.

All three run the learner's code on a small random `eagle.EagleNet` over a random 2-layer Llama and compare
with the library:

1. `check_eagle_forward`: fc([embed(next token), feature]) -> one decoder layer -> the target's LM head,
   against the net's own forward; hints for the concatenation order and a skipped layer or head.
2. `check_expand`: EAGLE-2's expansion step, the k best children by cumulative log-probability
   (`eagle.expand_step`).
3. `check_ttt_unroll`: EAGLE-3's training-time test, each unrolled step reading the draft's own previous
   outputs shifted by one, through one cache (`eagle.unroll`); hints for true features, no shift, no cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specdec_lab.eagle import EagleNet, KVCache, expand_step, ttt_mask, unroll
from specdec_lab.grading._common import call, check, grader, passed, seeded


def _eagle_case(version: int = 1, seed: int = 0):
    """A random 2-layer Llama target (vocab 50, hidden 32) and an EagleNet with random weights for it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    target = LlamaForCausalLM(config).eval()
    net = EagleNet(target, version, heads=4, mlp=48)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=seeded(seed + 1)) * 0.2)
    return target, net.eval()


@grader
def check_eagle_forward(eagle_forward: Callable) -> None:
    """Exercise 06.1: eagle_forward(net, feature [B, T, H], tokens [B, T]) -> (out [B, T, H], logits [B, T, V])."""
    target, net = _eagle_case()
    g = seeded(5)
    feature = torch.randn(2, 6, 32, generator=g)  # [B, T, H]
    tokens = torch.randint(0, 50, (2, 6), generator=g)  # [B, T] the token after each position
    with torch.no_grad():
        got = call(eagle_forward, net, feature, tokens)
        want_out = net(feature, tokens, torch.arange(6))
        want_logits = net.logits(want_out)
    check(isinstance(got, (tuple, list)) and len(got) == 2, f"return (out, logits), got {type(got).__name__}")
    out, logits = got
    check(isinstance(out, Tensor) and out.shape == (2, 6, 32),
          f"out should be [B, T, H] = [2, 6, 32], got {getattr(out, 'shape', out)}")
    check(isinstance(logits, Tensor) and logits.shape == (2, 6, 50),
          f"logits should be [B, T, V] = [2, 6, 50] (the target's LM head over out), got {getattr(logits, 'shape', logits)}")
    if not torch.allclose(out, want_out, atol=1e-4):
        with torch.no_grad():
            swapped = net.layer(net.fc(torch.cat([feature, net._embed(tokens)], -1)), torch.arange(6))
            no_layer = net.fc(torch.cat([net._embed(tokens), feature], -1))
        check(not torch.allclose(out, swapped, atol=1e-4), "you concatenated [feature, embedding]: the fc was "
              "trained on [embed(tokens), feature], in that order (torch.cat([..], dim=-1))")
        check(not torch.allclose(out, no_layer, atol=1e-4), "out is fc's output: run it through net.layer(x, "
              "positions) too, with positions = torch.arange(T)")
        check(False, "out differs from net.layer(net.fc(cat([embed(tokens), feature], -1)), arange(T)); "
              "check the concatenation dim (-1) and the positions")
    check(torch.allclose(logits, want_logits, atol=1e-4), "logits must be the target's LM head over out "
          "(net.logits(out)), not over the feature or fc's output")
    passed("exercise 1: fc([embed(next token), feature]) -> one decoder layer -> the target's LM head")


@grader
def check_expand(expand: Callable) -> None:
    """Exercise 06.2: expand(scores [m], logp [m, V], k) -> the k best children (rows, tokens, scores), best first."""
    g = seeded(6)
    for m, V, k in [(1, 10, 3), (3, 12, 3), (4, 9, 2)]:
        scores = -torch.rand(m, generator=g) * 3  # [m] cumulative log-probs of the frontier
        logp = torch.log_softmax(torch.randn(m, V, generator=g) * 2, -1)  # [m, V]
        got = call(expand, scores, logp, k)
        check(isinstance(got, (tuple, list)) and len(got) == 3, f"return (rows, tokens, scores), got {got!r}")
        rows, tokens, sc = (torch.as_tensor(x).reshape(-1) for x in got)
        w_rows, w_tokens, w_sc = (x[:k] for x in expand_step(scores, logp, k))
        check(len(rows) == len(tokens) == len(sc) == k, f"m={m}, k={k}: keep exactly k = {k} children in all "
              f"(the best of the m * k candidates), got {len(rows)}, {len(tokens)}, {len(sc)}")
        if not torch.allclose(sc.double(), w_sc.double(), atol=1e-5):
            own = logp.reshape(-1).topk(k).values
            check(not torch.allclose(sc.double(), own.double(), atol=1e-5), f"m={m}: the scores are the children's own "
                  "log-probs: add each parent's score (the cumulative log-prob of the whole path)")
            check(False, f"m={m}, k={k}: scores {sc.tolist()}, expected {w_sc.tolist()} (parent score + child "
                  "log-prob, best first)")
        check(rows.tolist() == w_rows.tolist() and tokens.tolist() == w_tokens.tolist(),
              f"m={m}, k={k}: (rows, tokens) {list(zip(rows.tolist(), tokens.tolist()))}, expected "
              f"{list(zip(w_rows.tolist(), w_tokens.tolist()))}: rows index the frontier, tokens the vocabulary")
    passed("exercise 2: children scored by cumulative log-prob; the k best of m * k kept")


@grader
def check_ttt_unroll(ttt_unroll: Callable) -> None:
    """Exercise 06.3: ttt_unroll(net, feature [B, T, H], tokens [B, T], steps) -> outputs of every unrolled step."""
    _, net = _eagle_case(version=3, seed=2)
    g = seeded(7)
    feature = torch.randn(1, 7, 32, generator=g)
    tokens = torch.randint(0, 50, (1, 7), generator=g)
    with torch.no_grad():
        got = call(ttt_unroll, net, feature, tokens, 3)
        want = unroll(net, feature, tokens, 3)
    check(isinstance(got, (list, tuple)) and len(got) == 3, f"return a list with one [B, T, H] output per step "
          f"(3 here), got {type(got).__name__} of length {len(got) if hasattr(got, '__len__') else '?'}")
    check(all(isinstance(o, Tensor) and o.shape == (1, 7, 32) for o in got), "each step's output is [B, T, H]")
    check(torch.allclose(got[0], want[0], atol=1e-4), "step 0 is the ordinary causal pass over the TRUE features "
          "(positions arange(T), mask ttt_mask(T, 0))")
    if not torch.allclose(got[1], want[1], atol=1e-4):
        with torch.no_grad():
            cache = KVCache()
            net(feature, tokens, torch.arange(7), ttt_mask(7, 0), cache)
            no_shift = net(want[0], tokens, torch.arange(7), ttt_mask(7, 1), cache)
            fresh = net(torch.cat([torch.zeros_like(want[0][:, :1]), want[0][:, :-1]], 1), tokens, torch.arange(7))
            cache = KVCache()
            net(feature, tokens, torch.arange(7), ttt_mask(7, 0), cache)
            shifted_true = net(torch.cat([torch.zeros_like(feature[:, :1]), feature[:, :-1]], 1), tokens,
                               torch.arange(7), ttt_mask(7, 1), cache)
        check(not torch.allclose(got[1], shifted_true, atol=1e-4), "step 1 reads the TRUE features shifted: feed the "
              "draft's own outputs of the previous step instead, as drafting must (that is the training-time test)")
        check(not torch.allclose(got[1], no_shift, atol=1e-4), "step 1 feeds position p the output at p - 1 (the "
              "feature the draft predicted for p): shift the previous outputs right by one, zeros at position 0")
        check(not torch.allclose(got[1], fresh, atol=1e-4), "step 1 ran without the cache of step 0: keep ONE KVCache "
              "for all steps and pass ttt_mask(T, i), so a drafted position sees the true features before it")
        check(False, "step 1 differs: input = previous step's outputs shifted right by one (zeros first), same "
              "tokens and positions, mask ttt_mask(T, 1), the same cache")
    check(torch.allclose(got[2], want[2], atol=1e-4), "step 2 differs: each step reads the step before it, not the "
          "true features or step 0")
    passed("exercise 3: each unrolled step reads the draft's own previous outputs, as drafting does")
