"""Where a group's weights and tokenizer come from: a tiny spec, a local HF dir, or a checkpoint.

Kept apart from the group so that the tokenizer can be read on its own
(:func:`vocabulary` for the stand-in model of ``unimas validate --episodes``,
:func:`has_chat_template` for ``unimas validate``) without loading any weights.
Those two read a model dir's tokenizer files (:mod:`unimas.groups.hf.tokenizer_files`)
and import transformers and torch only where a tokenizer must be loaded (a tiny
spec's char tokenizer, a dir without ``tokenizer.json``), so this module imports
them inside the functions that load. Nothing is ever
downloaded (``local_files_only``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from unimas.errors import UserError
from unimas.groups.hf import tokenizer_files
from unimas.groups.hf.model_source import MODEL_DIR, ModelSource
from unimas.groups.hf.pretrained import pretrained_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def group_dir(root: Path, name: str) -> tuple[Path, Path]:
    """(group checkpoint dir, HF model dir) for ``init_from``.

    Accepts a torch group's checkpoint dir (``<group>/model/``), a run checkpoint
    holding one such dir per group name, or a plain Hugging Face model dir.
    """
    for group in (root / name, root):
        if (group / MODEL_DIR / "config.json").exists():
            return group, group / MODEL_DIR
    if (root / "config.json").exists():
        return root, root
    raise FileNotFoundError(f"init_from {root}: no '{MODEL_DIR}/config.json' (a unimas checkpoint) or config.json")

def load_tokenizer(options: ModelSource, model_dir: Optional[Path]) -> "PreTrainedTokenizerBase":
    """The char tokenizer of a tiny spec, or the tokenizer saved in ``model_dir``; padding on the left."""
    if options.tiny is not None:
        from unimas.groups.hf.chars import build_char_tokenizer

        tokenizer = build_char_tokenizer(options.tiny.alphabet)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, padding_side="left",
                                                  trust_remote_code=False)  # never code from the dir, never a prompt
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model_dir is not None:
        from unimas.groups.hf.chat import check_chat_template

        template_file = model_dir / tokenizer_files.CHAT_TEMPLATE_FILE
        check_chat_template(tokenizer, where=str(template_file if template_file.is_file()
                                                 else model_dir / tokenizer_files.CONFIG_FILE))
    return tokenizer


def load_model(options: ModelSource, name: str,
               seed: int) -> tuple["PreTrainedModel", "PreTrainedTokenizerBase", Optional[Path]]:
    """(model, tokenizer, checkpoint group dir or None) for group ``name``.

    ``seed`` only matters for a tiny spec (its random init). The returned
    dir is set for ``init_from``, whose LoRA adapters the group loads next.
    """
    from huggingface_hub.errors import StrictDataclassError

    from unimas.groups.hf.tiny import build_tiny_model

    if options.tiny is not None:
        tokenizer = load_tokenizer(options, None)
        return build_tiny_model(options.tiny, tokenizer, seed).to(options.torch_dtype), tokenizer, None
    key = "init_from" if options.init_from else "path"
    try:
        source = group_dir(Path(options.init_from), name) if options.init_from else None
        model_dir = source[1] if source else Path(options.path)
        model = pretrained_model(model_dir, options.torch_dtype)  # first: it checks config.json, which the
        tokenizer = load_tokenizer(options, model_dir)  # tokenizer reads too (a FIFO there would block it)
    except (OSError, ValueError, KeyError, RuntimeError, StrictDataclassError) as exc:
        # missing files, an unknown model type, weights of other shapes, a config.json value of the wrong type
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"cannot load a model from {getattr(options, key)!r}: {first}",
                        where=f"models.{name}.options.{key}") from None
    return model, tokenizer, source[0] if source else None


def model_dir_without_name(root: Path) -> Optional[Path]:
    """The HF model dir of ``init_from`` when the group name is unknown; None if ambiguous.

    A run checkpoint with several groups names no single one, so it yields None.
    The layouts are :func:`group_dir`'s.
    """
    if (root / MODEL_DIR / "config.json").exists():
        return root / MODEL_DIR
    if (root / "config.json").exists():
        return root
    groups = sorted(p for p in root.iterdir() if (p / MODEL_DIR / "config.json").exists()) if root.is_dir() else []
    return groups[0] / MODEL_DIR if len(groups) == 1 else None


def tokenizer_dir(options: ModelSource) -> Optional[Path]:
    """The model dir whose tokenizer the group uses; None for a tiny spec, or when ``init_from`` is a run
    checkpoint with several groups (which one is unknown here)."""
    if options.init_from is not None:
        return model_dir_without_name(Path(options.init_from))
    return Path(options.path) if options.path is not None else None


def tokenizer_only(options: ModelSource) -> Optional["PreTrainedTokenizerBase"]:
    """The group's tokenizer without its weights; None when :func:`tokenizer_dir` cannot tell which."""
    model_dir = tokenizer_dir(options)
    if model_dir is None and options.tiny is None:
        return None
    return load_tokenizer(options, model_dir)


def _files(options: ModelSource) -> Optional[tokenizer_files.TokenizerFiles]:
    """The model dir's tokenizer files when they answer without transformers."""
    model_dir = tokenizer_dir(options)
    return tokenizer_files.read(model_dir) if model_dir is not None else None


def vocabulary(options: ModelSource) -> Optional[list[str]]:
    """The text of every non-special token, in id order without repeats; no weights are loaded."""
    files = _files(options)
    if files is not None:
        return files.vocabulary()
    tokenizer = tokenizer_only(options)
    if tokenizer is None:
        return None
    special = set(tokenizer.all_special_ids)
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer)) if i not in special])
    return [text for text in dict.fromkeys(texts) if text]


def has_chat_template(options: ModelSource) -> Optional[bool]:
    """Whether roles on this group render through a chat template; None when the tokenizer is unknown."""
    files = _files(options)
    if files is not None:
        return files.chat_template
    tokenizer = tokenizer_only(options)
    if tokenizer is None:
        return None
    from unimas.groups.hf import chat

    return chat.has_chat_template(tokenizer)
