"""``m2po``: a policy loss that tolerates stale samples by bounding the second moment of the log-ratios.

Seed: M2PO "constrains the second moment
of importance weights; masks only extreme outliers under high staleness".
With ``r = log pi_new - log pi_old`` per token, the tokens with the largest
``|r|`` are masked, one by one, until the mean of ``r**2`` over the remaining
tokens is at most ``tau`` (``algorithm.loss_params: {tau: ...}``; unset, the
clip config's ``clip_ratio ** 2 / 4``: 0.01 for the default 0.2). The
surviving tokens get the unclipped importance-weighted policy gradient
``-A * exp(r)``. A first pass over fresh turns masks nothing (``r = 0``); later
epochs or mini-batches do. The torch backend trains stale turns with decoupled
PPO (``old_log_prob`` is the proximal policy, staleness is a capped weight on the
advantage), so staleness alone does not reach this loss's ratios.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

from pydantic import Field, PositiveFloat

if TYPE_CHECKING:  # the registry lists this loss without importing torch
    import torch


def second_moment_mask(log_ratio: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """``mask`` with the largest-``|log_ratio|`` tokens removed until ``mean(log_ratio**2) <= tau`` over the rest."""
    import torch

    valid = mask.bool()
    squares = (log_ratio.detach() ** 2)[valid]
    order = torch.argsort(squares, descending=True)
    total, count = squares.sum().item(), int(valid.sum().item())
    dropped = 0
    while count - dropped > 0 and total / (count - dropped) > tau:
        total -= squares[order[dropped]].item()
        dropped += 1
    keep = torch.ones_like(squares, dtype=torch.bool)
    keep[order[:dropped]] = False
    out = torch.zeros_like(mask, dtype=torch.bool)
    out[valid] = keep
    return out.to(mask.dtype)


def m2po(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, *,
         tau: Annotated[Optional[PositiveFloat], Field(description="bound (> 0) on the mean squared log-ratio of "
                                                         "the kept tokens; null = clip_ratio ** 2 / 4")] = None):
    import torch

    from unimas.methods import agg_loss

    if tau is None:
        clip = getattr(config, "clip_ratio", 0.2) if config is not None else 0.2
        tau = clip ** 2 / 4
    log_ratio = log_prob - old_log_prob
    kept = second_moment_mask(log_ratio, response_mask, tau=tau)
    per_token = -advantages * torch.exp(log_ratio)
    loss = agg_loss(per_token, kept, loss_agg_mode)
    masked = 1.0 - kept.sum() / response_mask.sum().clamp(min=1)
    ppo_kl = agg_loss(-log_ratio.detach(), response_mask, loss_agg_mode)
    return loss, {"actor/pg_clipfrac": masked.detach(), "actor/ppo_kl": ppo_kl.detach()}
