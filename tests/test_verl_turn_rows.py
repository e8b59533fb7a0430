"""Turns -> verl engine batch on hand-built cases: masks, padding rows, per-row temperature, advantages.

No engine is built here; the packed form is checked with verl's own
``left_right_2_no_padding`` so a layout verl would misread fails.
"""

from __future__ import annotations

import pytest
import torch

from unimas.groups.base import TrainTurn
from unimas.groups.verl import turn_rows

PAD = 0


def turns() -> list[TrainTurn]:
    return [
        TrainTurn(prompt_ids=[5, 6, 7], response_ids=[8], rollout_logprobs=[-1.0], advantage=1.5, temperature=0.7),
        TrainTurn(prompt_ids=[9], response_ids=[10, 11, 12], rollout_logprobs=[], advantage=-0.5),
    ]


def test_rows_left_pad_prompts_right_pad_responses_and_mark_only_responses():
    rows = turn_rows.layout(turns(), PAD)
    t = rows.tensors
    assert rows.real == 2 and rows.size == 2 and rows.prompt_width == 3
    assert t["input_ids"].tolist() == [[5, 6, 7, 8, PAD, PAD], [PAD, PAD, 9, 10, 11, 12]]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert t["prompts"].tolist() == [[5, 6, 7], [PAD, PAD, 9]]
    assert t["responses"].tolist() == [[8, PAD, PAD], [10, 11, 12]]
    assert t["response_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    # positions count real tokens only, so a left-padded prompt starts at 0
    assert t["position_ids"][1, 2:].tolist() == [0, 1, 2, 3]
    assert t["position_ids"][0, :4].tolist() == [0, 1, 2, 3]
    assert t["temperature"].tolist() == pytest.approx([0.7, 1.0])
    assert t["advantages"].tolist() == [[1.5, 0.0, 0.0], [-0.5, -0.5, -0.5]]


def test_padding_rows_are_never_trained_and_keep_one_prompt_and_one_response_token():
    rows = turn_rows.layout(turns(), PAD, size=turn_rows.padded_size(2, 4))
    t = rows.tensors
    assert rows.size == 4 and rows.real == 2
    for row in (2, 3):
        assert t["response_mask"][row].sum() == 0
        assert t["advantages"][row].abs().sum() == 0
        assert t["attention_mask"][row].tolist() == [0, 0, 1, 1, 0, 0]
        assert t["temperature"][row] == 1.0


def test_padded_size_rounds_up_to_mini_batches():
    assert turn_rows.padded_size(5, 4) == 8
    assert turn_rows.padded_size(8, 4) == 8
    assert turn_rows.padded_size(0, 3) == 3
    assert turn_rows.padded_size(3, 0) == 3


def test_bad_turns_are_refused():
    with pytest.raises(ValueError, match="non-empty response"):
        turn_rows.layout([TrainTurn([1], [], [], 0.0)], PAD)
    with pytest.raises(ValueError, match="non-empty prompt"):
        turn_rows.layout([TrainTurn([], [3], [], 0.0)], PAD)
    with pytest.raises(ValueError, match="cannot fit"):
        turn_rows.layout(turns(), PAD, size=1)


def test_engine_input_packs_real_tokens_and_keeps_per_row_values():
    rows = turn_rows.layout(turns(), PAD, size=3)
    old = turn_rows.response_rows([[-1.0], [-2.0, -3.0, -4.0]], rows)
    assert old.tolist() == [[-1.0, 0.0, 0.0], [-2.0, -3.0, -4.0], [0.0, 0.0, 0.0]]
    data = turn_rows.engine_input(rows, {"old_log_probs": old}, compute_loss=False)
    packed = [row.tolist() for row in data["input_ids"].unbind()]
    assert packed == [[5, 6, 7, 8], [9, 10, 11, 12], [PAD, PAD]]
    assert data["temperature"].tolist() == pytest.approx([0.7, 1.0, 1.0])
    assert data["response_mask"].tolist() == [[1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert data["old_log_probs"][1].tolist() == [-2.0, -3.0, -4.0]
    # per-token outputs come back as (rows, response width): the engine's value at position t scores token t + 1,
    # so a response token's log-prob is read from the position before it (here: the ids themselves, shifted)
    from tensordict import TensorDict

    output = TensorDict({"log_probs": data["input_ids"].float()}, batch_size=[3])
    unpacked = turn_rows.to_rows(output, "log_probs", data)
    assert unpacked[:2].tolist() == [[7.0, 0.0, 0.0], [9.0, 10.0, 11.0]]


def test_mean_metrics_averages_lists_and_metric_objects():
    class Value:
        def __init__(self, value):
            self.value = value

    out = turn_rows.mean_metrics({"a": [1.0, 3.0], "b": 2, "c": [Value(torch.tensor(4.0))], "d": [None]})
    assert out == {"a": 2.0, "b": 2.0, "c": 4.0}
