"""The one place unimas touches verl: its pure-tensor RL maths.

unimas reuses verl's ``core_algos`` (policy losses, loss aggregation, KL
estimators, advantage estimators) so that a loss or estimator name means the
same thing here as in a verl run. ``import verl`` costs seconds and pulls in
ray and tensordict, so every import below is inside a function: importing
unimas stays fast, and code paths that never train never pay for verl.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Union

import numpy as np
import torch


def _core_algos():
    from verl.trainer.ppo import core_algos

    return core_algos


@functools.lru_cache(maxsize=64)
def _actor_config(clip_ratio: float, clip_ratio_low: float, clip_ratio_high: float, loss_agg_mode: str):
    """A real verl ActorConfig: gspo/sapo/cispo assert the type, so a dict will not do.

    ``strategy``/``rollout_n``/micro-batch are required by its validation but
    unused by the loss functions. ``global_batch_info`` stays empty: unimas
    computes each loss over a whole mini-batch in one call, so local
    normalisation is the global one.
    """
    from verl.workers.config import ActorConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_ratio,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        loss_agg_mode=loss_agg_mode,
    )


def policy_loss(
    name: str,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's registered policy loss ``name`` on (batch, response_len) tensors.

    Returns the scalar loss and verl's metrics with the ``actor/`` prefix
    stripped (e.g. ``pg_clipfrac``, ``ppo_kl``). Unknown names raise
    ``ValueError`` listing the registered ones.
    """
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    config = _actor_config(float(clip_ratio), float(low), float(high), loss_agg_mode)
    fn = _core_algos().get_policy_loss_fn(name)
    loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=loss_agg_mode, config=config)
    return loss, {key.removeprefix("actor/"): _to_float(value) for key, value in metrics.items()}


def _to_float(value: Any) -> float:
    return float(value.detach().item()) if isinstance(value, torch.Tensor) else float(value)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a (batch, response_len) loss matrix to a scalar exactly as verl does."""
    return _core_algos().agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate (``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``, ``+`` suffix)."""
    try:
        return _core_algos().kl_penalty(logprob, ref_logprob, kind)
    except NotImplementedError:
        raise ValueError(f"unsupported kl_type '{kind}'; use kl, k1, abs, mse, k2, low_var_kl or k3") from None


def policy_loss_names() -> list[str]:
    return sorted(_core_algos().POLICY_LOSS_REGISTRY)


def estimator_names() -> list[str]:
    return sorted(_core_algos().ADV_ESTIMATOR_REGISTRY)


def advantage_estimator(name: str) -> Callable[..., Any]:
    """verl's registered advantage estimator; ``KeyError`` naming the options if unknown."""
    registry = _core_algos().ADV_ESTIMATOR_REGISTRY
    if name not in registry:
        raise KeyError(f"unknown advantage estimator '{name}'; verl has: {', '.join(sorted(registry))}")
    return registry[name]


@functools.lru_cache(maxsize=16)
def _algo_config(gamma: float, norm_by_std: bool):
    from verl.trainer.config import AlgoConfig

    return AlgoConfig(gamma=gamma, norm_adv_by_std_in_grpo=norm_by_std)


def compute_estimator(
    estimator: Union[str, Callable[..., Any]],
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    norm_by_std: bool = True,
    gamma: float = 1.0,
) -> torch.Tensor:
    """Run a verl-signature estimator and return its advantages (same shape as the rewards).

    Estimators differ in which keywords they take (``index``,
    ``norm_adv_by_std_in_grpo``, ``config``), so only the ones the signature
    names are passed; ``config`` is a verl ``AlgoConfig`` carrying ``gamma``
    and ``norm_adv_by_std_in_grpo``. Estimators that need inputs unimas does
    not have (``gae``: values, ``remax``: reward baselines, the optimal-token
    baselines: per-token policy statistics) raise ``ValueError``.
    """
    name = estimator if isinstance(estimator, str) else getattr(estimator, "__name__", repr(estimator))
    fn = advantage_estimator(estimator) if isinstance(estimator, str) else estimator
    available = {
        "token_level_rewards": token_level_rewards,
        "response_mask": response_mask,
        "index": index,
        "norm_adv_by_std_in_grpo": norm_by_std,
        "config": _algo_config(float(gamma), bool(norm_by_std)),
    }
    params = inspect.signature(fn).parameters
    kwargs = {key: value for key, value in available.items() if key in params}
    missing = [
        key
        for key, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and key not in kwargs
    ]
    if missing:
        raise ValueError(f"advantage estimator '{name}' needs {', '.join(missing)}, which unimas does not provide")
    advantages, _returns = fn(**kwargs)
    return advantages
