"""specdec_lab.widgets: the explorer builds and updates, and the static fallback draws the same numbers."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from specdec_lab import economics, measure, widgets  # noqa: E402


def test_summary_matches_economics():
    s = widgets.summary(0.8, 4, 0.05, 64)
    m = economics.QWEN25_7B_ON_H100
    assert s["tokens_per_pass"] == economics.expected_tokens(0.8, 4)
    assert s["speedup_free_verify"] == economics.speedup(0.8, 4, 0.05)
    assert s["speedup_at_batch"] == pytest.approx(m.speedup(0.8, 4, 0.05, 64))
    assert s["best_gamma_free_verify"] == economics.optimal_gamma(0.8, 0.05, 16)
    assert s["best_gamma_at_batch"] == 3


def test_explorer_updates_its_numbers():
    box = widgets.explorer()
    (alpha, gamma), (c, batch) = box.children[0].children, box.children[1].children
    text = box.children[2]
    assert "3.36" in text.value and "2.80×" in text.value  # α 0.8, γ 4, c 0.05
    batch.value = 256
    assert "0.90×" in text.value and "batch 256" in text.value
    alpha.value = 0.0
    assert "<b>1.00</b> tokens per target pass" in text.value and "<b>0</b>" in text.value
    plt.close("all")


def test_speedup_grid_has_one_panel_per_batch_and_c():
    fig = widgets.speedup_grid(batches=(1, 128), cs=(0.05, 0.15), alphas=(0.7, 0.9), max_gamma=8)
    assert len(fig.axes) == 4
    ax = fig.axes[0]  # batch 1, c = 0.05: the plain formula (verification is free at batch 1)
    ys = ax.lines[0].get_ydata()
    assert ys[3] == pytest.approx(economics.speedup(0.7, 4, 0.05))
    plt.close(fig)


def shown(obj, monkeypatch) -> dict:
    """The bundle IPython shows for `obj`: through _repr_mimebundle_ (ipywidgets 8) or _ipython_display_ (7)."""
    import IPython.display
    from IPython.core.formatters import DisplayFormatter

    published = []
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: published.append(data))
    data, _ = DisplayFormatter().format(obj)
    return published[0] if published else data


def test_explorers_show_a_placeholder_not_their_widget_tree_as_text(monkeypatch):
    box = widgets.explorer()
    assert repr(box) == widgets.EXPLORER_TEXT and "VBox(children" not in repr(box)
    assert box._repr_mimebundle_()["text/plain"] == widgets.EXPLORER_TEXT  # what a page without a kernel shows
    bundle = shown(box, monkeypatch)  # what IPython shows, in ipywidgets 7 (Colab's) as in 8
    assert bundle["text/plain"] == widgets.EXPLORER_TEXT
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == box.model_id
    assert repr(widgets.tree_explorer()) == widgets.TREE_EXPLORER_TEXT
    plt.close("all")


def test_tree_explorer_labels_are_whole():
    box = widgets.tree_explorer()
    sliders = [s for row in box.children[:2] for s in row.children]
    assert {s.description for s in sliders} >= {"s (cost per node)", "α (hit rate)", "wide levels"}
    assert all(s.style.description_width == "initial" for s in sliders)
    plt.close("all")


def test_a_curve_under_another_gets_no_legend_entry_of_its_own():
    fig, ax = plt.subplots()
    widgets._draw(ax, economics.QWEN25_7B_ON_H100, 0.8, 4, 0.05, 1, 8)  # batch 1: the two curves coincide
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["batch 1, roofline: verification free"]
    ax.clear()
    widgets._draw(ax, economics.QWEN25_7B_ON_H100, 0.8, 4, 0.05, 256, 8)
    assert len(ax.get_legend().get_texts()) == 2
    ax.clear()
    widgets._tree_curves(ax, [[1, 1, 1], [1, 1, 1]], 0.7, 0.05, 0.1)  # width 1: the tree is the chain
    assert len(ax.get_legend().get_texts()) == 1
    plt.close(fig)


def test_tree_grid_fits_every_curve():
    fig = widgets.tree_grid(hits=(0.6, 0.9), cs=(0.05, 0.3))
    top = max(max(line.get_ydata()) for ax in fig.axes for line in ax.lines)
    for ax in fig.axes:
        lo, hi = ax.get_ylim()
        assert lo == 0 and hi >= top, f"{ax.get_title()}: y axis ends at {hi:.2f}, a curve reaches {top:.2f}"
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == len(widgets.SHAPES)
    plt.close(fig)


def test_run_button_is_busy_while_it_runs(monkeypatch):
    import torch

    class Tok:
        eos_token_id = None

        def __call__(self, text, return_tensors):
            return type("Enc", (), {"input_ids": torch.tensor([[1, 2, 3]])})()

    seen = []
    box = widgets.tree_explorer(pair=(torch.nn.Linear(1, 1), None, Tok()), prompts=[{"id": "p0", "prompt": "x"}])
    button, result = box.children[-2].children[1], box.children[-1]

    def fake_measure(target, draft, ids, branching, max_new_tokens, eos):
        seen.append((button.disabled, button.description, result.value))
        return {"branching": branching, "hit": [0.5], "predicted_tau": 2.0, "measured_tau": 2.5, "target_calls": 4,
                "nodes_per_pass": 3.0, "same_as_greedy": True}

    monkeypatch.setattr(measure, "measure_tree", fake_measure)
    button.click()
    assert seen and seen[0][0] and seen[0][1] == "running…" and "running the real pair on p0" in seen[0][2]
    assert not button.disabled and button.description == "run the real pair"
    assert "measured τ <b>2.50</b>" in result.value and "identical to greedy: True" in result.value

    def fail(*args):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(measure, "measure_tree", fail)
    button.click()  # ipywidgets logs a callback's exception; the button must come back all the same
    assert not button.disabled and "the run failed: RuntimeError: out of memory" in result.value
    plt.close("all")


# ---- chapter 03: the round stepper -----------------------------------------------------------------------

PROMPT = "def add(a, b):\n    "


def passes(tokens, accept_lengths):
    """generate's tokens split into what each target pass emitted: its accepted drafts and one token (the
    last pass may be cut short by EOS or the budget)."""
    out, i = [], 0
    for n in accept_lengths:
        out.append(tokens[i:i + n + 1])
        i += n + 1
    return out


def run(stepper):
    rounds = []
    while not stepper.done:
        rounds.append(stepper.step())
    return rounds


@pytest.mark.parametrize("temperature, seed, top_k", [(0.8, 0, None), (1.0, 3, None), (0.7, 5, 20), (0.0, 1, None)])
def test_each_round_emits_what_generate_emits(pair, temperature, seed, top_k):
    import torch

    from specdec_lab import DraftModelDrafter, decoding

    target, draft, tok = pair
    stepper = widgets.RoundStepper(target, draft, PROMPT, gamma=3, temperature=temperature, tokenizer=tok,
                                   top_k=top_k, seed=seed, max_new_tokens=40, eos_token_id=tok.eos_token_id)
    rounds = run(stepper)
    gen = decoding.generate(target, tok(PROMPT, return_tensors="pt").input_ids, DraftModelDrafter(draft, 3),
                            max_new_tokens=40, temperature=temperature, top_k=top_k, eos_token_id=tok.eos_token_id,
                            generator=torch.Generator().manual_seed(seed))
    assert len(rounds) == gen.target_calls > 5
    assert [r.accepted for r in rounds] == gen.accept_lengths, "the stepper's accept counts differ from generate's"
    assert [r.emitted for r in rounds] == passes(gen.tokens, gen.accept_lengths), "a round emitted other tokens"
    assert stepper.tokens == gen.tokens
    kinds = {r.kind for r in rounds}
    assert "correction" in kinds and "bonus" in kinds, f"this text should show both endings of a round: {kinds}"
    for r in rounds:  # what the stepper shows is what decided
        t0, t1, t2 = r.target_cache
        assert t2 == r.committed + len(r.emitted) - 1, "the target cache keeps the committed text but its last token"
        assert t1 == r.committed + len(r.drafts)
        if r.drafts and not r.done:  # (a last round that drafts nothing leaves the draft as it was)
            assert r.draft_cache[1] == r.committed + len(r.drafts) - 1
            assert r.draft_cache[2] == t2 - (r.kind == "bonus"), "the draft lags one after a bonus, never otherwise"
        assert r.p.shape == (len(r.drafts) + 1, target.config.vocab_size)
        if not r.drafts:
            continue
        n = r.accepted
        if temperature == 0:  # a draft passes when it is the target's argmax; the correction is the argmax
            best = r.p.argmax(-1).tolist()  # [γ+1]
            assert r.u is None and r.q is None and r.drafts[:n] == best[:n] and r.emitted == best[:len(r.emitted)]
            continue
        x = torch.tensor(r.drafts)
        passed = (torch.tensor(r.u) * r.q[range(len(x)), x] < r.p[range(len(x)), x]).tolist()
        assert (passed + [False]).index(False) == r.accepted, "u·q < p does not give the round's accept count"
        if r.kind == "correction":
            assert r.residual is not None and float(r.residual.sum()) == pytest.approx(1, abs=1e-5)
            want = (r.p[n] - r.q[n]).clamp_min(0)
            assert torch.allclose(r.residual, want / want.sum(), atol=1e-6), "the residual is not norm(max(p - q, 0))"
            assert float(r.residual[r.emitted[-1]]) > 0, "the correction was drawn from where the residual has no mass"


def test_a_prompt_may_be_text_a_tokenizer_output_or_ids(pair):
    target, draft, tok = pair
    enc = tok(PROMPT, return_tensors="pt")
    forms = [PROMPT, enc, enc.input_ids, enc.input_ids[0].tolist()]
    got = [[r.emitted for r in (lambda s: [s.step() for _ in range(3)])(
        widgets.RoundStepper(target, draft, form, tokenizer=tok, seed=2))] for form in forms]
    assert all(g == got[0] for g in got), got
    with pytest.raises(ValueError, match="tokenizer"):
        widgets._prompt_ids(PROMPT, None)


def test_one_model_and_a_draft_made_from_it(pair):
    """A single model and a draft of its own (its first layers): the tokenizer comes from the model's folder."""
    import torch

    from specdec_lab import DraftModelDrafter, decoding, draft_models

    target, _, tok = pair
    early = draft_models.early_exit_model(target, 4)
    stepper = widgets.RoundStepper(target, early, PROMPT, gamma=2, temperature=0.9, seed=4, max_new_tokens=20)
    assert stepper.tokenizer is not None and stepper.tokenizer.decode(stepper.ids[0].tolist()) == PROMPT
    run(stepper)
    gen = decoding.generate(target, tok(PROMPT, return_tensors="pt").input_ids, DraftModelDrafter(early, 2),
                            max_new_tokens=20, temperature=0.9, generator=torch.Generator().manual_seed(4))
    assert stepper.tokens == gen.tokens and [r.accepted for r in stepper.rounds] == gen.accept_lengths
    with pytest.raises(ValueError, match="chain"):
        widgets.RoundStepper(target, DraftModelDrafter(early, branching=[2, 1]), PROMPT)


def test_round_in_words_and_as_bars(pair):
    from specdec_lab import viz

    target, draft, tok = pair
    stepper = widgets.RoundStepper(target, draft, PROMPT, gamma=3, temperature=0.8, tokenizer=tok, seed=0)
    rounds = [stepper.step() for _ in range(3)]
    for r in rounds:
        lines = widgets.round_lines(r, tok)
        assert lines[0].startswith(f"round {r.index + 1}: text of {r.committed} tokens")
        assert sum("u·q" in line for line in lines) == min(r.accepted + 1, 3)
        assert f"target cache {r.target_cache[0]} → {r.target_cache[1]}" in lines[-1]
        assert any(r.kind in line for line in lines)
        fig = widgets.round_figure(r, tok)
        assert len(fig.axes) == 4
        plt.close(fig)
        ax = viz.draw_round(r, tok)
        texts = [t.get_text() for t in ax.texts]
        assert "ONE pass\n4 rows of p" in texts and texts.count("roll back") == 2
        assert f"cache {r.target_cache[2]} = text − 1" in texts
        assert sum(t.startswith(("✓", "✗", "–")) for t in texts) == 3
        plt.close(ax.figure)
    greedy = widgets.RoundStepper(target, draft, PROMPT, temperature=0.0, tokenizer=tok).step()
    assert "the target's argmax is" in widgets.round_lines(greedy, tok)[1]


def test_stepper_widget_steps_and_shows_a_placeholder_as_text(pair, monkeypatch):
    target, draft, tok = pair
    box = widgets.round_stepper(target, draft, PROMPT, tokenizer=tok, seed=0, max_new_tokens=8)
    assert repr(box) == widgets.STEPPER_TEXT and shown(box, monkeypatch)["text/plain"] == widgets.STEPPER_TEXT
    button, status = box.children[0].children
    words = box.children[2]
    assert "<b>round 1</b>" in status.value and "round 1: text of" in words.value
    button.click()
    assert "<b>round 2</b>" in status.value and "round 2: text of" in words.value
    assert box.stepper.rounds[1].committed == box.stepper.rounds[0].committed + len(box.stepper.rounds[0].emitted)
    while not button.disabled:
        button.click()
    assert box.stepper.done and len(box.stepper.tokens) == 8 and button.description == "text complete"
    plt.close("all")
