"""AdamW and the learning-rate schedule over a run's update calls.

The schedule advances once per ``update()`` call (one trainer step), not per
optimiser step, so ``trainer.steps`` is its horizon whatever the mini-batch
and epoch settings. Shape, as a factor on ``optim.lr`` for the ``u``-th update
(counting from 0)::

    warm-up   u < W:   (u + 1) / (W + 1)             rises linearly, never 0
    decay     u >= W:  min + (1 - min) * shape(p)    p = (u - W) / (T - W), capped at 1

with ``shape`` = 1 (constant), ``1 - p`` (linear) or ``(1 + cos(pi p)) / 2``
(cosine). The factor reaches ``min_lr_ratio`` once ``T`` updates are done.
When the horizon is unknown or no longer than the warm-up (``T <= W``)
there is no decay. A constant schedule without warm-up multiplies by exactly
1.0, which leaves the optimiser bit-identical to having no scheduler.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch

from unimas.config.schema import OptimConfig


def build_optimizer(params: list[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW with its multi-tensor (``foreach``) step everywhere: torch picks it by itself only on CUDA, and
    on CPU the per-tensor loop cost 0.83 ms against 0.61 ms for a tiny 27-tensor Qwen2, with the same weights
    to the bit after 50 steps."""
    return torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay,
                             foreach=True)


def lr_factor(optim: OptimConfig, horizon: int) -> Callable[[int], float]:
    """The multiplier on ``optim.lr`` for the ``u``-th update call (see the module docstring)."""
    warmup, floor = optim.warmup_steps, optim.min_lr_ratio
    decay_steps = horizon - warmup

    def factor(update: int) -> float:
        if update < warmup:
            return (update + 1) / (warmup + 1)
        if optim.schedule == "constant" or decay_steps <= 0:
            return 1.0
        progress = min(1.0, (update - warmup) / decay_steps)
        shape = 1.0 - progress if optim.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return floor + (1.0 - floor) * shape

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig,
                    horizon: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` whose factor is a plain function, so its state dict holds only counters
    (a resumed run follows the schedule in its current config)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(optim, horizon))


def advance(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """One schedule step per update call, even one that had no turns to train on."""
    with warnings.catch_warnings():
        # An update with no turns steps the schedule without an optimiser step; that is intended.
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
        scheduler.step()


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def apply_config(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                 optim: OptimConfig) -> None:
    """Set rate, betas and weight decay from the config in force (a loaded state dict carries the saved ones),
    the rate at the schedule's current position: the same value an uninterrupted run has when unchanged."""
    scheduler.base_lrs = [optim.lr] * len(optimizer.param_groups)
    for params, factor in zip(optimizer.param_groups, scheduler.lr_lambdas):
        params.update(initial_lr=optim.lr, lr=optim.lr * factor(scheduler.last_epoch),
                      betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    scheduler._last_lr = [params["lr"] for params in optimizer.param_groups]
