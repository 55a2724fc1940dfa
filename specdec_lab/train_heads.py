"""`specdec-lab train-heads`: Medusa heads, an EAGLE-1 or an EAGLE-3 draft for ANY causal LM.

The zoo ships heads and drafts for its own target only. This trains them for yours, on this machine, with the
recipe of each method in RECIPES (the same table trains the zoo's own: `specdec-lab train-zoo --stage medusa`):

    specdec-lab train-heads --target HuggingFaceTB/SmolLM2-1.7B --method eagle1 --minutes 5
    drafter = EagleDrafter.from_pretrained(target, folder, dynamic=True)      # folder: printed at the end

1. Text: the course corpus (the Python standard library's modules, on every machine, split 95/5 by file),
   a folder of your own text files (--data), or for a chat model `--data chat`: the target's own answers to
   2,561 prompts made from text on this machine, in its chat template (`chat`; generated once, then kept in the
   user cache; `chat-untemplated`: the greedy answers without the template, plain text; `chat-mixed`: both, for a
   draft that serves chat and plain continuations), tokenized with the target's tokenizer, cut into windows.
2. The frozen target reads every window once; its states wait in host memory (in bf16; their number is capped
   so that they fit in --memory, 2 GB unless told) with its own greedy choices: the labels of self-distillation
   (`training`).
3. Only the new module trains (`training.fit`: a progress bar with ETA, a checkpoint every minute that a rerun
   resumes from, and a step count sized to --minutes from a timed step).
4. The weights (safetensors) and a config.json that records the recipe, the target's name, architecture, sizes and
   an LM-head probe (`weights.fingerprint`) go to the output folder, by default under the user's cache, never
   inside the installed package. `from_pretrained` refuses them for any other target, saying what to do.

Medusa is trained as published (Cai et al. 2024, Medusa-1): every head has its own residual block and its own
LM head, initialised from the target's (--lm-head shared keeps one frozen copy, for vocabularies too large to
copy four times). EAGLE drafts get one decoder layer shaped like the target's (its attention heads and MLP width),
as the reference implementation does.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specdec_lab import checks, draft_models, eagle, medusa, training, tune, vocab, weights
from specdec_lab.precision import autocast
from specdec_lab.training import Recipe

__all__ = ["METHODS", "RECIPES", "default_folder", "find", "missing", "trained_for", "text_windows", "train"]

# One recipe per method, for train-heads and for the zoo (`train_zoo.train_method`, which draws its own windows and
# gives its drafts a narrower MLP). `windows` and `steps` are upper bounds that the memory cap and --minutes may lower.
RECIPES = {
    "medusa": Recipe(steps=1200, lr=1e-3, heads=4, windows=1200, draft_vocab=8192),
    "eagle1": Recipe(steps=1200, lr=3e-3, clip=1.0, version=1, noise=0.1, draft_vocab=8192),
    "eagle3": Recipe(steps=1200, lr=3e-3, clip=1.0, version=3, ttt_steps=3, draft_vocab=8192),
    "block": Recipe(steps=1200, lr=3e-3, clip=1.0, version=1, noise=0.1, ttt_steps=4, block=True, draft_vocab=8192),
    "draft": Recipe(steps=3000, lr=3e-4, clip=1.0, draft_layers=6, windows=3000, draft_vocab=8192),
}
METHODS = tuple(RECIPES)
CHAT_DATA = ("chat", "chat-untemplated", "chat-mixed")  # --data values: chat data from the target's own answers
CACHE_BYTES = 2e9  # the most host memory the cached target states may take, unless told (train's memory_gb)
STATES_BYTES = 4e9  # the most disk the kept states may take (`stored_states` drops the least recently used)
SHIPPED = Path(__file__).parent / "data" / "heads"  # <model name>/<method>: heads shipped for zoo.MODELS


def default_folder(target_name: str, method: str) -> Path:
    """Where train-heads writes unless told: <user cache>/specdec-lab/heads/<target>/<method>, <target> the Hub
    id or the absolute path of the target's folder, with "--" for "/"."""
    from specdec_lab.zoo import MODELS, model_folder, user_cache

    name = str(Path(target_name).resolve()) if Path(target_name).is_dir() else str(target_name)
    name = next((m for m in MODELS if str(model_folder(m).resolve()) == name), name)  # load_model's: its name
    return user_cache() / "heads" / name.strip("/").replace("/", "--") / method


def missing(target, method: str) -> str:
    """Why a showdown leaves `method` out for `target`, and the command that would put it in."""
    return (f"no {method} heads for this target: `specdec-lab train-heads --target {target.config.name_or_path} "
            f"--method {method}` trains them (notebooks 05, 06)")


def find(target) -> dict[str, Path]:
    """{method: folder} of the heads and drafts there are for `target`: the zoo's, shipped in the package (for
    the zoo target), or those `specdec-lab train-heads` wrote to its default folder. Each is checked against
    the target (`weights.read_config`); a method with none is left out."""
    from specdec_lab.zoo import EMBEDDED

    found = {}
    for method in METHODS:
        mine = default_folder(target.config.name_or_path, method)
        for folder in (EMBEDDED["tiny"] / method, SHIPPED / mine.parent.name / method, mine):
            try:
                weights.read_config(folder, target, method)
            except (FileNotFoundError, ValueError):
                continue
            found[method] = folder
            break
    return found


def corpus_files() -> tuple[list[Path], list[Path]]:
    """The course corpus: the standard library's .py files (no tests), split by a hash of the path, ~5% validation."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
    train, val = [], []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if skip & set(rel.parts) or rel.name.startswith("test_"):
            continue
        bucket = int(hashlib.sha1(str(rel).encode()).hexdigest(), 16) % 20
        (val if bucket == 0 else train).append(p)
    return train, val


def read_texts(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def token_stream(texts: list[str], tokenizer) -> torch.Tensor:
    """All texts concatenated, each followed by EOS (when the tokenizer has one): [N] int64."""
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]  # a tokenizer may have no EOS
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]:
        ids.extend(enc + eos)
    return torch.tensor(ids, dtype=torch.long)


def _split(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """Files to training and validation by a hash of the name: about 1 in 20 validates (at least one)."""
    val = [f for f in files if int(hashlib.sha1(f.name.encode()).hexdigest(), 16) % 20 == 0] or files[-1:]
    train = [f for f in files if f not in val] or val
    return train, val


def trained_for(target, tok, method: str, minutes: float = 5.0, **kwargs) -> Path:
    """The folder of `method`'s heads for `target`: found (`find`), else trained now into the default folder
    within `minutes` (`train`; kwargs go to it), so that a notebook runs on any pair with one changed line."""
    folder = find(target).get(method)
    if folder is None:
        folder = default_folder(target.config.name_or_path, method)
        print(f"no {method} heads for this target yet: training them ({minutes:g} min budget) into {folder}")
        train(target, tok, method, folder, minutes=minutes, **kwargs)
    return folder


def text_windows(tok, data: Path | str | list[str] | None, n: int, seq_len: int, seed: int = 0,
                 val_windows: int = 32, answers: bool = False) -> tuple[torch.Tensor, ...]:
    """(training windows [n, T], validation windows [m, T]) of the target's tokens, T = seq_len; answers=True (a
    list of `chat.conversations`) adds which positions to score in each, [n, T] and [m, T] bool: those whose next
    token is the assistant's (`chat.answer_mask`).

    data: None for the course corpus (the standard library's modules), a folder whose text files (read
    recursively; binary files skipped) are the corpus, or a list of texts (`chat_texts`; 1 in 20 validates).
    The training windows tile the text without overlap, in random order, so n of them read n * T different
    tokens; past the text's own count, the rest start anywhere.
    """
    if isinstance(data, list):
        texts = [data[i::20] for i in range(20)]
        train_texts, val_texts = [t for part in texts[:7] + texts[8:] for t in part], texts[7]
    elif data is None:
        train_texts, val_texts = map(read_texts, corpus_files())
    else:
        folder = Path(data)
        if not folder.is_dir():
            raise FileNotFoundError(f"--data {data}: not a folder. Give a folder of text files, or leave --data "
                                    "out to train on the course corpus")
        files = sorted(f for f in folder.rglob("*") if f.is_file() and b"\0" not in f.read_bytes()[:1024])
        if not files:
            raise FileNotFoundError(f"--data {data}: no text files in it")
        train_texts, val_texts = map(read_texts, _split(files))
    streams = [token_stream(texts, tok) for texts in (train_texts, val_texts)]
    if len(streams[0]) <= seq_len or len(streams[1]) < seq_len:
        raise ValueError(f"the text is too short: {len(streams[0])} training and {len(streams[1])} validation "
                         f"tokens, and a window is {seq_len}. Add text to --data")
    g = torch.Generator().manual_seed(seed)
    tiles = (len(streams[0]) - 1) // seq_len  # non-overlapping windows the text holds, after a random offset
    offset = int(torch.randint(0, len(streams[0]) - tiles * seq_len, (1,), generator=g))
    starts = (offset + seq_len * torch.randperm(tiles, generator=g)[:n]).tolist()  # every token at most once
    if n > tiles:  # more windows than the text holds: the rest start anywhere
        starts += torch.randint(0, len(streams[0]) - seq_len, (n - tiles,), generator=g).tolist()
    train = torch.stack([streams[0][s: s + seq_len] for s in starts])  # [n, T]
    k = min(val_windows, len(streams[1]) // seq_len)
    val = streams[1][: k * seq_len].view(k, seq_len)  # [k, T] non-overlapping
    if not answers:
        return train, val
    from specdec_lab.chat import answer_mask

    nxt = [torch.cat([answer_mask(tok, ids)[1:], torch.zeros(1, dtype=torch.bool)]) for ids in streams]  # [L]
    return train, val, torch.stack([nxt[0][s: s + seq_len] for s in starts]), nxt[1][: k * seq_len].view(k, seq_len)


def chat_texts(target, tok, kind: str = "chat", progress: bool = True, answers: int = 2) -> list[str]:
    """The target's own greedy answers to `chat.training_prompts()`, rendered in its chat template ("chat") or as
    the bare prompt and answer ("chat-untemplated"); in the template, each prompt's text also holds `answers` - 1
    more conversations, their answers sampled at `chat.TEMPERATURE` (more text of the kind the target writes; a
    prompt's conversations stay in one text, so a prompt validates or trains, never both). The package ships
    the greedy and one sampled answer for SmolLM2-135M-Instruct's GGUF weights (`chat.shipped_answers`); other
    weights, and further samples, are generated once into the user cache (a rerun resumes)."""
    from specdec_lab import chat
    from specdec_lab.zoo import user_cache

    if getattr(tok, "chat_template", None) is None:
        raise ValueError(f"--data {kind}: this tokenizer has no chat template, so the target is not a chat model; "
                         "give a folder of text with --data, or leave --data out for the course corpus")
    if answers < 1:
        raise ValueError(f"answers={answers}: give 1 (the greedy answers) or more (and samples)")
    name = default_folder(target.config.name_or_path, "x").parent.name
    file = user_cache() / "data" / name / "chat_answers.jsonl"
    if chat.shipped_answers(target, name, file) and progress:
        print(f"the target's answers: the ones shipped for these weights, copied to {file}")
    rows = [chat.self_answers(target, tok, chat.training_prompts(), file, progress=progress)]
    if kind != "chat":
        return [f"{a['prompt']}\n\n{a['answer']}" for a in rows[0]]
    for draw in range(1, answers):
        file = file.with_name(f"chat_answers_sampled{draw if draw > 1 else ''}.jsonl")
        if draw == 1 and chat.shipped_answers(target, name, file, sampled=True) and progress:
            print(f"the target's sampled answers: the ones shipped for these weights, copied to {file}")
        rows.append(chat.self_answers(target, tok, chat.training_prompts(), file, progress=progress,
                                      temperature=chat.TEMPERATURE, draw=draw))  # in the same order as rows[0]
    return ["".join(chat.conversations(tok, same)) for same in zip(*rows)]


def stored_states(target, windows: torch.Tensor, layers=(), progress: bool = True, keep: float | None = None):
    """training.cache_states(target, windows, layers), kept on disk in the user cache, so that training the next
    method on the same windows skips the target's forwards: a file made for a superset of `layers` serves too. The
    key is the target's fingerprint (its config and an LM-head probe, not its path) and the windows' tokens. The
    folder is kept under `keep` bytes (default STATES_BYTES): a new file pushes out the files least recently used."""
    from specdec_lab.zoo import user_cache

    folder = user_cache() / "states"
    who = json.dumps(weights.fingerprint(target), sort_keys=True).encode()  # other weights at the same path differ
    key = hashlib.sha1(who + windows.numpy().tobytes()).hexdigest()[:16]
    for file in sorted(folder.glob(f"{key}-*.pt")):
        saved = torch.load(file)
        if set(layers) <= set(saved["layers"]):
            pick = [saved["layers"].index(j) for j in layers] + [-1]  # the last state is always at -1
            file.touch()  # recently used
            return saved["states"][:, :, pick], saved["best"]
    states, best = training.cache_states(target, windows.to(target.device), layers)
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{key}-{'-'.join(map(str, layers)) or 'last'}.pt"
    torch.save({"layers": list(layers), "states": states, "best": best}, file.with_suffix(".tmp"))
    file.with_suffix(".tmp").rename(file)
    kept = sorted(folder.glob("*.pt"), key=lambda f: f.stat().st_mtime, reverse=True)  # newest first
    total = 0
    for old in kept:
        total += old.stat().st_size
        if total > (STATES_BYTES if keep is None else keep) and old != file:
            old.unlink()
    if progress:
        print(f"kept the target's states in {file} ({file.stat().st_size / 1e6:.0f} MB)")
    return states, best


def _module(target, recipe: Recipe, lm_head: str):
    """A fresh Medusa head set, EAGLE net or draft model for `target`, in fp32 on its device (trained in fp32
    weights; a draft model's shared embedding and head stay the target's)."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    if recipe.draft_layers:
        draft = draft_models.distilled_draft(target, recipe.draft_layers)
        draft_models.trained_part(draft).to(device=target.device, dtype=torch.float32)
        return draft
    if recipe.version is None:
        module = medusa.MedusaHeads.for_target(target, recipe.heads, shared_lm_head=lm_head == "shared")
    else:  # one decoder layer shaped like the target's (GPT-2: n_inner None = 4H), unless the recipe says
        mlp = recipe.mlp or getattr(config, "intermediate_size", None) or 4 * config.hidden_size
        heads = recipe.heads or config.num_attention_heads
        module = (eagle.BlockNet(target, heads, mlp, depths=recipe.ttt_steps - 1) if recipe.block
                  else eagle.EagleNet(target, recipe.version, heads, mlp))
    return module.to(device=target.device, dtype=torch.float32)


def _start_from(module, target, method: str) -> None:
    """Load this target's trained `method` draft (train-heads' or shipped) into `module`: every weight they share;
    what only `module` has (a block drafter's placeholders) keeps its fresh start."""
    folder = find(target).get(method)
    if folder is None:
        raise checks.ArgumentError(f"init={method!r}: {missing(target, method)}, then train this one")
    trained = eagle.EagleNet.from_pretrained(target, folder).state_dict()
    trained.pop("d2t", None)  # the draft vocabulary is chosen again from this run's text
    mine = module.state_dict()
    wrong = [f"{k} {list(v.shape)} (here {list(mine[k].shape) if k in mine else 'absent'})"
             for k, v in trained.items() if k not in mine or mine[k].shape != v.shape]
    if wrong or set(mine) - set(trained) - {"placeholder", "d2t"}:
        raise checks.ArgumentError(f"init={method!r}: the {method} draft in {folder} does not fit this one: "
                                   f"{', '.join(wrong) or sorted(set(mine) - set(trained))}; give both the same shape")
    module.load_state_dict(trained, strict=False)


def shared_windows(tok, texts: dict, n: int, seq_len: int, seed: int = 0) -> list[tuple]:
    """[(train [n_k, T], val [m_k, T], scored [n_k, T] or None, v_scored)] for each text of {kind: text}
    (`text_windows`' data), the n windows shared in proportion to their tokens; kind "chat" (conversations in the
    template) scores the positions whose next token is the assistant's, any other kind every position (None)."""
    sizes = [1] if len(texts) == 1 else [len(token_stream(text, tok)) for text in texts.values()]
    parts = []
    for (kind, text), size in zip(texts.items(), sizes):
        x, val, *scored = text_windows(tok, text, max(1, round(n * size / sum(sizes))), seq_len, seed,
                                       answers=kind == "chat")
        parts.append((x, val, *(scored or [None, None])))
    return parts


def _cached(target, tok, data, recipe: Recipe, layers, progress: bool, keep: float,
            answers: int = 2) -> tuple[tuple, tuple]:
    """((x, states, labels), (val, v_states, v_labels)) for training and validation: the windows of `data` [N, T],
    the target's states over them [N, T, S, H] (`stored_states`) and its own choices, labels[:, t] for token t + 1
    [N, T]; in the chat template, -100 (not scored) wherever the next token is not the assistant's. "chat-mixed"
    joins the windows of "chat" (answers scored) and of "chat-untemplated" (every position scored: plain text has
    no turns), recipe.windows shared between them in proportion to their tokens."""
    if isinstance(data, tuple):  # windows already cut
        parts = [(*data, None, None)]
    else:
        kinds = ("chat", "chat-untemplated") if data == "chat-mixed" else (data,)
        texts = {kind: chat_texts(target, tok, kind, progress, answers) if kind in CHAT_DATA else kind
                 for kind in kinds}
        parts = shared_windows(tok, texts, recipe.windows, recipe.seq_len, recipe.seed)
    out = []
    for x, val, scored, v_scored in parts:
        (states, labels), (v_states, v_labels) = (stored_states(target, w, layers, progress, keep) for w in (x, val))
        if scored is not None:  # in the chat template: score only the positions whose next token is the assistant's
            labels, v_labels = labels.masked_fill(~scored, -100), v_labels.masked_fill(~v_scored, -100)
            if progress:
                print(f"scoring the answers only in the template's {len(x):,} windows, {scored.float().mean():.0%} "
                      "of their positions")
        out.append((x, states, labels, val, v_states, v_labels))
    x, states, labels, val, v_states, v_labels = (torch.cat(t) if len(out) > 1 else t[0] for t in zip(*out))
    return (x, states, labels), (val, v_states, v_labels)


def train(target, tok, method: str, out: Path | str, minutes: float | None = None, data=None, lm_head: str = "own",
          progress: bool = True, memory_gb: float | None = None, answers: int = 2, **changes) -> dict:
    """Train `method` ("medusa", "eagle1", "eagle3", "draft") for the frozen `target` by RECIPES[method], save it to
    `out`; its card (dict).

    minutes: the whole run's budget (caching included): the step count is sized from a timed step, and training
    stops at the deadline in any case (its checkpoint kept, so a rerun goes on). data: None (the course corpus),
    a folder of text files, "chat", "chat-untemplated" or "chat-mixed" (`text_windows`, `chat_texts`,
    `shared_windows`), or windows already cut, (training [N, T], validation [M, T]) token ids (the zoo's).
    changes: `Recipe` fields to replace (None: kept), such as steps, windows, seq_len (tests use a few) or mlp.
    lm_head: Medusa's, "own" (published) or "shared" (the target's, frozen). answers: with chat data, the
    conversations per prompt in the template (`chat_texts`: the greedy answer and answers - 1 sampled).
    memory_gb: the most host memory the target's cached states may take (default CACHE_BYTES, 2 GB: EAGLE-3's
    four states per token fit about 1,700 windows of SmolLM2-135M).
    """
    if method not in RECIPES:
        raise ValueError(f"method {method!r}: use one of {', '.join(METHODS)}")
    if lm_head not in ("own", "shared"):
        raise ValueError(f"lm_head {lm_head!r}: use 'own' (each head its own copy, as published) or 'shared'")
    t0 = time.monotonic()
    deadline = None if minutes is None else t0 + 60 * minutes
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    recipe = replace(RECIPES[method], **{k: v for k, v in changes.items() if v is not None})
    if recipe.draft_layers:  # a draft model takes at most half the target's layers
        half = target.config.get_text_config().num_hidden_layers // 2
        if changes.get("draft_layers") and changes["draft_layers"] > max(1, half):
            raise ValueError(f"a draft model of {changes['draft_layers']} layers costs more than half a target step: "
                             f"this target has {2 * half} layers, give at most {max(1, half)}")
        recipe = replace(recipe, draft_layers=max(1, min(recipe.draft_layers, half)))
    torch.manual_seed(recipe.seed)  # the new module's initial weights: the same run gives the same heads
    module = _module(target, recipe, lm_head)
    if recipe.init:
        _start_from(module, target, recipe.init)
    layers = getattr(module, "layers", ())  # EAGLE-3's fused layers; () for the last state only
    H = target.config.get_text_config().hidden_size
    memory = CACHE_BYTES if memory_gb is None else 1e9 * memory_gb
    cap = int(memory // (recipe.seq_len * (len(layers) + 1) * H * 2))  # windows whose bf16 states fit
    if progress and recipe.windows > cap:
        print(f"{method}: {cap:,} of {recipe.windows:,} windows fit the states' memory of {memory / 1e9:g} GB "
              "(--memory raises it)")
    recipe = replace(recipe, windows=max(1, min(recipe.windows, cap)))
    keep = max(STATES_BYTES, 2 * memory)  # the disk kept for states: this run's file and another
    (x, states, labels), (val, v_states, v_labels) = _cached(target, tok, data, recipe, layers, progress, keep,
                                                             answers)
    if progress:
        print(f"{method}: cached the target's states over {x.numel():,} tokens in {time.monotonic() - t0:.0f} s")
    V, Vd = target.config.get_text_config().vocab_size, recipe.draft_vocab
    scorer = module.lm_head if recipe.draft_layers else module  # what holds the draft vocabulary
    if Vd and V > 2 * Vd and (recipe.version or recipe.draft_layers or lm_head == "shared"):  # score Vd of V
        always = [tok.eos_token_id] if tok.eos_token_id else []  # EOS in the draft vocabulary, however rare
        scorer.use_vocab(vocab.frequent_tokens(labels[labels >= 0], Vd, always=always))
        covered = torch.isin(v_labels[v_labels >= 0], scorer.d2t.cpu()).float().mean().item()
        if progress:
            print(f"{method}: draft vocabulary of {Vd:,} of {V:,} tokens; it holds {covered:.1%} of the target's "
                  "choices on the validation text")
    else:
        recipe = replace(recipe, draft_vocab=None)
    if recipe.draft_layers:  # a draft model: the target's next-token distribution, distilled
        loss = training.draft_objective(module, states, x, labels)

        def accuracy():  # {1: [top-1 agreement with the target, 1, 2, 3 tokens deep]}
            return {1: training.draft_accuracy(module, v_states, val, v_labels)}
    elif recipe.version is None:  # Medusa: head k at t scored against the target's choice for token t + k + 2
        loss = training.medusa_objective(module, states[:, :, -1], training.self_labels(x, labels))  # [N, T, H]

        def accuracy():  # {k: [top-k agreement with the target, by head]}, the tuned tree's input
            return training.head_accuracy(module, v_states[:, :, -1], training.self_labels(val, v_labels),
                                          ks=medusa.TOPK)
    else:
        loss = training.eagle_objective(module, states, x, labels, recipe)

        def accuracy():  # {1: [top-1 agreement with the target, 1, 2, 3 tokens deep]}
            return {1: training.eagle_accuracy(module, v_states, val, v_labels)}
    checkpoint = out / "checkpoint.pt"
    if deadline is not None and not checkpoint.exists():  # size the run to the budget from a timed step
        g = torch.Generator().manual_seed(recipe.seed)
        for _ in range(2):  # the second: the first pays for warming up (EAGLE-1 on SmolLM2-135M: 2.4 s against 0.75)
            t1 = time.monotonic()
            with autocast(target.device):
                loss(torch.randint(0, len(x), (recipe.batch,), generator=g), g)[0].backward()
            module.zero_grad(set_to_none=True)
            per_step = time.monotonic() - t1
        recipe = replace(recipe, steps=max(1, min(recipe.steps, int(0.9 * (deadline - time.monotonic()) / per_step))))
        if progress:
            print(f"{method}: {per_step:.2f} s per step, {recipe.steps} steps fit in the budget of {minutes:g} min")
    trained = draft_models.trained_part(module) if recipe.draft_layers else module  # a draft model: not its embedding
    log = training.fit(trained, loss, len(x), recipe, progress, checkpoint=checkpoint, deadline=deadline)
    finished = not checkpoint.exists()
    acc = accuracy()
    card = {**weights.fingerprint(target), "method": method, "config": asdict(recipe), "labels": "self-distilled",
            "log": log, "finished": finished, "seconds": round(time.monotonic() - t0, 1),
            "threads": torch.get_num_threads(), "val_accuracy_vs_target": [round(a, 4) for a in acc[1]],
            "scored": {"chat": "the answers", "chat-mixed": "the answers in the template, all without it"}.get(
                data if isinstance(data, str) else None, "all"),
            "data": "the course corpus (Python standard library)" if data is None or isinstance(data, tuple) else
            str(data)}
    if isinstance(data, str) and data in ("chat", "chat-mixed"):
        card["answers"] = answers  # conversations per prompt in the template
    if recipe.draft_vocab:
        card["draft_vocab_coverage"] = round(covered, 4)
    if recipe.version is None and not recipe.draft_layers:
        card["lm_head"] = "each head its own, initialised from the target's" if lm_head == "own" else \
            "the target's, shared and frozen"
        card.update(tune.medusa_card(acc))  # the tree MedusaDrafter.from_pretrained uses
    if recipe.draft_layers:
        draft_models.trained_part(module).to(target.dtype)
        draft_models.save_distilled(module, out, card)
    else:
        module.to(target.dtype).save(out, meta=card)
    if progress:
        state = "done" if finished else "stopped at the time budget (rerun the same command to go on)"
        print(f"{method}: {state}; validation top-1 agreement with the target by offset "
              f"{card['val_accuracy_vs_target']}; saved to {out}")
    return card
