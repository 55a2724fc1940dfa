"""Chat data made on this machine (`specdec_lab.chat`): the prompts heads train on, and the held-out ones."""
from specdec_lab import chat


def test_training_prompts_are_fixed_cover_every_category_and_leave_the_held_out_ones_out():
    prompts = chat.training_prompts()
    assert len(prompts) == chat.TRAINING and prompts == chat.training_prompts()  # the same list on every call
    assert {p["category"] for p in prompts} == set(chat.CATEGORIES)
    assert len({p["id"] for p in chat.training_prompts(None)}) == len(chat.training_prompts(None)) > chat.TRAINING
    held = chat.held_out()
    assert len(held) == 24 and all(len(chat.held_out(c)) == 8 for c in chat.CATEGORIES)
    texts = {p["prompt"] for p in chat.training_prompts(None)}
    assert not any(h["prompt"] in texts for h in held)


def test_a_conversation_is_the_template_around_prompt_and_answer():
    class Tok:  # the one call `conversations` makes of a tokenizer
        def apply_chat_template(self, messages, tokenize=False):
            return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)

    rows = [{"prompt": "Say hi.", "answer": "Hi!"}]
    assert chat.conversations(Tok(), rows) == ["<user>Say hi.</user><assistant>Hi!</assistant>"]
