"""Training on the frozen target's states: the one loop behind Medusa's heads and EAGLE's drafts.

Medusa heads (chapter 05) and EAGLE drafts (chapter 06) are small modules trained while the target stays
frozen. The target's part never changes, so it runs once: `cache_states` stores its hidden states (the last
one, plus any chosen layers) and its own greedy choices, the labels of self-distillation. After that a step
reads a few random cached windows and never runs the target. The two methods differ only in what a module
computes from those states and how it is scored, so one loop serves both: `fit` takes the loss as a function
of the sampled windows (`medusa_objective`, `eagle_objective`) and a `Recipe` (steps, batch, learning rate,
clipping), and does the rest the same way for both (AdamW, the schedule `lr_at`, the log, a checkpoint).

The losses live here too, next to the loop they feed, while medusa.py and eagle.py keep the modules and their
drafters (and weights.py their files):

    Medusa-1 (chapter 05)   cache_hidden, self_labels, head_loss (head k scored k + 2 ahead), train_heads, head_accuracy
    EAGLE (chapter 06)      ttt_mask, unroll (the training-time test), eagle_loss, train_eagle_net, eagle_accuracy

They use only what the module passed in computes (its forward, `combine`, `to_draft`, `draft_logits`), so this
file imports neither medusa nor eagle. `specdec-lab train-heads` and `train-zoo` run them through one front-end,
train_heads.py, whose table RECIPES holds each method's Recipe.

The zoo's language models (train_zoo.train) share `lr_at` and `optimizer_step` but keep a loop of their own:
see that function's docstring for why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from specdec_lab import lm, vocab
from specdec_lab.precision import autocast

__all__ = ["Recipe", "cache_states", "lr_at", "optimizer_step", "fit", "cache_hidden", "self_labels", "head_loss",
           "medusa_objective", "train_heads", "head_accuracy", "ttt_mask", "unroll", "eagle_loss", "eagle_objective",
           "train_eagle_net", "eagle_accuracy", "draft_objective", "draft_accuracy"]

SAVE_EVERY = 60.0  # seconds between two checkpoints of a run


@dataclass(frozen=True)
class Recipe:
    """How one head set or draft trains (a row of train_heads.RECIPES; the card records it as "config").

    `fit` reads steps, batch, lr, clip, seed and log_every; `eagle_objective` noise and ttt_steps; the front-end
    the rest: how many windows of how many tokens, the module's size, the draft vocabulary.
    """
    steps: int = 300  # optimizer steps (an upper bound under a time budget)
    batch: int = 8  # cached windows per step
    lr: float = 1e-3  # the peak learning rate (`lr_at`)
    clip: float | None = None  # the bound on the gradient norm; None: not clipped
    seed: int = 0  # the batches (and, in the front-end, the windows and the initial weights)
    log_every: int = 25  # the log holds step 1 and every log_every-th
    version: int | None = None  # EAGLE-1 or EAGLE-3; None: Medusa heads
    heads: int | None = None  # Medusa: how many heads; EAGLE: attention heads (None: the target's)
    mlp: int | None = None  # EAGLE's MLP width (None: the target's)
    noise: float = 0.0  # EAGLE-1: the std of Gaussian noise on the input features
    ttt_steps: int = 1  # EAGLE: unrolled training-time-test steps
    windows: int = 800  # training windows whose target states are cached (capped to fit in memory)
    seq_len: int = 256  # tokens per window
    draft_vocab: int | None = None  # score only this many frequent tokens, where the vocabulary is over twice that
    block: bool = False  # EAGLE-1's draft with placeholders: ttt_steps tokens drafted in one forward (eagle.BlockNet)
    draft_layers: int | None = None  # a draft model distilled from the target: its first layers it copies (<= half)
    init: str | None = None  # a block drafter: start from this target's trained draft of this method ("eagle1")


@torch.no_grad()
def cache_states(target, windows: Tensor, layers: Sequence[int] = (), batch: int = 16) -> tuple[Tensor, Tensor]:
    """Run the frozen target once over windows [N, T]: (states [N, T, S, H] bf16, argmax [N, T]).

    states[..., s, :] is hidden_states[layers[s]] for s < len(layers), and the last state (after the
    final norm, what the LM head reads) at s = -1, so S = len(layers) + 1. argmax[:, t] is the target's
    greedy choice for token t+1 (the labels of self-distillation).
    """
    out, best = [], []
    for i in range(0, len(windows), batch):
        logits, hidden = lm.forward(target, windows[i: i + batch], hidden=True)
        states = torch.stack([hidden[j] for j in layers] + [hidden[-1]], 2)  # [b, T, S, H]
        out.append(states.to(torch.bfloat16).cpu())  # in host memory: a real target's states outgrow a GPU's
        best.append(logits.argmax(-1).cpu())  # [b, T]
    return torch.cat(out), torch.cat(best)


def lr_at(step: int, total: int, peak: float, warmup: int = 20, floor: float = 0.0,
          after_warmup: bool = False) -> float:
    """The learning rate at `step` of `total`: a linear warmup over `warmup` steps and a cosine decay from
    `peak` to `floor * peak`.

    after_warmup=False (the heads and drafts): the warmup ramp multiplies a cosine that decays from step 0.
    after_warmup=True (the zoo's models): the ramp reaches the peak, then the cosine spans the remaining steps.
    (The two branches round their arithmetic in the orders the shipped weights were trained with, so that
    retraining reproduces them bit for bit.)
    """
    if after_warmup:
        if step < warmup:
            return peak * (step + 1) / warmup
        ramp, angle = 1.0, math.pi * ((step - warmup) / max(1, total - warmup))
    else:
        ramp, angle = min(1.0, (step + 1) / warmup), math.pi * step / total
    return peak * ramp * (floor + (1 - floor) * 0.5 * (1 + math.cos(angle)))


def optimizer_step(opt: torch.optim.Optimizer, loss: Tensor, lr: float, clip: float | None = None) -> None:
    """One update: the gradients of `loss`, their norm clipped to `clip` (None: not clipped), a step of `opt`
    at learning rate `lr`, then the gradients cleared."""
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_([p for group in opt.param_groups for p in group["params"]], clip)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    opt.zero_grad(set_to_none=True)


def fit(module: nn.Module, loss_fn: Callable[[Tensor, torch.Generator], tuple[Tensor, list[float]]],
        n_examples: int, recipe: Recipe, progress: bool = True, precision: str = "auto",
        checkpoint: Path | str | None = None, deadline: float | None = None) -> list[tuple]:
    """Train module's trainable parameters for recipe.steps steps; returns the log [(step, *parts), ...].

    Each step draws recipe.batch random example indices idx [batch] out of n_examples (from a generator seeded
    with recipe.seed) and calls loss_fn(idx, generator) -> (loss, parts): the loss to minimise and the numbers
    to log (floats; the generator is there for any noise the loss adds). AdamW without weight decay, the
    learning rate `lr_at(step, steps, recipe.lr)`, the gradient norm clipped to recipe.clip. precision: "auto"
    runs the products in bf16 only where the hardware does bf16 natively (`precision.autocast`), "fp32" gives
    the same numbers on every machine.

    checkpoint: a file that holds the run so far (weights, optimizer, generator, log, step), written every
    SAVE_EVERY seconds and when the run stops; a run that finds it resumes from it (its step count included)
    and deletes it when done. deadline: a time.monotonic() after which the run stops early, saving the checkpoint.
    """
    steps, batch, lr = recipe.steps, recipe.batch, recipe.lr
    g = torch.Generator().manual_seed(recipe.seed)
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    log, first = [], 0
    if checkpoint is not None and Path(checkpoint).exists():
        state = torch.load(checkpoint, weights_only=False)
        module.load_state_dict(state["module"])
        opt.load_state_dict(state["optimizer"])
        g.set_state(state["generator"])
        log, first, steps = state["log"], state["step"], state["steps"]

    def save() -> None:  # the run after `done` steps: what a rerun needs to go on exactly as if never stopped
        torch.save({"module": module.state_dict(), "optimizer": opt.state_dict(), "generator": g_done,
                    "log": log, "step": done, "steps": steps}, checkpoint)

    module.train()
    bar = tqdm(range(first, steps), desc=type(module).__name__, disable=not progress, mininterval=2, initial=first,
               total=steps)
    saved, done, g_done = time.monotonic(), first, g.get_state()
    try:
        for step in bar:
            if deadline is not None and time.monotonic() > deadline:
                break
            idx = torch.randint(0, n_examples, (batch,), generator=g)  # [batch] which examples this step reads
            with autocast(params[0].device, precision):
                loss, parts = loss_fn(idx, g)
            optimizer_step(opt, loss, lr_at(step, steps, lr), recipe.clip)
            if (step + 1) % recipe.log_every == 0 or step == 0:
                log.append((step + 1, *[round(v, 4) for v in parts]))
            done, g_done = step + 1, g.get_state()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if checkpoint is not None and time.monotonic() - saved > SAVE_EVERY:
                save()
                saved = time.monotonic()
    except KeyboardInterrupt:  # Ctrl-C: keep what was trained (a step cut short is redone, on the same examples)
        if checkpoint is not None:
            save()
        raise
    finally:
        bar.close()
    if checkpoint is not None:
        if done < steps:
            save()  # stopped by the deadline: the next run resumes here
        elif Path(checkpoint).exists():
            Path(checkpoint).unlink()  # finished: the checkpoint has served its purpose
    module.eval()
    return log


# ---- Medusa-1's heads (chapter 05): the target stays frozen -----------------------------------------------


def cache_hidden(target, windows: Tensor, batch: int = 16) -> tuple[Tensor, Tensor]:
    """Run the frozen target once over windows [N, T]: (last hidden states [N, T, H] bf16, argmax [N, T]).

    The hidden state is the one the LM head reads (after the final norm). argmax[:, t] is the target's own
    greedy prediction for token t+1: the labels for self-distillation. (`cache_states` without
    extra layers, its one state per position unwrapped.)
    """
    states, best = cache_states(target, windows, batch=batch)  # [N, T, 1, H], [N, T]
    return states[:, :, -1], best


def self_labels(windows: Tensor, argmax: Tensor) -> Tensor:
    """Labels for self-distillation, [N, T]: position j holds the target's own greedy choice for token j.

    argmax[:, j - 1] (from cache_hidden) is what the target predicts for token j; position 0 keeps the text.
    Trained on these, a head learns what the TARGET would write, which is what greedy verification accepts.
    """
    return torch.cat([windows[:, :1], argmax[:, :-1]], 1)  # [N, T]


def head_loss(logits: Tensor, labels: Tensor, weights: Sequence[float] | None = None) -> tuple[Tensor, list[float]]:
    """Medusa-1 loss: head k at position t is scored against labels[t + k + 2].

    logits: [K, B, T, V] from MedusaHeads over hidden states [B, T, H]; labels: [B, T] token ids (the text,
    or the target's own next-token argmax shifted by one, see train_heads). Position t of head k has a label
    only while t + k + 2 < T. weights: per-head factors (default 0.8^k). Returns (weighted sum, per-head CE).
    """
    K = logits.shape[0]
    weights = [0.8 ** k for k in range(K)] if weights is None else weights
    total, per_head = logits.new_zeros(()), []
    for k in range(K):
        shift = k + 2
        pred = logits[k, :, : -shift]  # [B, T - shift, V] positions that have a label
        ce = F.cross_entropy(pred.reshape(-1, pred.shape[-1]).float(), labels[:, shift:].reshape(-1))
        total = total + weights[k] * ce
        per_head.append(ce.item())
    return total, per_head


def medusa_objective(heads: nn.Module, hidden: Tensor, labels: Tensor) -> Callable:
    """`fit`'s loss_fn for Medusa heads on cached hidden states [N, T, H] and labels [N, T] (token ids): each
    step's windows idx -> (head_loss, per-head CE), scored over the heads' draft vocabulary where they have one."""
    device = heads.heads[0].linear.weight.device  # the cached states wait in host memory
    if heads.d2t is not None:  # draft indices; -100 (not scored) outside the draft vocabulary
        labels = vocab.to_draft(labels, heads.d2t.cpu(), heads.vocab)

    def loss(idx: Tensor, _) -> tuple[Tensor, list[float]]:  # [b, T, H] -> logits [K, b, T, Vd], scored
        return head_loss(heads(hidden[idx].to(device).float(), draft=True), labels[idx].to(device))
    return loss


def train_heads(heads: nn.Module, hidden: Tensor, labels: Tensor, progress: bool = True, precision: str = "auto",
                **recipe) -> list[tuple]:
    """Train the heads on cached hidden states [N, T, H] and labels [N, T]; returns the log [(step, ce_0, ..)].

    recipe: `Recipe` fields (steps=300, batch=8, lr=1e-3, seed=0, log_every=25 unless given): `fit`, AdamW with a
    short warmup and cosine decay, no gradient clipping. The target is never run here. precision: "auto" runs the
    products in bf16 only where the hardware does bf16 natively, "fp32" gives the same numbers on every machine.
    """
    return fit(heads, medusa_objective(heads, hidden, labels), len(hidden), Recipe(**recipe), progress, precision)


@torch.no_grad()
def head_accuracy(heads: nn.Module, hidden: Tensor, labels: Tensor, ks: Sequence[int] = (1, 5),
                  batch: int = 8) -> dict[int, list[float]]:
    """{k: [top-k accuracy of head 0, head 1, ...]} on cached hidden states [N, T, H] and labels [N, T]."""
    hits = {k: [0] * heads.num_heads for k in ks}
    counts = [0] * heads.num_heads
    for i in range(0, len(hidden), batch):
        device = heads.heads[0].linear.weight.device
        logits = heads(hidden[i: i + batch].to(device).float())  # [K, b, T, V]
        y = labels[i: i + batch].to(device)
        top = logits.topk(max(ks), -1).indices  # [K, b, T, kmax]
        for h in range(heads.num_heads):
            shift = h + 2
            want = y[:, shift:, None]  # [b, T - shift, 1]
            got = top[h, :, :-shift]  # [b, T - shift, kmax]
            counts[h] += (want >= 0).sum().item()  # a label of -100 is not scored
            for k in ks:
                hits[k][h] += (got[..., :k] == want).any(-1).sum().item()
    return {k: [hits[k][h] / counts[h] for h in range(heads.num_heads)] for k in ks}


# ---- EAGLE's drafts (chapter 06): features, the training-time test, the loss ------------------------------


def _features(net: nn.Module, states: Tensor) -> Tensor:
    """Cached states [B, T, S, H] (from cache_states with net.layers) -> true features [B, T, H]."""
    states = states.float()
    picked = [states[:, :, -1]] if net.version == 1 else [states[:, :, s] for s in range(len(net.layers))]
    return net.combine(picked)  # [B, T, H]


def ttt_mask(T: int, step: int) -> Tensor:
    """Training-time test, step i: bool [T, (i + 1) T], which keys position p sees among steps 0..i.

    Step 0 is the ordinary causal pass over true features. At step i the input at position p stands for a
    node drafted i levels deep from the committed prefix 0 .. p - i: it sees step 0 (true features) at
    positions <= p - i, and step j (1 <= j <= i) only at position p - i + j, its own drafted ancestors
    (j = i is itself).
    """
    p = torch.arange(T)[:, None]  # [T, 1] query positions
    q = torch.arange(T)[None, :]  # [1, T] key positions
    blocks = [q <= p - step] + [q == p - step + j for j in range(1, step + 1)]
    return torch.cat(blocks, 1)  # [T, (i + 1) T]; positions p < i (no valid root) see little, scored never


def unroll(net: nn.Module, feature: Tensor, tokens: Tensor, steps: int) -> list[Tensor]:
    """The training-time-test unroll: outputs [B, T, H] of steps 0..steps-1.

    feature [B, T, H]: true features; tokens [B, T]: tokens[:, p] is the token after position p. Step 0
    reads the true features; step i reads, at position p, the previous step's output at p - 1 (the draft's
    own predicted feature, as when drafting). One KV cache holds every step's keys; `ttt_mask` says which
    of them each position may see.
    """
    T = feature.shape[1]
    positions = torch.arange(T)
    cache, outs = lm.new_cache(), []  # the draft's one-layer cache
    for i in range(steps):
        if i and getattr(net, "placeholder", None) is not None:  # a block drafter: placeholder i, not its own outputs
            depth = torch.full((T,), i - 1, dtype=torch.long)  # [T]
            outs.append(net.placeholders(depth, positions, ttt_mask(T, i), cache, batch=feature.shape[0]))
            continue
        if i:  # shift right by one: position p reads the output at p - 1 (position 0 gets a zero feature)
            feature = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], 1)  # [B, T, H]
        outs.append(net(feature, tokens, positions, ttt_mask(T, i), cache))  # [B, T, H]
    return outs


def eagle_loss(net: nn.Module, states: Tensor, x: Tensor, labels: Tensor, steps: int = 1, noise: float = 0.0,
               generator: torch.Generator | None = None) -> tuple[Tensor, list[float]]:
    """The training loss on cached states [B, T, S, H], text x [B, T] and the target's argmax labels [B, T].

    Pair p reads (feature f_p, token x_{p+1}) and is scored on the token after that, labels[:, p + 1]
    (labels[:, t] = the target's own choice for token t+1). Version 1: SmoothL1(o_p, f_{p+1}) + 0.1 CE, with
    Gaussian noise of std `noise` on the input features. Version 3: sum over unrolled steps i of 0.8^i CE,
    positions p >= i only. A block drafter (eagle.BlockNet, version 1) trains as version 1 does, its placeholders'
    CE the unrolled steps'. Returns (loss, per-step CE).
    """
    f = _features(net, states)  # [B, T, H]
    tokens = x[:, 1:]  # [B, T-1] the token after each position
    f_in = f[:, :-1]
    if noise:
        f_in = f_in + noise * torch.randn(f_in.shape, generator=generator).to(f_in.device)
    outs = unroll(net, f_in, tokens, steps)  # steps x [B, T-1, H]
    want = labels[:, 1:]  # [B, T-1] the target's choice for the token after x_{p+1}
    total, per_step = f.new_zeros(()), []
    want = net.to_draft(want)  # draft indices; -100 (not scored) outside a draft vocabulary
    for i, o in enumerate(outs):
        logits = net.draft_logits(o[:, i:])  # [B, T-1-i, Vd]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), want[:, i:].reshape(-1))
        per_step.append(ce.item())
        total = total + 0.8 ** i * ce
    if net.version == 1:
        feat = F.smooth_l1_loss(outs[0].float(), f[:, 1:].detach().float())
        total = feat + 0.1 * total
        per_step.append(feat.item())  # the feature loss last
    return total, per_step


def eagle_objective(net: nn.Module, states: Tensor, x: Tensor, labels: Tensor, recipe: Recipe) -> Callable:
    """`fit`'s loss_fn for an EAGLE draft on cached states [N, T, S, H], text [N, T] and labels [N, T]: each step's
    windows idx -> (eagle_loss with recipe.ttt_steps and recipe.noise, [loss, *per-step CE, feature loss])."""
    device = net.fc.weight.device  # the cached states wait in host memory; each batch moves to the draft

    def loss(idx: Tensor, g: torch.Generator) -> tuple[Tensor, list[float]]:
        total, parts = eagle_loss(net, states[idx].to(device), x[idx].to(device), labels[idx].to(device),
                                  recipe.ttt_steps, recipe.noise, g)
        return total, [total.item(), *parts]
    return loss


def train_eagle_net(net: nn.Module, states: Tensor, x: Tensor, labels: Tensor, progress: bool = True,
                    precision: str = "auto", **recipe) -> list[tuple]:
    """Train the draft on cached states [N, T, S, H], text [N, T] and labels [N, T]; returns the loss log
    [(step, loss, *per-step CE, feature loss for version 1)].

    recipe: `Recipe` fields (steps=400, clip=1.0, ttt_steps=1, noise=0.0, batch=8, lr=1e-3, seed=0 unless given):
    `fit`, AdamW, warmup then cosine decay; the target is never run here. precision: "auto" runs the products in
    bf16 only where the hardware does bf16 natively (`precision.autocast`); "fp32" gives the same numbers on
    every machine.
    """
    recipe = Recipe(**{"steps": 400, "clip": 1.0, **recipe})
    torch.manual_seed(recipe.seed)  # seeds the global generator, as this function always has (the noise uses fit's)
    return fit(net, eagle_objective(net, states, x, labels, recipe), len(states), recipe, progress, precision)


@torch.no_grad()
def eagle_accuracy(net: nn.Module, states: Tensor, x: Tensor, labels: Tensor, depth: int = 3,
                   batch: int = 8) -> list[float]:
    """Top-1 agreement with the target's greedy choice when drafting 1..depth tokens ahead of true features.

    Entry i: the unrolled step i (the draft reading its own features i times) against labels; entry 0 is
    the plain next-next-token accuracy. The same unroll for both versions, so they compare fairly.
    """
    hits, counts = [0] * depth, [0] * depth
    for s in range(0, len(states), batch):
        device = net.fc.weight.device
        st, xx, yy = (t[s: s + batch].to(device) for t in (states, x, labels))
        outs = unroll(net, _features(net, st)[:, :-1], xx[:, 1:], depth)
        for i, o in enumerate(outs):
            pred = net.logits(o[:, i:]).argmax(-1)  # [b, T-1-i]
            hits[i] += (pred == yy[:, 1 + i:]).sum().item()
            counts[i] += (yy[:, 1 + i:] >= 0).sum().item()  # a label of -100 is not scored
    return [h / c for h, c in zip(hits, counts)]


# ---- a draft model distilled from the target (chapter 12's comparison; `draft_models.distilled_draft`) ----------


def _draft_logits(draft, states: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """(the target's logits, the draft's logits) over the draft vocabulary [B, T, Vd] for windows x [B, T]: the
    target's from its cached last states [B, T, S, H] through the same head rows, the draft's from its own forward."""
    head = draft.get_output_embeddings()
    with torch.no_grad():
        p_logits = head.small(states[:, :, -1])  # [B, T, Vd]
    h = draft.model(input_ids=x, use_cache=False).last_hidden_state  # [B, T, H]
    return p_logits, head.small(h)


def draft_objective(draft: nn.Module, states: Tensor, x: Tensor, labels: Tensor) -> Callable:
    """The loss of `fit` for a draft model: the KL divergence from the target's next-token distribution to the
    draft's, both over the draft vocabulary, averaged over the scored positions (labels != -100); the log holds it
    and the draft's top-1 agreement with the target. states [N, T, S, H], windows x [N, T], labels [N, T]."""
    head = draft.get_output_embeddings()
    device = head.d2t.device if head.d2t is not None else next(draft.model.layers.parameters()).device

    def loss(idx: Tensor, g: torch.Generator) -> tuple[Tensor, list[float]]:
        st, xx, yy = (t[idx].to(device) for t in (states, x, labels))
        p_logits, q_logits = _draft_logits(draft, st, xx)
        scored = yy >= 0  # [B, T]
        logp, logq = (F.log_softmax(z[scored].float(), -1) for z in (p_logits, q_logits))  # [n, Vd]
        kl = (logp.exp() * (logp - logq)).sum(-1).mean()
        agree = (logq.argmax(-1) == logp.argmax(-1)).float().mean()
        return kl, [kl.item(), agree.item()]
    return loss


@torch.no_grad()
def draft_accuracy(draft: nn.Module, states: Tensor, x: Tensor, labels: Tensor, depth: int = 3,
                   batch: int = 4) -> list[float]:
    """Top-1 agreement with the target's greedy choice when drafting 1..depth tokens ahead of the true text.

    Entry i: the draft's i-th token of a chain drafted from each position, against the target's choice there; the
    chain reads the draft's own earlier tokens (right or wrong), as drafting does. All positions at once: the same
    unroll as EAGLE's (`ttt_mask`), one cache holding every step's keys. A target choice outside the draft
    vocabulary is a miss. states: unused (the signature of `eagle_accuracy`).
    """
    hits, counts = [0] * depth, [0] * depth
    device = next(draft.model.layers.parameters()).device
    for s in range(0, len(x), batch):
        xx, yy = (t[s: s + batch].to(device) for t in (x, labels))  # [b, T]
        T, cache, tokens = xx.shape[1], lm.new_cache(), xx
        for i in range(depth):  # step i: position p holds the draft's token p, drafted i - 1 levels below p - i
            pred = lm.forward(draft, tokens, cache, positions=torch.arange(T, device=device),
                              mask=ttt_mask(T, i).to(device)).argmax(-1)  # [b, T] the draft's next token at each p
            scored = yy[:, i:] >= 0
            hits[i] += ((pred[:, i:] == yy[:, i:]) & scored).sum().item()
            counts[i] += scored.sum().item()
            tokens = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], 1)  # [b, T]: position p reads it
    return [h / c for h, c in zip(hits, counts)]
