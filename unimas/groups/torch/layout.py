"""The one batch layout shared by sampling and training.

Every batch is ``[left-padded prompt | right-padded response]`` with explicit
``position_ids = cumsum(attention_mask) - 1``. Absolute-position models
(GPT-2) are wrong by nats per token without explicit positions, and using the
same layout in both paths keeps the log-probs reported at sampling time
numerically equal to the ones recomputed for the update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class PaddedBatch:
    """Sequences as ``[left-padded prompt | right-padded response]``; ``R = response.shape[1]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response: torch.Tensor
    """The response columns of ``input_ids`` (a view), (rows, R)."""
    response_mask: torch.Tensor
    """1.0 on real response tokens, 0.0 on right padding, (rows, R)."""


def layout_batch(prompts: Sequence[list[int]], responses: Sequence[list[int]], pad: int, device) -> PaddedBatch:
    """Build the padded batch from Python lists in one tensor call (row-wise tensor writes are slow)."""
    width_p = max(len(p) for p in prompts)
    width_r = max(len(r) for r in responses)
    rows, masks = [], []
    for prompt, response in zip(prompts, responses):
        left, right = width_p - len(prompt), width_r - len(response)
        rows.append([pad] * left + list(prompt) + list(response) + [pad] * right)
        masks.append([0] * left + [1] * (len(prompt) + len(response)) + [0] * right)
    ids = torch.tensor(rows, dtype=torch.long)
    mask = torch.tensor(masks, dtype=torch.long)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    return PaddedBatch(ids, mask, positions, ids[:, width_p:], mask[:, width_p:].float())


def pad_rows(rows: Sequence[Sequence[float]], width: int, device) -> torch.Tensor:
    """Per-token values (e.g. rollout log-probs) right-padded with zeros to ``width`` columns."""
    padded = [list(row) + [0.0] * (width - len(row)) for row in rows]
    return torch.tensor(padded, dtype=torch.float32).to(device)
