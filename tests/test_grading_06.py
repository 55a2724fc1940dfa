"""Chapter 06's graders: they pass right answers and name the mistake in wrong ones."""
import pytest
import torch

from specdec_lab import grading
from specdec_lab.eagle import KVCache, expand_step, ttt_mask, unroll


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
        cache, outs, first = KVCache(), [], feature
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


def test_right_answers_pass(capsys):
    grading.check_eagle_forward(_forward())
    grading.check_expand(_expand())
    grading.check_expand(lambda s, l, k: tuple(x[:k] for x in expand_step(s, l, k)))
    grading.check_ttt_unroll(_unroll())
    grading.check_ttt_unroll(unroll)
    assert capsys.readouterr().out.count("PASS") == 5


@pytest.mark.parametrize("wrong,hint", [
    (_forward(order="feature first"), "concatenated \\[feature, embedding\\]"),
    (_forward(layer=False), "run it through net.layer"),
    (_forward(head="x"), "LM head over out"),
    (lambda net, f, t: (f, f), "logits should be"),
])
def test_forward_hints(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        grading.check_eagle_forward(wrong)


@pytest.mark.parametrize("wrong,hint", [
    (_expand(cumulative=False), "add each parent's score"),
    (_expand(per_parent=True), "keep exactly k"),
])
def test_expand_hints(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        grading.check_expand(wrong)


@pytest.mark.parametrize("wrong,hint", [
    (_unroll(shift=False), "shift the previous outputs right by one"),
    (_unroll(shared_cache=False), "keep ONE KVCache"),
    (_unroll(true_features=True), "draft's own outputs"),
    (lambda net, f, t, steps: [net(f, t, torch.arange(f.shape[1]))], "one \\[B, T, H\\] output per step"),
])
def test_unroll_hints(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        grading.check_ttt_unroll(wrong)


def test_stubs_get_the_not_implemented_hint():
    def stub(*args):
        raise NotImplementedError("stub: your code here")
    for check in (grading.check_eagle_forward, grading.check_expand, grading.check_ttt_unroll):
        with pytest.raises(AssertionError, match="not implemented yet"):
            check(stub)
