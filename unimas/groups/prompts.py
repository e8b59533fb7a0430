"""Prompt ids checked and fitted to a model's context, with the same rules and error texts on every backend.

A role must behave the same whichever backend its group runs on: its prompt
is refused for the same unknown characters, cut from the left by the same
rule when it allows that, and refused with the same message when the new
tokens alone do not fit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from unimas.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def check_known(tokenizer: "PreTrainedTokenizerBase", text: str, ids: list[int]) -> None:
    """Raise ``ValueError`` naming the characters of ``text`` that encoded to ``<unk>``.

    Silent ``<unk>`` tokens would make two different prompts look identical
    to the model; with a char tokenizer they always mean an alphabet too small.
    """
    unk = tokenizer.unk_token_id
    if unk is None or unk not in ids:
        return
    known = tokenizer.get_vocab()
    unknown = sorted({char for char in text if char not in known})
    shown = ", ".join(repr(char) for char in unknown) or "(some characters)"
    raise ValueError(f"text {text[:60]!r} has characters outside the tokenizer's vocabulary: {shown}")


def check_prompt_text(tokenizer: "PreTrainedTokenizerBase", text: str, ids: list[int], group: str) -> None:
    """A :class:`UserError` naming the characters of a prompt the tokenizer does not know (``<unk>``)."""
    try:
        check_known(tokenizer, text, ids)
    except ValueError as exc:
        raise UserError(f"{exc}; add them to models.{group}.options.tiny.alphabet (a tiny model) or change the "
                        "role's system, template or task data", where=f"model group '{group}'") from None


def prompt_limit(max_positions: Optional[int], reserve: int, group: str) -> Optional[int]:
    """The most prompt tokens that leave room for ``reserve`` new ones (None: no known limit); a
    :class:`UserError` when the new tokens alone do not fit."""
    if max_positions is None:
        return None
    limit = max_positions - reserve
    if limit < 1:
        raise UserError(f"{reserve} new tokens do not fit ({max_positions} positions); lower the role's "
                        "generation.max_new_tokens", where=f"model group '{group}'")
    return limit


def cut_left(ids: list[int], limit: Optional[int], group: str) -> list[int]:
    """The prompt's last ``limit`` ids (logged), or the prompt unchanged when it fits."""
    if limit is not None and len(ids) > limit:
        log.warning("model group '%s': prompt of %d tokens cut to its last %d", group, len(ids), limit)
        return ids[-limit:]
    return ids
