"""Training on the frozen target's states: the one loop behind Medusa's heads and EAGLE's drafts.

Medusa heads (chapter 05) and EAGLE drafts (chapter 06) are small modules trained while the target stays
frozen. The target's part never changes, so it runs once: `cache_states` stores its hidden states (the last
one, plus any chosen layers) and its own greedy choices, the labels of self-distillation. After that a step
reads a few random cached windows and never runs the target. The two methods differ only in what a module
computes from those states and how it is scored, so one loop serves both: `fit` takes the loss as a function
of the sampled windows, and does the rest the same way for both (AdamW, the schedule `lr_at`, optional
gradient clipping, the log). `save` and `load` write and read the weights the zoo ships.

The losses live here too, next to the loop they feed, while medusa.py and eagle.py keep the modules and their
drafters:

    Medusa-1 (chapter 05)   cache_hidden, self_labels, head_loss (head k scored k + 2 ahead), train_heads, head_accuracy
    EAGLE (chapter 06)      ttt_mask, unroll (the training-time test), eagle_loss, train_eagle_net, eagle_accuracy

They use only what the module passed in computes (its forward, `combine`, `to_draft`, `draft_logits`), so this
file imports neither medusa nor eagle, and they import it for `save` and `load`.

The zoo's language models (train_zoo.train) share `lr_at` and `optimizer_step` but keep a loop of their own:
see that function's docstring for why.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from specdec_lab import lm
from specdec_lab.precision import autocast

__all__ = ["cache_states", "lr_at", "optimizer_step", "fit", "save", "architecture", "fingerprint", "read_config",
           "load", "cache_hidden", "self_labels", "head_loss", "train_heads", "head_accuracy", "ttt_mask", "unroll",
           "eagle_loss", "train_eagle_net", "eagle_accuracy"]


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
        n_examples: int, steps: int, batch: int, lr: float, clip: float | None = None, seed: int = 0,
        log_every: int = 25, progress: bool = True, precision: str = "auto", desc: str = "training",
        checkpoint: Path | str | None = None, deadline: float | None = None, save_every: float = 60.0) -> list[tuple]:
    """Train module's trainable parameters for `steps` steps; returns the log [(step, *parts), ...].

    Each step draws `batch` random example indices idx [batch] out of n_examples (from a generator seeded
    with `seed`) and calls loss_fn(idx, generator) -> (loss, parts): the loss to minimise and the numbers
    to log (floats; the generator is there for any noise the loss adds). AdamW without weight decay, the
    learning rate `lr_at(step, steps, lr)`, the gradient norm clipped to `clip` (None: not clipped). The log
    holds step 1 and every `log_every`-th. precision: "auto" runs the products in bf16 only where the
    hardware does bf16 natively (`precision.autocast`), "fp32" gives the same numbers on every machine.

    checkpoint: a file that holds the run so far (weights, optimizer, generator, log, step), written every
    `save_every` seconds and when the run stops; a run that finds it resumes from it (`steps` included) and
    deletes it when done. deadline: a time.monotonic() after which the run stops early, saving the checkpoint.
    """
    g = torch.Generator().manual_seed(seed)
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
    bar = tqdm(range(first, steps), desc=desc, disable=not progress, mininterval=2, initial=first, total=steps)
    saved, done, g_done = time.monotonic(), first, g.get_state()
    try:
        for step in bar:
            if deadline is not None and time.monotonic() > deadline:
                break
            idx = torch.randint(0, n_examples, (batch,), generator=g)  # [batch] which examples this step reads
            with autocast(params[0].device, precision):
                loss, parts = loss_fn(idx, g)
            optimizer_step(opt, loss, lr_at(step, steps, lr), clip)
            if (step + 1) % log_every == 0 or step == 0:
                log.append((step + 1, *[round(v, 4) for v in parts]))
            done, g_done = step + 1, g.get_state()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if checkpoint is not None and time.monotonic() - saved > save_every:
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


# ---- the zoo's files: <name>.safetensors (bfloat16) beside config.json ----------------------------------


def save(module: nn.Module, file: Path | str, config: dict) -> None:
    """module's state dict in `file` (bfloat16: half the bytes) and `config` in config.json beside it."""
    from safetensors.torch import save_file  # here: `import specdec_lab` (and the CLI's --help) need not load it

    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v).contiguous()  # ids stay ints
               for k, v in module.state_dict().items()}, file)
    (file.parent / "config.json").write_text(json.dumps(config, indent=2) + "\n")


# The config fields that decide whether weights trained on a target fit it, read by name (a config's to_dict() differs
# between transformers versions: 5.x moved the rope settings into `rope_parameters` and renamed torch_dtype).
ARCHITECTURE = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "hidden_act", "rms_norm_eps",
                "layer_norm_epsilon", "max_position_embeddings")


def architecture(config) -> dict:
    """The target's architecture as `fingerprint` records it: the ARCHITECTURE fields it has and its rotary
    positions (`lm.rope`), alike under every supported transformers version."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    arch = {k: getattr(config, k) for k in ARCHITECTURE if getattr(config, k, None) is not None}
    if rope := lm.rope(config):
        arch["rope"] = rope
    return json.loads(json.dumps(arch, sort_keys=True, default=str))  # plain JSON values, as read back from a card


def fingerprint(target) -> dict:
    """What identifies the target a module was trained for, recorded in its config.json: a name, its architecture
    (`architecture`: sizes, vocabulary, tying, positions), the hidden and vocabulary sizes, and a probe of 32 LM-head
    weights (the same architecture with other weights: a fine-tune, a random init)."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    w = target.get_output_embeddings().weight  # [V, H]
    rows = torch.linspace(0, w.shape[0] - 1, 8).long().tolist()
    cols = torch.linspace(0, w.shape[1] - 1, 4).long().tolist()
    probe = w.detach()[rows][:, cols].float().flatten().tolist()  # [32]
    name = str(getattr(config, "_name_or_path", "") or config.model_type)
    name = "/".join(Path(name).parts[-2:]) if Path(name).is_dir() else name  # a local folder: its last two parts
    return {"target": name, "architecture": architecture(config), "hidden": config.hidden_size,
            "vocab": config.vocab_size, "probe": [round(x, 6) for x in probe]}


def read_config(file: Path | str, target, what: str, method: str) -> dict:
    """The config.json beside weights `file`, checked against `target`: the hidden and vocabulary sizes, and,
    where it records them (`fingerprint`), the architecture (each field that differs is named) and the LM-head
    probe.

    what: the module, for the messages ("Medusa heads"); method: what `specdec-lab train-heads --method` trains it
    ("medusa", "eagle1", "eagle3").
    """
    file = Path(file)
    train = (f"`specdec-lab train-heads --target <your target> --method {method}` (minutes; for the zoo target "
             f"also `specdec-lab train-zoo --stage {method.rstrip('13')}`)")
    if not file.exists():
        raise FileNotFoundError(f"no {what} in {file.parent}: train them with {train}")
    meta = json.loads((file.parent / "config.json").read_text())
    mine = fingerprint(target)
    H, V = mine["hidden"], mine["vocab"]
    trained_for = f"{what} in {file.parent} were trained for {meta.get('target', 'another target')}"
    if meta["hidden"] != H or meta["vocab"] != V:
        raise ValueError(f"the {what} in {file.parent} were trained for hidden {meta['hidden']} / vocab "
                         f"{meta['vocab']}, not this target's {H} / {V}: use the target they were trained for, "
                         f"or train {what} for yours with {train}")
    theirs, ours = meta.get("architecture"), mine["architecture"]  # none in an older card: sizes and probe decide
    differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k)) if theirs else []
    if differ:
        says = "; ".join(f"{k}: {theirs.get(k)} there, {ours.get(k)} here" for k in differ)
        raise ValueError(f"the {trained_for}, whose architecture is not this target's ({mine['target']}: {says}): "
                         f"train {what} for it with {train}")
    if "probe" in meta and not torch.allclose(torch.tensor(meta["probe"]), torch.tensor(mine["probe"]),
                                              rtol=2e-2, atol=1e-4):
        raise ValueError(f"the {trained_for}, which has this target's architecture but other weights (its LM "
                         f"head differs): train {what} for this target with {train}")
    return meta


def load(module: nn.Module, file: Path | str, target) -> nn.Module:
    """module with the weights `save` wrote to `file` (read as float32), on target's device and dtype, in eval mode."""
    from safetensors.torch import load_file

    module.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in load_file(Path(file)).items()})
    return module.to(device=target.device, dtype=target.dtype).eval()


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


def train_heads(heads: nn.Module, hidden: Tensor, labels: Tensor, steps: int = 300, batch: int = 8,
                lr: float = 1e-3, seed: int = 0, log_every: int = 25, progress: bool = True,
                precision: str = "auto") -> list[tuple]:
    """Train the heads on cached hidden states [N, T, H] and labels [N, T]; returns the log [(step, ce_0, ..)].

    `fit`: AdamW with a short warmup and cosine decay, no gradient clipping. Each step reads
    `batch` random cached windows; the target is never run here. precision: "auto" runs the products in
    bf16 only where the hardware does bf16 natively (see `precision.autocast`), "fp32" gives the same
    numbers on every machine.
    """
    device = heads.heads[0].linear.weight.device  # the cached states wait in host memory

    def loss(idx, _):  # [b, T, H] -> logits [K, b, T, V], scored
        return head_loss(heads(hidden[idx].to(device).float()), labels[idx].to(device))

    return fit(heads, loss, len(hidden), steps, batch, lr, seed=seed, log_every=log_every,
                        progress=progress, precision=precision, desc="medusa heads")


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
    positions p >= i only. Returns (loss, per-step CE).
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


def train_eagle_net(net: nn.Module, states: Tensor, x: Tensor, labels: Tensor, steps: int = 400, batch: int = 8,
                    lr: float = 1e-3, ttt_steps: int = 1, noise: float = 0.0, seed: int = 0, log_every: int = 25,
                    progress: bool = True, precision: str = "auto") -> list[tuple]:
    """Train the draft on cached states [N, T, S, H], text [N, T] and labels [N, T]; returns the loss log
    [(step, loss, *per-step CE, feature loss for version 1)].

    `fit`: AdamW, warmup then cosine decay, the gradient norm clipped to 1; the target is never run
    here. precision: "auto" runs the products in bf16 only where the hardware does bf16 natively
    (`precision.autocast`); "fp32" gives the same numbers on every machine.
    """
    device = net.fc.weight.device  # the cached states wait in host memory; each batch moves to the draft

    def loss(idx, g):
        total, parts = eagle_loss(net, states[idx].to(device), x[idx].to(device), labels[idx].to(device),
                                  ttt_steps, noise, g)
        return total, [total.item(), *parts]

    torch.manual_seed(seed)  # seeds the global generator, as this function always has (the noise uses fit's)
    return fit(net, loss, len(states), steps, batch, lr, clip=1.0, seed=seed, log_every=log_every,
                        progress=progress, precision=precision, desc=f"eagle-{net.version}")


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
