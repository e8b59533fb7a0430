"""Ids past the tokenizer: banned alike where a verl group samples and where it trains, so both use one distribution.

A model's output layer often has more rows than its tokenizer has ids
(Qwen2-0.5B: 151,936 rows for 151,665 ids). A sampled id past the tokenizer
is a token no text can hold. verl's vLLM servers never sample one: verl's
worker extension (which unimas's inherits) sets every logit from
``len(tokenizer)`` on to -inf at start-up, so vLLM's log-probs are a softmax
over the tokenizer's ids. verl's trainer, as published, takes its softmax
over every row, and unimas's ``hf`` rollout sampled from every row. A
random-init model gives those rows real probability: on the tiny check shape
(64 rows, a 44-id tokenizer) vLLM's log-probs and the trainer's differed by
0.43 nats (issue 42); a trained model gives them little, but the policy
trained would still not be the one sampled from.

So a verl group bans them on every side, as the torch backend does
(``Policy._special_token_bias``): the trainer's actor and reference engines
(:func:`ban_ids_past_tokenizer`, a forward hook on the output layer) and the
``hf`` rollout (:func:`past_tokenizer_bias`, added to its logits in sampling
and in scoring); vLLM's servers already do.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

BANNED_LOGIT = -1e9
"""The logit of a banned id. Finite, as the torch backend's: ``exp(-1e9 - max)`` is exactly 0 in float32 and
bfloat16, so log-probs equal those of vLLM's -inf mask, while entropies stay finite (0 * -1e9 = 0, 0 * -inf is nan)."""


def tokenizer_size(model_config: Any) -> int:
    """The ids verl's vLLM servers keep: ``len`` of the tokenizer verl's model config loaded (added tokens too)."""
    return len(model_config.tokenizer)


def past_tokenizer_bias(rows: int, size: int, device: torch.device) -> torch.Tensor:
    """A logit bias over ``rows`` output rows: 0 on the tokenizer's ``size`` ids, :data:`BANNED_LOGIT` past them."""
    bias = torch.zeros(rows, device=device)
    bias[size:] = BANNED_LOGIT
    return bias


def ban_ids_past_tokenizer(engine: Optional[Any]) -> None:
    """Make a verl language-model engine's logits ban the ids past its tokenizer (every forward: log-probs,
    entropy and the loss's gradient); a no-op for no engine or where the tokenizer covers every row.

    The hook sits on the output layer, whose output is the logits verl's engine
    turns into log-probs, so no verl code is replaced; it survives weight loads
    (they replace tensors, not modules).
    """
    if engine is None:
        return
    head = engine.module.get_output_embeddings()
    rows, size = head.weight.shape[0], tokenizer_size(engine.model_config)
    if size >= rows:
        return

    def banned(_module: torch.nn.Module, _inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        past = torch.arange(rows, device=logits.device) >= size
        return logits.masked_fill(past, BANNED_LOGIT)

    head.register_forward_hook(banned)
