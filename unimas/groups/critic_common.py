"""What every backend's learned critic reports and reads the same way: its metrics, the statistics of its
values and advantages, and the episode context a centralized critic reads before each turn.

The torch critic (:mod:`unimas.groups.torch.critic`) and the verl one
(:mod:`unimas.groups.verl.critic`) compute values their own way; from the
values on, GAE (:mod:`unimas.groups.role_gae`) and these functions make their
updates report alike (docs/critic.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from unimas.errors import UserError
from unimas.groups.base import TrainTurn
from unimas.groups.prompts import check_known

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

METRICS = ("value_loss", "value_clip_frac", "explained_variance", "value_mean", "return_mean", "grad_norm", "lr")
"""Reported as ``critic/<name>`` by every update of a group with a critic (plus ``critic/advantage_std/<role>``)."""


def value_statistics(old: list[list[float]], returns: list[list[float]]) -> dict[str, float]:
    """Mean value and return, and the explained variance 1 - Var[return - value] / Var[return] of the values
    before this update (0 when the returns do not vary), over every response token."""
    values = torch.tensor([v for row in old for v in row], dtype=torch.float64)
    targets = torch.tensor([r for row in returns for r in row], dtype=torch.float64)
    spread = float(targets.var(unbiased=False))
    explained = 1.0 - float((targets - values).var(unbiased=False)) / spread if spread > 1e-12 else 0.0
    return {"critic/value_mean": float(values.mean()), "critic/return_mean": float(targets.mean()),
            "critic/explained_variance": explained if math.isfinite(explained) else 0.0}


def advantage_spread(turns: Sequence[TrainTurn], advantages: list[list[float]]) -> dict[str, float]:
    """``critic/advantage_std/<role>``: the std of the role's per-token advantages."""
    by_role: dict[str, list[float]] = defaultdict(list)
    for turn, row in zip(turns, advantages):
        by_role[turn.role].extend(row)
    return {f"critic/advantage_std/{role}": float(torch.tensor(values).std(unbiased=False))
            for role, values in sorted(by_role.items())}


def with_context(turns: Sequence[TrainTurn], tokenizer: "PreTrainedTokenizerBase", group: str,
                 max_positions: Optional[int]) -> list[TrainTurn]:
    """The turns as the centralized critic reads them: each ``context`` in the group's tokens before the prompt
    ids, its oldest tokens cut so that the whole turn fits the model (``max_positions``; None: no limit)."""
    texts = [t.context for t in turns]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if any(texts) else [[] for _ in turns]
    read = []
    for turn, text, ids in zip(turns, texts, encoded):
        try:
            check_known(tokenizer, text, ids)
        except ValueError as exc:
            raise UserError(f"{exc}; the centralized critic reads role names and earlier turns as text "
                            f"(docs/critic.md): add them to models.{group}.options.tiny.alphabet and to the "
                            "roles' groups' alphabets", where="algorithm.central_critic") from None
        room = len(ids) if max_positions is None else max_positions - len(turn.prompt_ids) - len(turn.response_ids)
        kept = ids[len(ids) - min(max(room, 0), len(ids)):]
        read.append(dataclasses.replace(turn, prompt_ids=kept + turn.prompt_ids))
    return read
