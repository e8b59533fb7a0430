"""Rows that share a prompt compute it once.

The episodes of a GRPO group start from the same task, so a sampling batch
and a training mini-batch hold each first-turn prompt ``group_size`` times.
A forward over a prompt costs in proportion to its rows, so each distinct
prompt goes through the model once, with its key/value cache kept; the
cache is then copied to every row that shares it, and each row goes on
from there with its own tokens. Used by the sampling loop (the prefill)
and by every log-prob forward of the update (policy, reference, recomputed
old log-probs): there gradients flow back through the copies into the one
prompt forward, summed over the rows that share it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch


def distinct_prompts(prompts: Sequence[list[int]]) -> tuple[list[list[int]], Optional[list[int]]]:
    """(each distinct prompt once, the index of every row's prompt in that list); None when all differ.

    The prefill forward costs in proportion to its rows (measured on CPU for a tiny Qwen2: 128 rows of 12
    tokens 15 ms, their 16 distinct prompts 1.8 ms), while every decoding step needs all rows anyway.
    """
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(prompt), len(index)) for prompt in prompts]
    if len(index) == len(rows):
        return list(prompts), None
    return [list(prompt) for prompt in index], rows


def copy_cache_rows(cache: Any, rows: torch.Tensor) -> Any:
    """The key/value cache with row ``i`` taken from row ``rows[i]`` (rows repeat: one prefilled prompt feeds
    each row that shares it). transformers' caches do this for beam search (``reorder_cache``)."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(rows)
        return cache
    if isinstance(cache, tuple):  # the legacy layout: per layer, (keys, values, ...) with the batch first
        return tuple(tuple(t.index_select(0, rows) for t in layer) for layer in cache)
    raise TypeError(f"cannot copy rows of a {type(cache).__name__} key/value cache (no reorder_cache)")
