"""Train the embedded model zoo: a byte-level BPE tokenizer, a target and a draft model.

On a 2-core CPU with one training thread the tokenizer, target and draft take under 90 minutes (the card
records 88 min, on a machine shared with other jobs), the Medusa heads about 5 more and the two EAGLE drafts
about 13 more:

    specdec-lab train-zoo                 # tokenizer, target, distilled draft, Medusa, EAGLE, model card
    specdec-lab train-zoo --stage models  # only the tokenizer, target and draft
    specdec-lab train-zoo --stage medusa  # only the Medusa heads (minutes)
    specdec-lab train-zoo --stage eagle   # only the EAGLE-1 and EAGLE-3 drafts
    specdec-lab train-zoo --measure-only  # print the card's figures, measured from the weights (below)

Everything goes to a work folder (--work DIR; by default ~/.cache/specdec-lab/zoo, or $XDG_CACHE_HOME/
specdec-lab/zoo): training checkpoints at its top, the finished zoo in <work>/tiny, laid out like the shipped
one, so these load it:

    target, draft, tok = zoo.load_pair("<work>/tiny")
    heads = MedusaHeads.from_zoo(target, "<work>/tiny/medusa")
    net = EagleNet.from_zoo(target, 1, root="<work>/tiny")      # then EagleDrafter(net, dynamic=True)

--stage medusa, --stage eagle and --measure-only use the pair in <work>/tiny when there is one, else the
shipped pair. The shipped zoo inside the package changes only with --install, which first copies the files
it will replace to <work>/backup-<date>-<time>/. --measure-only writes the model card only where asked:
into --card DIR, or into the shipped zoo with --install.

The corpus is the Python standard library of the running interpreter (tests excluded), split by
file into train and validation. Training is resumable: interrupt it and run the command again.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_lab.precision import autocast
from specdec_lab.train_heads import corpus_files, read_texts, token_stream  # the course corpus
from specdec_lab.training import lr_at, optimizer_step

SEQ_LEN = 384
VOCAB_SIZE = 4096
EOS = "<|endoftext|>"
ZOO_DIR = Path(__file__).parent / "data" / "zoo" / "tiny"  # the shipped zoo: written only with --install


@dataclass
class ModelSpec:
    hidden: int
    layers: int
    heads: int
    mlp: int
    tokens: int  # training tokens
    lr: float
    batch: int  # sequences of SEQ_LEN per step


TARGET = ModelSpec(hidden=256, layers=8, heads=4, mlp=768, tokens=9_000_000, lr=2e-3, batch=16)
# The draft has the target's width so it can start from the target's own weights (see init_from_teacher).
DRAFT = ModelSpec(hidden=256, layers=2, heads=4, mlp=768, tokens=6_000_000, lr=2e-3, batch=16)
# Weights ship in bfloat16 (they were trained under bf16 autocast): half the bytes, which keeps the whole zoo
# (models, Medusa heads, EAGLE drafts) under 40 MB. load_pair() upcasts them to float32 for exact comparisons.
SHIP_DTYPE = {"target": torch.bfloat16, "draft": torch.bfloat16}


# -------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str], out_dir: Path):
    """Byte-level BPE over the training texts, saved so AutoTokenizer loads it offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=None,
                                   pad_token=EOS, model_max_length=1024)
    save_tokenizer(fast, out_dir)
    return fast


def save_tokenizer(tok, out_dir: Path) -> None:
    """save_pretrained, with a tokenizer_config.json that every supported transformers version reads: 5.x writes
    its own class name, TokenizersBackend, which 4.x cannot load; PreTrainedTokenizerFast loads in both."""
    tok.save_pretrained(out_dir)
    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("backend", "is_local", "local_files_only"):  # 5.x bookkeeping, meaningless to 4.x
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def val_windows(val_ids: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of SEQ_LEN from the validation stream: [n, SEQ_LEN]."""
    k = len(val_ids) // SEQ_LEN
    w = val_ids[: k * SEQ_LEN].view(k, SEQ_LEN)
    return w if n is None else w[:n]


# ----------------------------------------------------------------------------- models
def make_model(spec: ModelSpec, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                      num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
                      intermediate_size=spec.mlp, max_position_embeddings=1024, rope_theta=10000.0,
                      tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(cfg)


def init_from_teacher(student, teacher) -> None:
    """Start the draft as the target with its middle layers cut out: the same embedding (tied to the LM
    head), final norm, first layer and last layer. Distillation then only has to repair the gap, and the
    draft's output space already matches the target's, which is what agreement measures."""
    keep = [0, teacher.config.num_hidden_layers - 1][: student.config.num_hidden_layers]
    student.model.embed_tokens.load_state_dict(teacher.model.embed_tokens.state_dict())
    student.model.norm.load_state_dict(teacher.model.norm.state_dict())
    for i, j in enumerate(keep):
        student.model.layers[i].load_state_dict(teacher.model.layers[j].state_dict())


def batch_at(step: int, train_ids: torch.Tensor, batch: int, seed: int) -> torch.Tensor:
    """The training batch of a given step, a pure function of (seed, step) so resuming is exact."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(train_ids) - SEQ_LEN - 1, (batch,), generator=g)
    return torch.stack([train_ids[s: s + SEQ_LEN] for s in starts.tolist()])  # [B, T]


@torch.no_grad()
def val_loss(model, windows: torch.Tensor, batch: int = 16) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        x = windows[i: i + batch]
        logits = model(input_ids=x).logits[:, :-1].float()  # [B, T-1, V]
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                                 reduction="sum").item()
        count += x[:, 1:].numel()
    return total / count


def train(name: str, spec: ModelSpec, tokenizer, train_ids, val_w, work: Path, teacher=None,
          seed: int = 0, precision: str = "auto"):
    """Train one model with AdamW and a cosine schedule; resumes from work/<name>.pt.

    It shares the schedule (`training.lr_at`: 100 warmup steps, then a cosine down to a tenth) and the update
    (`training.optimizer_step`) with the heads and drafts, but not their loop, `training.fit`: that one draws
    random examples from cached states and runs to the end in one go, while this one reads each step's batch
    straight from the token stream as a pure function of (seed, step), runs a teacher in the step, and
    checkpoints its model, optimizer and log every 100 steps so an interrupted run resumes exactly.

    With a teacher, the loss is 0.9 KL(teacher || student) + 0.1 cross-entropy: the draft learns the
    target's whole next-token distribution, which is what raises agreement. Matrix products run in
    bfloat16 under autocast where the CPU does bf16 natively (about twice as fast with AVX512-BF16 or AMX;
    `precision.autocast`), else in float32; weights, optimizer state and the loss stay in float32.
    """
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    model = make_model(spec, tokenizer)
    if teacher is not None and teacher.config.hidden_size == spec.hidden:
        init_from_teacher(model, teacher)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    steps = spec.tokens // (spec.batch * SEQ_LEN)
    ckpt = work / f"{name}.pt"
    state = {"step": 0, "seconds": 0.0, "log": []}
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        print(f"[{name}] resuming at step {state['step']}/{steps}")
    bar = tqdm(total=steps, initial=state["step"], desc=f"train {name}", unit="step", mininterval=5)
    t0 = time.time() - state["seconds"]
    while state["step"] < steps:
        model.train()
        step = state["step"]
        x = batch_at(step, train_ids, spec.batch, seed)  # [B, T]
        with autocast(x.device, precision):
            logits = model(input_ids=x).logits[:, :-1].float()  # [B, T-1, V]
            if teacher is not None:
                with torch.no_grad():
                    t_logp = F.log_softmax(teacher(input_ids=x).logits[:, :-1].float(), -1)  # [B, T-1, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        if teacher is not None:
            kl = F.kl_div(F.log_softmax(logits, -1), t_logp, log_target=True, reduction="none").sum(-1).mean()
            loss = 0.1 * loss + 0.9 * kl
        optimizer_step(opt, loss, lr_at(step, steps, spec.lr, warmup=100, floor=0.1, after_warmup=True), clip=1.0)
        state["step"] += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if state["step"] % 100 == 0 or state["step"] == steps:
            state["seconds"] = time.time() - t0
            vl = val_loss(model, val_w[:32])
            state["log"].append((state["step"], round(loss.item(), 4), round(vl, 4)))
            bar.write(f"[{name}] step {state['step']}/{steps} train {loss.item():.3f} val {vl:.3f} "
                      f"({state['seconds'] / 60:.1f} min)")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, ckpt)
    bar.close()
    model.eval()
    state["tokens"] = steps * spec.batch * SEQ_LEN
    return model, state


# -------------------------------------------------------------------------- measuring
@torch.no_grad()
def agreement(target, draft, windows: torch.Tensor, batch: int = 16) -> float:
    """Fraction of validation positions where the draft's argmax equals the target's."""
    same, total = 0, 0
    for i in range(0, len(windows), batch):
        x = windows[i: i + batch]
        same += (target(input_ids=x).logits.argmax(-1) == draft(input_ids=x).logits.argmax(-1)).sum().item()
        total += x.numel()
    return same / total


# How the card times the decode step: measure.forward_costs, each model in a block of its own ("bench").
C_CALLS, C_ROUNDS, C_CONTEXT = 5, 40, 128
C_PROTOCOL = (f"bench pattern (each model timed in a block of its own, weights warm), 1 thread, context "
              f"{C_CONTEXT}, minimum over {C_ROUNDS} interleaved rounds after a warm-up round; "
              f"range over {C_CALLS} independent calls")


def decode_step_ms(target, draft, context: int = C_CONTEXT, rounds: int = C_ROUNDS, calls: int = C_CALLS) -> dict:
    """The card's decode-step figures: one cached 1-token forward of each model, and c_bench = draft / target.

    `calls` independent calls of measure.forward_costs(pattern="bench"), each the minimum over `rounds` rounds.
    The step times are the minimum over all calls (load only adds time); c is the median of the calls' c and
    c_range their min..max, the spread a reader should expect from one such measurement on this machine.
    """
    from specdec_lab import measure

    runs = [measure.forward_costs({"target": target, "draft": draft}, [1], context=context, rounds=rounds,
                                  pattern="bench", seed=i) for i in range(calls)]
    t_ms = min(r[("target", 1)] for r in runs)
    d_ms = min(r[("draft", 1)] for r in runs)
    cs = [measure.cost_ratios(r)[0] for r in runs]
    return {"target_step_ms": round(t_ms, 3), "draft_step_ms": round(d_ms, 3),
            "c": round(sorted(cs)[len(cs) // 2], 3), "c_range": [round(min(cs), 3), round(max(cs), 3)],
            "c_protocol": C_PROTOCOL}


@torch.no_grad()
def samples(model, tokenizer, prompts: list[str], new_tokens: int = 60) -> list[str]:
    out = []
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt").input_ids
        gen = model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)
        out.append(p + tokenizer.decode(gen[0, ids.shape[1]:]))
    return out


# Prompts end on a code character, not a newline: the tokenizer merges a newline with the next line's
# indentation, so a prompt ending in a bare "\n" would be a token sequence the models never saw.
SAMPLE_PROMPTS = ["def is_palindrome(s):", "class Stack:\n    def __init__(self):",
                  "import os\n\n\ndef list_python_files(root):"]


def measure(zoo_dir: Path = ZOO_DIR, n_val: int = 200) -> dict:
    """Every figure of the model card, measured from the shipped weights."""
    from specdec_lab import zoo

    torch.manual_seed(0)
    target, draft, tok = zoo.load_pair(str(zoo_dir))
    _, val_files = corpus_files()
    val_ids = token_stream(read_texts(val_files), tok)
    w = val_windows(val_ids)
    idx = torch.linspace(0, len(w) - 1, min(n_val, len(w))).long()
    w = w[idx]
    # Latencies with one thread (measure.forward_costs sets it), the setting every notebook and benchmark uses:
    # models this small run fastest on one core, and a second thread stalls whenever anything else wants a core.
    steps = decode_step_ms(target, draft)
    return {
        "val_windows": len(w), "val_tokens": int(w.numel()),
        "target_val_loss": round(val_loss(target, w), 4), "draft_val_loss": round(val_loss(draft, w), 4),
        "target_val_loss_slice8": round(val_loss(target, val_windows(val_ids, 8)), 4),
        "draft_val_loss_slice8": round(val_loss(draft, val_windows(val_ids, 8)), 4),
        "greedy_agreement": round(agreement(target, draft, w), 4),
        "greedy_agreement_slice8": round(agreement(target, draft, val_windows(val_ids, 8)), 4),
        **steps, "threads": 1, "cpu": platform.processor() or platform.machine(),
        "target_samples": samples(target, tok, SAMPLE_PROMPTS),
    }


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def write_card(zoo_dir: Path, figures: dict, training: dict) -> None:
    """The model card: a README.md (for people) and card.json (for tests and notebooks)."""
    card = {"figures": figures, "training": training}
    zoo_dir.mkdir(parents=True, exist_ok=True)
    (zoo_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    f, t = figures, training
    lines = [
        "# The embedded `tiny` zoo: a target and a draft that share a tokenizer",
        "",
        "Two small Llama-architecture causal LMs trained from scratch on the Python standard library",
        f"(Python {t['python']}, tests excluded; {t['train_files']} training files, {t['val_files']} "
        "validation files, split by a hash of the path). Regenerate everything with `specdec-lab train-zoo`",
        "(into a work folder; `--install` replaces the shipped zoo, keeping a backup); re-measure these figures",
        "with `specdec-lab train-zoo --measure-only`.",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| architecture | {t['target']['spec']['layers']} layers, hidden {t['target']['spec']['hidden']}, "
        f"{t['target']['spec']['heads']} heads, MLP {t['target']['spec']['mlp']} | "
        f"{t['draft']['spec']['layers']} layers, hidden {t['draft']['spec']['hidden']}, "
        f"{t['draft']['spec']['heads']} heads, MLP {t['draft']['spec']['mlp']} |",
        f"| parameters | {t['target']['params'] / 1e6:.2f}M | {t['draft']['params'] / 1e6:.2f}M |",
        f"| tokens seen | {t['target']['tokens'] / 1e6:.1f}M | {t['draft']['tokens'] / 1e6:.1f}M "
        "(distilled from the target) |",
        f"| training time (this CPU) | {t['target']['seconds'] / 60:.1f} min | {t['draft']['seconds'] / 60:.1f} min |",
        f"| validation loss (nats/token, {f['val_tokens']:,} tokens) | {f['target_val_loss']:.3f} | "
        f"{f['draft_val_loss']:.3f} |",
        f"| decode step, 1 token at context 128 ({f['threads']} CPU thread{'s' if f['threads'] > 1 else ''}"
        f"{', minimum' if 'c_range' in f else ''}) | "
        f"{f['target_step_ms']:.2f} ms | "
        f"{f['draft_step_ms']:.2f} ms |",
        "",
        f"- Vocabulary: {t['vocab']} byte-level BPE tokens (`{EOS}` ends each file); sequence length {SEQ_LEN}.",
        f"- Training: AdamW, cosine schedule, bfloat16 autocast with float32 weights, {t.get('train_threads', '?')} "
        f"CPU thread(s), {t['wall_minutes']:.0f} minutes of training for the two models (data preparation included). "
        "The draft starts as the target with its middle layers cut out (same width; embedding, final norm, first "
        "and last layer copied) and is distilled: 0.9 KL(target || draft) + 0.1 cross-entropy.",
        "- Weights are stored in bfloat16 (half the bytes); `zoo.load_pair('tiny')` loads them as float32, and all "
        "figures here are measured that way.",
        f"- Greedy next-token agreement of draft with target on validation: **{f['greedy_agreement']:.3f}**.",
        f"- Cost ratio c_bench = draft step / target step on this machine: **{f['c']:.3f}**"
        + (f", within {f['c_range'][0]:.3f} to {f['c_range'][1]:.3f} from call to call. Timed with "
           f"`specdec_lab.measure.forward_costs`: {f['c_protocol']}" if "c_range" in f else "")
        + ". In the decoding loop draft and target take turns, and the draft's step can cost a different share "
        "(c_loop, chapters 02 and 03).",
        "",
        "## Target samples (greedy, 60 new tokens)",
        "",
    ]
    for s in f["target_samples"]:
        lines += ["```python", s, "```", ""]
    (zoo_dir / "README.md").write_text("\n".join(lines))


# ----------------------------------------------------------------------------- Medusa heads, EAGLE drafts
# train-heads' recipes (train_heads.RECIPES) on the zoo's own windows: Medusa-1 as published (Cai et al. 2024), each
# head its own LM head; EAGLE-1 and EAGLE-3 (Li et al. 2024, 2025) on the same windows and steps (the same data budget),
# with an MLP of 512 (the target's is 768). (seed of the training windows, validation windows)
WINDOWS = {"medusa": (3, 64), "eagle1": (5, 48), "eagle3": (5, 48), "block": (5, 48)}


def zoo_windows(tok, n: int, seq_len: int, n_val: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n random training windows of seq_len tokens (drawn with `seed`), [n, T], and the first n_val validation
    windows cut to T, [n_val, T]: the windows the target's states are cached for."""
    train_files, val_files = corpus_files()
    train_ids = token_stream(read_texts(train_files), tok)
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(train_ids) - seq_len, (n,), generator=g).tolist()
    x = torch.stack([train_ids[s: s + seq_len] for s in starts])  # [n, T]
    return x, val_windows(token_stream(read_texts(val_files), tok))[:n_val, :seq_len]


def train_method(out_dir: Path, method: str, zoo_dir: Path = ZOO_DIR, steps: int | None = None) -> dict:
    """`method`'s heads or draft ("medusa", "eagle1", "eagle3") for the frozen target of zoo_dir, self-distilled by
    train-heads' front-end with its recipe (`train_heads.train`), saved to out_dir/<method>. Minutes on a CPU."""
    from specdec_lab import train_heads, zoo

    target, _, tok = zoo.load_pair(str(zoo_dir))
    recipe, (seed, n_val) = train_heads.RECIPES[method], WINDOWS[method]
    data = zoo_windows(tok, recipe.windows, recipe.seq_len, n_val, seed)  # [N, T] training, [n_val, T] validation
    return train_heads.train(target, tok, method, out_dir / method, data=data, steps=steps,
                             mlp=None if method == "medusa" else 512)


def default_work() -> Path:
    """train-zoo's work folder unless --work names one: the user's cache, never the installed package."""
    from specdec_lab.zoo import user_cache

    return user_cache() / "zoo"


# What each stage writes into a zoo folder, so what --install replaces (after a backup).
WRITES = {"models": ["target", "draft", "card.json", "README.md"], "medusa": ["medusa"],
          "eagle": ["eagle1", "eagle3"], "card": ["card.json", "README.md"]}
WRITES["all"] = WRITES["models"] + WRITES["medusa"] + WRITES["eagle"]


def backup(zoo_dir: Path, names: list[str], work: Path) -> Path | None:
    """Copy zoo_dir's entries among `names` to work/backup-<date>-<time>/; that folder, or None if none exist."""
    present = [name for name in names if (zoo_dir / name).exists()]
    if not present:
        return None
    dest = work / f"backup-{time.strftime('%Y%m%d-%H%M%S')}"
    dest.mkdir(parents=True)
    for name in present:
        (shutil.copytree if (zoo_dir / name).is_dir() else shutil.copy2)(zoo_dir / name, dest / name)
    return dest


def main(work: Path | None = None, measure_only: bool = False, train_only: bool = False, threads: int = 1,
         stage: str = "all", install: bool = False, card: Path | None = None) -> None:
    """`specdec-lab train-zoo`: see the module's docstring. card: also write the model card into this folder."""
    work = Path(work) if work else default_work()
    zoo_dir = ZOO_DIR if install else work / "tiny"  # the zoo this run writes
    if install:
        saved = backup(ZOO_DIR, WRITES["card" if measure_only else stage], work)
        print(f"--install: writing into the shipped zoo, {ZOO_DIR}" +
              (f"; the files it replaces are backed up in {saved}" if saved else ""))
    elif not measure_only:
        print(f"writing to {zoo_dir} (the shipped zoo stays as it is; --install would replace it)")
    # The pair that heads train for and that --measure-only measures: this zoo's own, else the shipped one.
    source = zoo_dir if (zoo_dir / "target" / "config.json").exists() else ZOO_DIR
    if stage in ("medusa", "eagle"):
        torch.set_num_threads(threads)
        print(f"{stage}: training for the target in {source}")
        for method in WRITES[stage]:  # the folders a stage writes are named by their methods
            train_method(zoo_dir, method, source)
        return
    if not measure_only:
        # One thread: as fast as two here with bf16, and immune to stalls when other work takes a core.
        default_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        work.mkdir(parents=True, exist_ok=True)
        t_start = time.time()
        train_files, val_files = corpus_files()
        print(f"corpus: {len(train_files)} train files, {len(val_files)} validation files")
        tok_dir = work / "tokenizer"
        if not (tok_dir / "tokenizer.json").exists():
            train_tokenizer(read_texts(train_files), tok_dir)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tok_dir)
        train_ids = token_stream(read_texts(train_files), tok)
        val_w = val_windows(token_stream(read_texts(val_files), tok))
        print(f"tokens: {len(train_ids):,} train, {val_w.numel():,} validation")
        t_prep = time.time() - t_start
        target, t_state = train("target", TARGET, tok, train_ids, val_w, work)
        for p in target.parameters():
            p.requires_grad_(False)
        draft, d_state = train("draft", DRAFT, tok, train_ids, val_w, work, teacher=target, seed=1)
        for name, model in [("target", target), ("draft", draft)]:
            model.to(SHIP_DTYPE[name]).save_pretrained(zoo_dir / name, safe_serialization=True)
            save_tokenizer(tok, zoo_dir / name)
        training = {
            "python": platform.python_version(), "train_files": len(train_files), "val_files": len(val_files),
            "vocab": len(tok), "seq_len": SEQ_LEN,
            # training minutes of both stages, summed over resumed runs, plus this run's data preparation
            "wall_minutes": round((t_prep + t_state["seconds"] + d_state["seconds"]) / 60, 1),
            "train_threads": torch.get_num_threads(),
            "target": {"spec": asdict(TARGET), "params": n_params(target), "tokens": t_state["tokens"],
                       "seconds": round(t_state["seconds"], 1), "log": t_state["log"]},
            "draft": {"spec": asdict(DRAFT), "params": n_params(draft), "tokens": d_state["tokens"],
                      "seconds": round(d_state["seconds"], 1), "log": d_state["log"]},
        }
        (zoo_dir / "card.json").write_text(json.dumps({"figures": None, "training": training}, indent=2) + "\n")
        source = zoo_dir
        if stage == "all":  # the heads of chapter 05 and the drafts of chapter 06, on the target just saved
            for method in WRITES["medusa"] + WRITES["eagle"]:
                train_method(zoo_dir, method, zoo_dir)
        torch.set_num_threads(default_threads)  # latencies are measured with the default thread count
        if train_only:
            return
    print(f"measuring the pair in {source}")
    training = json.loads((source / "card.json").read_text())["training"]
    figures = measure(source)
    print(json.dumps({k: v for k, v in figures.items() if k != "target_samples"}, indent=2))
    folders = [zoo_dir] if install or not measure_only else []  # a training run's card goes beside its models
    folders += [Path(card)] if card else []  # --measure-only writes it only where asked
    for folder in folders:
        write_card(folder, figures, training)
        print(f"wrote the model card (README.md, card.json) to {folder}")
    if not folders:
        print("the card was not written: --card DIR writes it there, --install into the shipped zoo")
