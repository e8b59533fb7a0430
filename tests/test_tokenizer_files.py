"""A model dir's token texts and chat template read from its files equal what transformers' tokenizer says.

``unimas validate`` answers both without importing transformers
(:mod:`unimas.groups.hf.tokenizer_files`); the transformers path stays for
dirs it cannot read. Each case computes the answers both ways, through the
same :mod:`unimas.groups.hf.source` functions with the file reader turned
off for the reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from unimas.errors import UserError
from unimas.groups.hf import source, tokenizer_files
from unimas.groups.torch.backend import TorchBackend
from unimas.groups.torch.options import TorchOptions

TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"


def through_transformers(options: TorchOptions, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], bool]:
    """(vocabulary, has chat template) with the file reader off: the tokenizer ``AutoTokenizer`` loads."""
    with monkeypatch.context() as patch:
        patch.setattr(tokenizer_files, "read", lambda directory: None)
        return source.vocabulary(options), source.has_chat_template(options)


def from_files(options: TorchOptions) -> tuple[list[str], bool]:
    return source.vocabulary(options), source.has_chat_template(options)


def bpe_dir(path: Path, *, clean_up: bool = False, wordpiece: bool = False) -> Path:
    """A BPE (or WordPiece) tokenizer trained offline and saved through transformers, with named, extra and
    flagged special tokens, a plain added token and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if wordpiece:
        tokenizer = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["<unk>"])
    else:
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog. isn't it?",
                                   "1 + 2 = 3 , so 3 - 1 = 2 ! <b>bold</b> {\"k\": [1]}"] * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=["<tool>", "</tool>"],
                                   clean_up_tokenization_spaces=clean_up)
    fast.add_tokens(["<plain>"])
    fast.add_tokens(["<flagged>"], special_tokens=True)  # special to the backend, not a named special token
    fast.chat_template = TEMPLATE
    fast.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))  # TorchOptions wants a model dir
    return path


def edit_config(directory: Path, **changes: object) -> None:
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def test_the_tiny_chat_models_answers_are_transformers(chat_model, monkeypatch):
    options = TorchOptions(path=str(chat_model))
    vocabulary, templated = from_files(options)
    assert (vocabulary, templated) == through_transformers(options, monkeypatch)
    assert templated is True and len(vocabulary) > 300  # the answers are not trivially equal
    assert not {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} & set(vocabulary)
    assert (TorchBackend.vocabulary(options), TorchBackend.has_chat_template(options)) == (vocabulary, templated)


@pytest.mark.parametrize("layout", ["jinja", "config-entry", "named-only", "empty-jinja", "none"])
def test_a_saved_bpe_tokenizers_answers_are_transformers(tmp_path, monkeypatch, layout):
    """Special tokens (named, extra, flagged, an AddedToken object, a model-specific one) and every place a chat
    template can be saved, or an empty one that hides the config's."""
    directory = bpe_dir(tmp_path / "bpe")
    jinja = directory / "chat_template.jinja"
    if layout in ("config-entry", "empty-jinja"):  # transformers 4 kept the template in the config
        edit_config(directory, chat_template=jinja.read_text())
        if layout == "empty-jinja":
            jinja.write_text("")
        else:
            jinja.unlink()
    elif layout == "named-only":
        (directory / "additional_chat_templates").mkdir()
        jinja.rename(directory / "additional_chat_templates" / "tool_use.jinja")
    elif layout == "none":
        jinja.unlink()
        edit_config(directory, extra_special_tokens=None, additional_special_tokens=["<tool>"],
                    bos_token={"__type": "AddedToken", "content": "<s>", "lstrip": False, "rstrip": False,
                               "normalized": False, "single_word": False, "special": True},
                    image_token="<plain>")
    options = TorchOptions(path=str(directory))
    vocabulary, templated = from_files(options)
    assert (vocabulary, templated) == through_transformers(options, monkeypatch)
    assert templated is (layout in ("jinja", "config-entry", "named-only"))
    assert "<flagged>" in vocabulary and "<s>" not in vocabulary
    assert ("<plain>" in vocabulary, "</tool>" in vocabulary) == (layout != "none", layout == "none")


def test_text_clean_up_on_a_non_bpe_model_is_left_to_transformers(tmp_path, monkeypatch):
    """transformers edits decoded text then (" ." -> "."); the file reader says it cannot answer."""
    directory = bpe_dir(tmp_path / "wordpiece", clean_up=True, wordpiece=True)
    assert tokenizer_files.read(directory) is None
    assert tokenizer_files.read(bpe_dir(tmp_path / "bpe", clean_up=True)) is not None  # ignored for BPE
    options = TorchOptions(path=str(directory))
    assert from_files(options) == through_transformers(options, monkeypatch)


def test_a_dir_without_tokenizer_json_is_left_to_transformers(tmp_path, chat_model):
    shutil.copytree(chat_model, tmp_path / "slow")
    (tmp_path / "slow" / "tokenizer.json").unlink()
    assert tokenizer_files.read(tmp_path / "slow") is None
    assert tokenizer_files.read(chat_model) is not None


def test_init_from_reads_the_checkpoints_model_dir(tmp_path, chat_model, monkeypatch):
    run = tmp_path / "step_3"
    shutil.copytree(chat_model, run / "policy" / "model")
    options = TorchOptions(init_from=str(run))
    assert from_files(options) == through_transformers(options, monkeypatch) == from_files(
        TorchOptions(path=str(chat_model)))
    shutil.copytree(chat_model, run / "critic" / "model")  # two groups: which one is unknown
    assert from_files(options) == (None, None)


@pytest.mark.parametrize(("name", "text"), [
    ("tokenizer.json", '{"version": "1.0", "model": {"type": "BPE", "vocab": '),
    ("tokenizer.json", '{"version": "1.0", "model": {"type": "NoSuchModel"}}'),
    ("tokenizer_config.json", "{not json"),
    ("tokenizer_config.json", "[1, 2]"),
])
def test_a_malformed_file_is_a_user_error_naming_it(tmp_path, chat_model, name, text):
    directory = tmp_path / "broken"
    shutil.copytree(chat_model, directory)
    (directory / name).write_text(text)
    options = TorchOptions(path=str(directory))
    for answer in (TorchBackend.vocabulary, TorchBackend.has_chat_template):
        with pytest.raises(UserError, match=str(directory / name)):
            answer(options)


def test_validate_names_a_corrupt_tokenizer_json_without_a_traceback(tmp_path, chat_model, capsys):
    from tests.conftest import EXAMPLES
    from unimas.cli import main

    directory = tmp_path / "broken"
    shutil.copytree(chat_model, directory)
    (directory / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ')
    config = tmp_path / "chat.yaml"
    config.write_text((EXAMPLES / "quickstart_chat.yaml").read_text().replace(
        "{path: models/tiny-chat}", "{path: " + json.dumps(str(directory)) + "}"))
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert str(directory / "tokenizer.json") in err and "Traceback" not in err, err


def test_a_model_dir_is_parsed_once_until_its_files_change(tmp_path):
    from unimas.groups.hf import tokenizer_files

    directory = bpe_dir(tmp_path / "bpe")
    (directory / tokenizer_files.CHAT_TEMPLATE_FILE).unlink(missing_ok=True)
    edit_config(directory, chat_template="{{ messages }}")
    first = tokenizer_files.read(directory)
    assert tokenizer_files.read(directory) is first  # the chat-template and the vocabulary questions share it
    edit_config(directory, chat_template=None, padding_side="left")  # a different size: the cache sees it
    again = tokenizer_files.read(directory)
    assert again is not first and first.chat_template and not again.chat_template
