"""Tests for Medusa heads, their training loss, and MedusaDrafter in generate() (chapter 05): typical acceptance,
a draft vocabulary, the shipped heads' τ. The registry's Medusa row goes through test_exactness.py."""
import json

import pytest
import torch
from helpers import prompt_ids, tiny_llama

from specdec_lab import generate, lm, measure
from specdec_lab.medusa import MEDUSA_DIR, MedusaDrafter, MedusaHeads
from specdec_lab.training import head_accuracy, head_loss, self_labels, train_heads
from specdec_lab.tree import DraftTree, choices_parents, verify_tree_typical

ZOO = (MEDUSA_DIR / "heads.safetensors").exists()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(layers=3, seed=0)


def _trained_heads(target, seed=0, scale=0.3):
    """Heads with random (not zero) residual weights: they guess differently from the target."""
    heads = MedusaHeads.for_target(target, 3)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return heads.eval()


def test_fresh_head_is_the_identity_and_heads_are_distinct(target):
    heads = MedusaHeads.for_target(target, 3)
    h = torch.randn(5, 64)
    logits = heads(h)  # [K, 5, V]
    assert logits.shape == (3, 5, 300)
    for k in range(3):
        torch.testing.assert_close(logits[k], target.lm_head(h))
    assert len({id(m.linear.weight) for m in heads.heads}) == 3, "each head needs its own weights"
    assert all(not p.requires_grad for p in target.lm_head.parameters()), "the shared LM head stays frozen"
    assert sum(p.numel() for p in heads.parameters()) == 3 * (64 * 64 + 64), "the shared LM head is not saved"


def test_head_loss_uses_the_k_plus_2_shift():
    V, T = 7, 9
    labels = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    logits = torch.full((3, 2, T, V), -20.0)
    for k in range(3):
        for t in range(T - k - 2):
            logits[k, :, t].scatter_(-1, labels[:, t + k + 2, None], 20.0)  # head k at t sees token t+k+2
    loss, per_head = head_loss(logits, labels)
    assert max(per_head) < 1e-6 and loss.item() < 1e-6
    _, shifted = head_loss(logits.roll(1, dims=2), labels)
    assert min(shifted) > 1.0, "an off-by-one label shift must cost a lot"


def test_self_labels():
    x = torch.tensor([[5, 6, 7, 8]])
    best = torch.tensor([[1, 2, 3, 4]])  # the target's prediction for the NEXT token at each position
    assert self_labels(x, best).tolist() == [[5, 1, 2, 3]]


def test_training_lowers_the_loss_and_accuracy_falls_with_offset(target):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 300, (24, 32), generator=g)
    logits, hidden = lm.forward(target, x, hidden=True)
    h, labels = hidden[-1].detach(), self_labels(x, logits.argmax(-1))
    heads = MedusaHeads.for_target(target, 3)
    log = train_heads(heads, h, labels, steps=60, batch=8, lr=3e-3, log_every=59, progress=False)
    first, last = log[0][1:], log[-1][1:]
    assert all(b < a for a, b in zip(first, last)), f"training should lower every head's loss: {log}"
    acc = head_accuracy(heads, h, labels, ks=(1, 5))
    assert acc[5][0] >= acc[1][0] and len(acc[1]) == 3


@pytest.mark.parametrize("seed", range(3))
def test_typical_acceptance_is_greedy_at_temperature_0(target, seed):
    heads = _trained_heads(target, seed)
    choices = [(0,), (1,), (0, 0), (1, 0), (0, 1), (0, 0, 0)]
    ids = prompt_ids(seed)
    want = measure.hf_generate(target, ids, 30).tolist()
    gen = generate(target, ids, MedusaDrafter(heads, choices), max_new_tokens=30, typical=(0.09, 0.3))
    assert gen.tokens == want, "typical acceptance is lossy when sampling, exact at temperature 0"
    assert gen.draft_nodes[0] == 0 and gen.draft_nodes[1] == len(choices), "prefill first, then the tree"


def test_a_draft_vocabulary_keeps_medusa_exact_and_survives_saving(target, tmp_path):
    heads = _trained_heads(target, 1)
    heads.use_vocab(torch.arange(0, target.config.vocab_size, 3))  # every third token
    h = torch.randn(2, 5, target.config.hidden_size)
    full, small = heads(h), heads(h, draft=True)  # [K, 2, 5, V], [K, 2, 5, 100]
    assert torch.equal(full[..., ::3], small) and torch.isinf(full[..., 1::3]).all()
    ids = prompt_ids(4)
    want = measure.hf_generate(target, ids, 30).tolist()
    assert generate(target, ids, MedusaDrafter(heads, [(0,), (1,), (0, 0)]), max_new_tokens=30).tokens == want
    heads.save(tmp_path)
    assert torch.equal(MedusaHeads.from_pretrained(target, tmp_path).d2t, heads.d2t)


def test_medusa_with_perfect_heads_accepts_everything(target):
    """Heads that always know the target's greedy future (an oracle) make τ = depth + 1."""
    ids = prompt_ids(4)
    future = measure.hf_generate(target, ids, 40).tolist()

    class Oracle(MedusaDrafter):
        def propose(self, ids_, warp, limit):
            if self.h is None:
                return super().propose(ids_, warp, limit)
            done = ids_.shape[1] - ids.shape[1]  # tokens generated so far; the next is the pending one
            from specdec_lab.tree import DraftTree
            return DraftTree.chain(future[done: done + min(3, limit)])

    gen = generate(target, ids, Oracle(_trained_heads(target), [(0,), (0, 0), (0, 0, 0)]), max_new_tokens=40)
    assert gen.tokens == future and max(gen.accept_lengths) == 3


def test_choices_deeper_than_heads_is_an_error(target):
    with pytest.raises(ValueError, match="heads"):
        MedusaDrafter(MedusaHeads.for_target(target, 2), [(0,), (0, 0), (0, 0, 0)])


def test_typical_acceptance_rule():
    p = torch.tensor([[0.6, 0.3, 0.1], [0.34, 0.33, 0.33]])  # confident root; uncertain node 1
    tree = DraftTree([2, 1], [-1, -1])  # the pending token's children: token 2 (p 0.1), token 1 (p 0.3)
    path, _ = verify_tree_typical(tree, torch.cat([p, p[1:]]), threshold=0.09, alpha=0.3)
    assert path == [0], "token 2 has p 0.1 > min(0.09, 0.3 exp(-H)): the first child is accepted"
    path, _ = verify_tree_typical(tree, torch.cat([p, p[1:]]), threshold=0.2, alpha=0.3)
    assert path == [1], "with a higher bar only token 1 (p 0.3) passes"


@pytest.mark.skipif(not ZOO, reason="Medusa heads not trained yet (`specdec-lab train-zoo --stage medusa`)")
def test_zoo_heads_help_on_the_suite(pair):
    from specdec_lab.prompts import load_prompts

    target, _, tok = pair
    drafter = MedusaDrafter.from_zoo(target)
    calls = tokens = 0
    for p in load_prompts()[::4]:
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        gen = generate(target, ids, drafter, max_new_tokens=24)
        calls, tokens = calls + gen.target_calls, tokens + len(gen.tokens)
    assert tokens / calls > 1.5, f"the shipped heads should help: τ = {tokens / calls:.2f}"
    card = json.loads((MEDUSA_DIR / "config.json").read_text())
    top1 = card["val_topk_vs_target"]["1"]
    assert all(a > b for a, b in zip(top1, top1[1:])), f"head accuracy should fall with offset: {top1}"


def test_choices_tree_matches_medusa_layout():
    assert choices_parents([(0,), (1,), (0, 0), (1, 0)]) == [-1, -1, 0, 1]
