"""The padded batch layout (unimas/groups/hf/layout.py) against a row-by-row construction of it.

``layout_batch`` builds ids from one flat buffer and the mask from the row
lengths; these tests pin that the result is the layout the module docstring
describes, value for value and dtype for dtype, so sampling and training keep
seeing the same tensors.
"""

from __future__ import annotations

import random

import torch

from unimas.groups.hf.layout import layout_batch, pad_rows


def reference_layout(prompts, responses, pad):
    """[left-padded prompt | right-padded response], mask 1 on real tokens, positions cumsum(mask) - 1 (>= 0)."""
    width_p, width_r = max(map(len, prompts)), max(map(len, responses))
    ids, mask = [], []
    for p, r in zip(prompts, responses):
        left, right = width_p - len(p), width_r - len(r)
        ids.append([pad] * left + list(p) + list(r) + [pad] * right)
        mask.append([0] * left + [1] * (len(p) + len(r)) + [0] * right)
    ids, mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), width_p


def test_layout_batch_is_the_row_by_row_layout():
    rng = random.Random(0)
    for _ in range(200):
        rows = rng.randint(1, 12)
        prompts = [[rng.randrange(150_000) for _ in range(rng.randint(1, 20))] for _ in range(rows)]
        responses = [[rng.randrange(150_000) for _ in range(rng.randint(0, 6))] for _ in range(rows)]
        pad = rng.choice([0, 3, 151_643])
        batch = layout_batch(prompts, responses, pad, "cpu")
        ids, mask, positions, width_p = reference_layout(prompts, responses, pad)
        assert batch.input_ids.dtype == batch.attention_mask.dtype == batch.position_ids.dtype == torch.long
        assert torch.equal(batch.input_ids, ids)
        assert torch.equal(batch.attention_mask, mask)
        assert torch.equal(batch.position_ids, positions)
        assert torch.equal(batch.response, ids[:, width_p:])
        assert batch.response_mask.dtype == torch.float32
        assert torch.equal(batch.response_mask, mask[:, width_p:].float())


def test_prompt_only_batch_has_no_response_columns():
    batch = layout_batch([[5, 6], [7]], [[], []], 0, "cpu")
    assert batch.input_ids.tolist() == [[5, 6], [0, 7]]
    assert batch.attention_mask.tolist() == [[1, 1], [0, 1]]
    assert batch.position_ids.tolist() == [[0, 1], [0, 0]]
    assert batch.response.shape == (2, 0)


def test_pad_rows_keeps_float32_rounding_and_pads_with_zeros():
    rng = random.Random(1)
    rows = [[rng.uniform(-30, 0) * 10 ** rng.randint(-40, 3) for _ in range(rng.randint(0, 7))] for _ in range(50)]
    rows[0] = [1e300, -1e300, float("nan"), 1e-46]  # overflow to ±inf, NaN kept, underflow to 0: as torch.tensor
    width = max(map(len, rows))
    expected = torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32)
    got = pad_rows(rows, width, "cpu")
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert torch.equal(got.nan_to_num(), expected.nan_to_num()) and torch.equal(got.isnan(), expected.isnan())
    assert pad_rows([[], []], 0, "cpu").shape == (2, 0)
