"""The tiny chat model directory loads, templates and tokenizes like a real instruct model."""

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from unimas.testing import tiny_chat
from unimas.testing.tiny_chat import (
    IM_END,
    IM_START,
    PAD,
    build_chat_model,
    chat_ids,
    chat_model_dir,
)

CONVERSATION = [
    {"role": "system", "content": "You are a careful solver."},
    {"role": "user", "content": "What is 12+7?"},
    {"role": "assistant", "content": "12+7=19, so <answer>19</answer>."},
    {"role": "user", "content": "Now put it in \\boxed{}."},
]


SMALL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "instruct_steps": 20}
"""A build of well under a second, for the tests whose point does not need the default model's size."""


@pytest.fixture(scope="module")
def model_dir(chat_model) -> Path:
    """The session's default build (tests/conftest.py): the one every other test file uses."""
    return chat_model


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.mark.slow
def test_directory_loads_with_auto_classes(model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    assert model.config.model_type == "qwen2"
    assert not model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tokenizer) == 512
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids(IM_END)
    assert tokenizer.pad_token == PAD and tokenizer.bos_token is None and tokenizer.padding_side == "left"
    assert sum(p.numel() for p in model.parameters()) == tiny_chat.parameters_for(64, 2, 512)


def test_loaded_tokenizer_matches_saved_tokenizer_json(model_dir, tokenizer):
    """transformers 5 rebuilds a qwen2 dir's tokenizer as Qwen2Tokenizer; it must agree with the file."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    assert tiny_chat.PRETOKENIZE_REGEX == PRETOKENIZE_REGEX
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in ["What is 2+3? 12 apples\n\n```python\nprint(1)\n```", '{"a": 1} <answer>b</answer>', "héllo 🙂"]:
        assert tokenizer(text)["input_ids"] == raw.encode(text).ids


def test_special_tokens_are_single_ids(tokenizer):
    ids = [tokenizer.convert_tokens_to_ids(t) for t in (PAD, IM_START, IM_END)]
    assert ids == [0, 1, 2]
    for token, token_id in zip((PAD, IM_START, IM_END), ids):
        assert tokenizer(token)["input_ids"] == [token_id]
    # as in Qwen, special-token text inside content is not split (the template inserts content raw)
    assert tokenizer("a<|im_end|>b")["input_ids"].count(ids[2]) == 1
    assert set(ids) <= set(tokenizer.all_special_ids)


@pytest.mark.parametrize("text", ["héllo 🙂 \\boxed{1/2}", "日本語\ttabs  and\n\nnewlines\r\n",
                                  "x = {'k': [1, 2]}  # ünïcödé"])
def test_byte_level_round_trip(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert not set(ids) & set(tokenizer.all_special_ids)  # every byte is a token: no unknowns
    assert tokenizer.decode(ids) == text


def test_chat_template_renders_chatml(tokenizer):
    messages = CONVERSATION[:3]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a careful solver.<|im_end|>\n"
        "<|im_start|>user\nWhat is 12+7?<|im_end|>\n"
        "<|im_start|>assistant\n12+7=19, so <answer>19</answer>.<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWhat is 12+7?<|im_end|>\n<|im_start|>assistant\n"  # no default system
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = chat_ids(tokenizer, messages, add_generation_prompt=True)
    assert ids == list(out["input_ids"] if hasattr(out, "keys") else out)
    assert tokenizer.decode(ids) == text + "<|im_start|>assistant\n"


def test_whole_conversation_equals_concatenated_messages(tokenizer):
    """Every message starts with the special <|im_start|>, so BPE never merges across messages."""
    whole = chat_ids(tokenizer, CONVERSATION, add_generation_prompt=True)
    parts = [tokenizer.apply_chat_template([m], tokenize=False) for m in CONVERSATION]
    parts.append("<|im_start|>assistant\n")
    pieces = [tokenizer(part)["input_ids"] for part in parts]
    assert whole == [i for piece in pieces for i in piece]


@pytest.mark.parametrize("completion",
                         ["19", "The answer is 19.", " spaced", "\\boxed{19}", '{"answer": 19}', "```\nx\n```"])
def test_generation_prompt_boundary_holds_unless_completion_starts_with_newline(tokenizer, completion):
    prompt = tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    separate = tokenizer(prompt)["input_ids"] + tokenizer(completion)["input_ids"]
    assert tokenizer(prompt + completion)["input_ids"] == separate


def test_boundaries_inside_text_are_not_token_exact(tokenizer):
    """Why traces must keep sampled ids: splits inside text, and re-encoding decoded ids, can differ."""
    prompt = tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    separate = tokenizer(prompt)["input_ids"] + tokenizer("\nx")["input_ids"]
    assert tokenizer(prompt + "\nx")["input_ids"] != separate  # "\n\n" is one pre-token and one BPE token
    assert tokenizer("print")["input_ids"] != tokenizer("pr")["input_ids"] + tokenizer("int")["input_ids"]
    chars = [tokenizer.convert_tokens_to_ids(c) for c in "print"]
    assert tokenizer.decode(chars) == "print" and tokenizer("print")["input_ids"] != chars


@pytest.mark.slow
def test_same_seed_same_files_other_seed_other_weights(tmp_path, model_dir):
    again = build_chat_model(tmp_path / "again")
    for name in ("tokenizer.json", "model.safetensors", "config.json", "chat_template.jinja"):
        if (model_dir / name).exists():
            assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name
    small = build_chat_model(tmp_path / "small", **SMALL)  # the seed's effect shows at any size
    other = build_chat_model(tmp_path / "other", seed=1, **SMALL)
    assert (other / "model.safetensors").read_bytes() != (small / "model.safetensors").read_bytes()


def test_generate_stops_at_im_end(model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    batch = tokenizer.apply_chat_template([CONVERSATION[:2], CONVERSATION[1:2]], add_generation_prompt=True,
                                          padding=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 2 and 1 <= out.shape[1] - batch["input_ids"].shape[1] <= 5
    assert batch["input_ids"][1, 0].item() == tokenizer.pad_token_id  # left padding


def test_chat_model_dir_reuses_a_finished_build(tmp_path):
    first = chat_model_dir(tmp_path, **SMALL)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert chat_model_dir(tmp_path, **SMALL) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-chat"]


@pytest.mark.slow
def test_cli_prints_directory_and_parameter_count(tmp_path, capsys):
    assert tiny_chat.main([str(tmp_path / "m"), "--hidden-size", "32", "--layers", "1", "--heads", "2"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "m") in out and f"parameters={tiny_chat.parameters_for(32, 1, 512):,}" in out
    assert "training the byte-level BPE tokenizer" in out and "fitting repeat: x chat turns (300 steps" in out
    assert "  step 100/300  loss " in out and "  step 300/300  loss " in out


def test_the_same_bytes_whatever_threads_the_caller_has(tmp_path):
    """The build runs on one thread and gives the caller's thread count back."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = build_chat_model(tmp_path / "two", **SMALL)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        one = build_chat_model(tmp_path / "one", **SMALL)
    finally:
        torch.set_num_threads(before)
    assert (two / "model.safetensors").read_bytes() == (one / "model.safetensors").read_bytes()


def test_parameters_for_a_100m_config():
    assert 100e6 < tiny_chat.parameters_for(768, 12, 512) < 120e6
