"""Where a group's weights and tokenizer come from: a tiny spec, a local HF dir, or a checkpoint.

Kept apart from the group so that the tokenizer can be read on its own
(:func:`vocabulary`, for the stand-in model of ``unimas validate --episodes``)
without loading any weights. Nothing is ever downloaded (``local_files_only``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from unimas.errors import UserError
from unimas.groups.torch import checkpoint
from unimas.groups.torch.chars import build_char_tokenizer
from unimas.groups.torch.options import TorchOptions
from unimas.groups.torch.tiny import build_tiny_model


def load_tokenizer(options: TorchOptions, model_dir: Optional[Path]) -> PreTrainedTokenizerBase:
    """The char tokenizer of a tiny spec, or the tokenizer saved in ``model_dir``; padding on the left."""
    if options.tiny is not None:
        tokenizer = build_char_tokenizer(options.tiny.alphabet)
    else:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(options: TorchOptions, name: str,
               seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Optional[Path]]:
    """(model, tokenizer, checkpoint group dir or None) for group ``name``.

    ``seed`` only matters for a tiny spec (its random init). The returned
    dir is set for ``init_from``, whose LoRA adapters the group loads next.
    """
    if options.tiny is not None:
        tokenizer = load_tokenizer(options, None)
        return build_tiny_model(options.tiny, tokenizer, seed).to(options.torch_dtype), tokenizer, None
    key = "init_from" if options.init_from else "path"
    try:
        source = checkpoint.group_dir(Path(options.init_from), name) if options.init_from else None
        model_dir = source[1] if source else Path(options.path)
        tokenizer = load_tokenizer(options, model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=options.torch_dtype,
                                                     use_safetensors=True)  # never a pickled .bin
    except (OSError, ValueError, KeyError) as exc:  # missing weights or tokenizer, unknown model type
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"cannot load a model from {getattr(options, key)!r}: {first}",
                        where=f"models.{name}.options.{key}") from None
    return model, tokenizer, source[0] if source else None


def tokenizer_only(options: TorchOptions) -> Optional[PreTrainedTokenizerBase]:
    """The group's tokenizer without its weights; None when ``init_from`` is a run checkpoint with several
    groups (which one is unknown here)."""
    model_dir = None
    if options.init_from is not None:
        model_dir = checkpoint.model_dir_without_name(Path(options.init_from))
        if model_dir is None:
            return None
    elif options.path is not None:
        model_dir = Path(options.path)
    return load_tokenizer(options, model_dir)


def vocabulary(options: TorchOptions) -> Optional[list[str]]:
    """The text of every non-special token, in id order without repeats; no weights are loaded."""
    tokenizer = tokenizer_only(options)
    if tokenizer is None:
        return None
    special = set(tokenizer.all_special_ids)
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer)) if i not in special])
    return [text for text in dict.fromkeys(texts) if text]
