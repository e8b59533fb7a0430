"""Rows that share a prompt compute it once.

The episodes of a GRPO group start from the same task, so a sampling batch
and a training mini-batch hold each first-turn prompt ``group_size`` times.
A forward over a prompt costs in proportion to its rows, so each distinct
prompt goes through the model once, with its key/value cache kept; the
cache is then copied to every row that shares it, and each row goes on
from there with its own tokens. Used by the sampling loop (the prefill)
and by every forward of the update (policy, KL reference and recomputed old
log-probs, a critic's values): there gradients flow back through the copies
into the one prompt forward, summed over the rows that share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from unimas.groups.hf.layout import PaddedBatch, layout_batch


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


class UnsharableCache(TypeError):
    """The model returned no key/value cache whose rows can be copied: its callers compute every row's prompt."""


def copy_cache_rows(cache: Any, rows: torch.Tensor) -> Any:
    """The key/value cache with row ``i`` taken from row ``rows[i]`` (rows repeat: one prefilled prompt feeds
    each row that shares it). transformers' caches do this for beam search (``reorder_cache``)."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(rows)
        return cache
    if isinstance(cache, tuple):  # the legacy layout: per layer, (keys, values, ...) with the batch first
        return tuple(tuple(t.index_select(0, rows) for t in layer) for layer in cache)
    raise UnsharableCache(f"cannot copy rows of a {type(cache).__name__} key/value cache (no reorder_cache)")


MIN_SAVED_TOKENS = 256
"""Prompt tokens a two-forward pass must save before the update takes it (:func:`split_forward`).

Measured on CPU with a tiny Qwen2 (``benchmarks/shared_prompts.py``): 64 rows of 8 prompts of 8 tokens (448
saved) took 0.8 × the time of full rows for the reference and the policy pass; 8 rows of 2 such prompts (48
saved) took 1.5 ×, the second forward's fixed cost outweighing what it skipped."""


def split_forward(prompts: Sequence[list[int]]) -> Optional[tuple[list[list[int]], list[int]]]:
    """For a forward over ``[prompt | response]`` rows (log-probs, values): (distinct prompts, each row's index) when
    forwarding the distinct prompts apart, then the responses on cache copies, is worth a second forward —
    at most half the prompts distinct, and :data:`MIN_SAVED_TOKENS` prompt tokens skipped; else None."""
    distinct, rows = distinct_prompts(prompts)
    if rows is None or 2 * len(distinct) > len(prompts):
        return None
    saved = sum(map(len, prompts)) - sum(map(len, distinct))
    return (distinct, rows) if saved >= MIN_SAVED_TOKENS else None


@dataclass
class SplitBatch:
    """``[prompt | response]`` rows as two forwards: the distinct prompts, then every response on a copy of its
    prompt's cache (:func:`forward_split`)."""

    prompts: PaddedBatch
    """The distinct prompts, left-padded."""
    rows: torch.Tensor
    """Each row's index in ``prompts``."""
    answers: PaddedBatch
    """Every row's response, right-padded."""

    @property
    def response(self) -> torch.Tensor:
        """The response ids, (rows, R), as :attr:`PaddedBatch.response`."""
        return self.answers.response

    @property
    def response_mask(self) -> torch.Tensor:
        """1.0 on real response tokens, (rows, R), as :attr:`PaddedBatch.response_mask`."""
        return self.answers.response_mask


def split_batch(distinct: list[list[int]], rows: list[int], responses: Sequence[list[int]], pad: int,
                device: torch.device) -> SplitBatch:
    """The two layouts of :class:`SplitBatch` from :func:`split_forward`'s plan and each row's response ids."""
    return SplitBatch(layout_batch(distinct, [[]] * len(distinct), pad, device), torch.tensor(rows, device=device),
                      layout_batch([[]] * len(responses), list(responses), pad, device))


def forward_split(model: torch.nn.Module, batch: SplitBatch, **options: Any) -> tuple[Any, Any]:
    """(the prompts' output, the responses' output). The prompts' last position predicts each response's first
    token; the responses run on copies of their prompts' caches, positions continuing after the prompt. With
    gradients on, they flow back through the copies into the one prompt forward. ``options`` go to both
    forwards (e.g. ``output_hidden_states``). Raises :class:`UnsharableCache` (after the first forward) for a
    model whose cache cannot be copied."""
    prompts, rows, answers = batch.prompts, batch.rows, batch.answers
    first = model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                  position_ids=prompts.position_ids, use_cache=True, logits_to_keep=1, **options)
    cache = copy_cache_rows(first.past_key_values, rows)
    rest = model(input_ids=answers.input_ids,
                 attention_mask=torch.cat([prompts.attention_mask[rows], answers.attention_mask], dim=1),
                 position_ids=prompts.position_ids[rows, -1:] + 1 + answers.position_ids, past_key_values=cache,
                 use_cache=True, **options)
    return first, rest
