"""unimas turns -> the batch verl's engine takes, and its per-token outputs back to rows.

Each :class:`TrainTurn` is one row: its prompt left-padded, its response
right-padded, so a multi-turn episode needs no masks inside a row. verl
packs the rows into its no-padding (nested) form itself
(``left_right_2_no_padding``). Batches are padded with rows that are never
trained (``response_mask`` 0, advantage 0) up to a multiple of the
mini-batch size, because verl's mini-batch iterator needs equal slices.
A padding row holds one prompt and one response token: verl refuses rows
with an empty prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from unimas.algorithms.losses import RoleObjective, token_coefficients
from unimas.config.schema import AlgorithmConfig
from unimas.groups.base import TrainTurn


@dataclass
class Rows:
    """A padded batch: ``real`` rows from turns first, then padding rows."""

    tensors: dict[str, torch.Tensor]
    real: int
    prompt_width: int

    @property
    def size(self) -> int:
        return self.tensors["input_ids"].shape[0]


def padded_size(count: int, multiple: int) -> int:
    """``count`` rounded up to a multiple of ``multiple`` (at least one row)."""
    multiple = max(multiple, 1)
    return max(-(-count // multiple) * multiple, multiple)


def layout(turns: Sequence[TrainTurn], pad_id: int, size: Optional[int] = None) -> Rows:
    """Prompt | response rows with masks, positions and per-row temperature; ``size`` rows in all.

    Keys: ``prompts``, ``responses``, ``input_ids``, ``attention_mask``,
    ``position_ids``, ``response_mask`` (1 on trained response tokens),
    ``temperature`` (float per row: the turn's sampling temperature, 1 for
    padding rows), ``advantages`` (the turn's ``token_advantages`` when a
    critic set them, else its scalar on each response token).
    """
    from verl.utils.model import compute_position_id_with_mask

    size = len(turns) if size is None else size
    if size < len(turns):
        raise ValueError(f"cannot fit {len(turns)} turns in {size} rows")
    if any(not t.response_ids for t in turns):
        raise ValueError("every turn needs a non-empty response")
    prompt_width = max([len(t.prompt_ids) for t in turns] + [1])
    response_width = max([len(t.response_ids) for t in turns] + [1])
    width = prompt_width + response_width
    input_ids = torch.full((size, width), pad_id, dtype=torch.long)
    attention = torch.zeros((size, width), dtype=torch.long)
    response_mask = torch.zeros((size, response_width), dtype=torch.long)
    temperature = torch.ones(size, dtype=torch.float32)
    advantage = torch.zeros((size, response_width), dtype=torch.float32)
    for row, turn in enumerate(turns):
        prompt, response = list(turn.prompt_ids), list(turn.response_ids)
        if not prompt:
            raise ValueError("every turn needs a non-empty prompt")
        input_ids[row, prompt_width - len(prompt): prompt_width] = torch.tensor(prompt)
        input_ids[row, prompt_width: prompt_width + len(response)] = torch.tensor(response)
        attention[row, prompt_width - len(prompt): prompt_width + len(response)] = 1
        response_mask[row, : len(response)] = 1
        temperature[row] = float(turn.temperature or 1.0)
        per_token = turn.token_advantages
        if per_token is not None and len(per_token) != len(response):
            raise ValueError(f"{len(per_token)} token advantages for {len(response)} response tokens")
        advantage[row, : len(response)] = (torch.tensor(list(per_token), dtype=torch.float32)
                                           if per_token is not None else float(turn.advantage))
    for row in range(len(turns), size):
        attention[row, prompt_width - 1: prompt_width + 1] = 1
    tensors = {
        "prompts": input_ids[:, :prompt_width], "responses": input_ids[:, prompt_width:], "input_ids": input_ids,
        "attention_mask": attention, "position_ids": compute_position_id_with_mask(attention),
        "response_mask": response_mask, "temperature": temperature,
        "advantages": advantage,
    }
    return Rows(tensors, len(turns), prompt_width)


def role_coefficients(turns: Sequence[TrainTurn], rows: Rows, objectives: dict[str, RoleObjective],
                      algorithm: AlgorithmConfig) -> dict[str, torch.Tensor]:
    """``token_weight`` and ``entropy_coef`` (rows, response width) for the loss (:mod:`.loss`), from the roles'
    own terms (``roles.<role>.entropy_coef`` / ``loss_weight``); empty when no turn's role sets any, so the
    engine's batch and loss are what they were without per-role settings. Padding rows get weight 1."""
    roles = [t.role for t in turns] + [""] * (rows.size - rows.real)
    weight, coef = token_coefficients(objectives, roles, algorithm, rows.tensors["advantages"])
    if weight is None:
        return {}
    shape = rows.tensors["response_mask"].shape
    return {"token_weight": weight.expand(shape).contiguous(), "entropy_coef": coef.expand(shape).contiguous()}


def response_rows(values: Sequence[Sequence[float]], rows: Rows) -> torch.Tensor:
    """Per-turn response values (e.g. old log-probs) as a (rows, response width) float tensor, zero padded."""
    out = torch.zeros(rows.tensors["response_mask"].shape, dtype=torch.float32)
    for row, value in enumerate(values):
        out[row, : len(value)] = torch.tensor(list(value), dtype=torch.float32)
    return out


def engine_input(rows: Rows, extra: Optional[dict[str, torch.Tensor]] = None, **meta):
    """The no-padding TensorDict verl's engine takes, with ``meta`` as its non-tensor settings."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    data = left_right_2_no_padding(DataProto.from_single_dict({**rows.tensors, **(extra or {})}).to_tensordict())
    tu.assign_non_tensor(data, **meta)
    return data


def to_rows(output, key: str, data) -> torch.Tensor:
    """A per-token engine output (nested) back to a padded (rows, response width) tensor."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(tu.get(output, key), data).float()


def mean_metrics(metrics: dict) -> dict[str, float]:
    """verl's per-mini-batch metric lists as floats (means)."""
    out = {}
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        numbers = [float(getattr(v, "value", v)) for v in values if v is not None]
        if numbers:
            out[key] = sum(numbers) / len(numbers)
    return out
