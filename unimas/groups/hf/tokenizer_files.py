"""A model dir's token texts and chat template, read from its tokenizer files without torch or transformers.

Why: ``unimas validate`` asks a torch group whether it has a chat template
(and ``--episodes`` asks for its token texts), and in transformers 5 importing
any tokenizer class imports torch: ~4.8 s on 2 cores, most of what validating
a model-dir config cost (docs/performance.md, start-up). The ``tokenizers``
package (the Rust library transformers' fast tokenizers wrap) reads
``tokenizer.json`` in milliseconds, and the rest is JSON and Jinja files.

The answers are the ones ``AutoTokenizer`` gives (``tests/test_tokenizer_files.py``
compares them), because they are read the way transformers reads them:

* special tokens: ``tokenizer_config.json``'s ``bos_token`` ... ``mask_token``
  and any other ``*_token`` key holding a token, plus ``extra_special_tokens``
  (a list, or names to tokens; ``additional_special_tokens`` before v5); a
  legacy ``special_tokens_map.json`` only when the config has no
  ``added_tokens_decoder``, as transformers does.
* chat template: ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``
  when present, else the config's ``chat_template``. (``chat_template.json``
  belongs to processors; a tokenizer never reads it, so neither does this.)
* token texts: every id decoded alone by ``tokenizer.json``'s own decoder,
  special tokens left out.

:func:`read` returns None where transformers would build something else, and
the caller loads the tokenizer through transformers instead: a dir without
``tokenizer.json`` (slow or sentencepiece-only tokenizers), and
``clean_up_tokenization_spaces`` on a non-BPE model (transformers edits
decoded text then). One difference remains possible: a tokenizer class's own
default for a special token the config does not mention (Qwen2's tokenizer
defaults ``unk_token`` to ``<|endoftext|>``) is unknown here, so such a token
would be listed as text; that changes only what the stand-in model of
``--episodes`` may write. A file that does not parse is a :class:`UserError`
naming it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from unimas.errors import UserError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"

EXTRA_KEYS = ("extra_special_tokens", "additional_special_tokens")
WATCHED = (TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE, CHAT_TEMPLATE_FILE, CHAT_TEMPLATE_DIR)
"""The files whose size and time :func:`read` keys its cache on."""


@dataclass(frozen=True)
class TokenizerFiles:
    """What :func:`read` found in one model dir."""

    tokenizer: "Tokenizer"
    special_tokens: frozenset[str]
    chat_template: bool

    def vocabulary(self) -> list[str]:
        """The text of every non-special token, in id order without repeats or empty texts."""
        special = {self.tokenizer.token_to_id(token) for token in self.special_tokens}
        ids = [[i] for i in range(self.tokenizer.get_vocab_size(with_added_tokens=True)) if i not in special]
        texts = self.tokenizer.decode_batch(ids, skip_special_tokens=False)
        return [text for text in dict.fromkeys(texts) if text]


def read(directory: Path) -> Optional[TokenizerFiles]:
    """The tokenizer files of ``directory``; None when transformers must load them (see the module docstring).

    Read once per state of the files: ``unimas validate`` asks every group for its chat template and, with
    ``--episodes``, for its token texts, and groups often share one model dir, while parsing a large
    ``tokenizer.json`` takes most of a second. A file written since is read again.
    """
    directory = Path(directory).resolve()
    return _read(directory, tuple(_stamp(directory / name) for name in WATCHED))


def _stamp(path: Path) -> Optional[tuple[int, int]]:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=16)
def _read(directory: Path, stamps: tuple) -> Optional[TokenizerFiles]:
    """:func:`read` for one state of the files (``stamps``, part of the cache key only)."""
    if not (directory / TOKENIZER_FILE).is_file():
        return None
    config = _json(directory / CONFIG_FILE) or {}
    tokenizer = _tokenizer(directory / TOKENIZER_FILE)
    if config.get("clean_up_tokenization_spaces") and type(tokenizer.model).__name__ != "BPE":
        return None
    legacy_map = {} if "added_tokens_decoder" in config else _json(directory / SPECIAL_TOKENS_MAP_FILE) or {}
    for source, name in ((config, CONFIG_FILE), (legacy_map, SPECIAL_TOKENS_MAP_FILE)):
        _check_extras(source, directory / name)
    return TokenizerFiles(tokenizer, _special_tokens(config, legacy_map), _has_chat_template(directory, config))


def _json(path: Path) -> Optional[dict[str, Any]]:
    """The object in a JSON file; None when there is no such file."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # deep nesting: recursion
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} holds a JSON {type(value).__name__}, not the object a tokenizer file is")
    return value


def _tokenizer(path: Path) -> "Tokenizer":
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust parser raises plain Exception for every malformed file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path} is not a tokenizer file the tokenizers library can read: {first}") from None


def _token_text(value: Any) -> Optional[str]:
    """A token as the config stores it: its text, or an AddedToken object holding it as ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _check_extras(source: dict[str, Any], path: Path) -> None:
    """Extra special tokens are a list or a mapping: a number there would fail, unnamed, in :func:`_special_tokens`."""
    for key in EXTRA_KEYS:
        listed = source.get(key)
        if listed and not isinstance(listed, (list, dict)):
            raise UserError(f"{path}: '{key}' holds a JSON {type(listed).__name__}, not a list of tokens or a "
                            "mapping of names to tokens")


def _special_tokens(config: dict[str, Any], legacy_map: dict[str, Any]) -> frozenset[str]:
    named = {key: value for key, value in config.items() if key.endswith("_token")}
    named.update((key, value) for key, value in legacy_map.items() if key.endswith("_token"))
    extras: list[Any] = []
    for source in (config, legacy_map):  # v5 reads extra_special_tokens when both are there
        listed = source.get(EXTRA_KEYS[0]) if EXTRA_KEYS[0] in source else source.get(EXTRA_KEYS[1])
        extras += list(listed.values()) if isinstance(listed, dict) else list(listed or [])
    texts = (_token_text(value) for value in [*named.values(), *extras])
    return frozenset(text for text in texts if text is not None)


def _has_chat_template(directory: Path, config: dict[str, Any]) -> bool:
    """Template files take priority over the config's ``chat_template`` entry, as in transformers."""
    default = directory / CHAT_TEMPLATE_FILE
    if any((directory / CHAT_TEMPLATE_DIR).glob("*.jinja")):
        return True  # named templates: transformers keeps them as a dict, which is never empty
    if not default.is_file():
        return bool(config.get("chat_template"))
    try:
        return bool(default.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {default}: {exc}") from None
