"""Policy losses by name, and the one loss every backend optimises.

The table holds plugins' losses first, then verl's ``POLICY_LOSS_REGISTRY``
(verl's ``PolicyLossFn`` signature); a loss may take keyword-only parameters
set with ``algorithm.loss_params`` (or a role's), bound when it is resolved.

:func:`compose_loss` is the whole objective (nanoGPT-style, in one place)::

    loss = policy_loss - entropy_coef * entropy + kl_coef * KL(policy || reference)

Per-role settings (``roles.<role>.entropy_coef`` and ``loss_weight``) reach it as
per-token coefficients (:func:`token_coefficients`), so a shared model or a
LoRA base can explore more for one role than for another, in every backend.

Every backend calls it (the torch and verl backends), so they all optimise
the same thing. verl is imported inside functions (``import verl`` costs
seconds; ``unimas validate`` never trains); torch only for type hints.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from unimas.algorithms import verl_catalog
from unimas.config import plugin_params
from unimas.config.schema import AlgorithmConfig
from unimas.errors import UserError

if TYPE_CHECKING:
    import torch

    from unimas.algorithms.estimators import PluginTable


def _core_algos():
    from verl.trainer.ppo import core_algos

    return core_algos


def policy_losses(registry: "PluginTable") -> dict[str, Callable[..., Any]]:
    """Every policy loss by name: plugins first, then verl's ``POLICY_LOSS_REGISTRY``."""
    table: dict[str, Callable[..., Any]] = dict(verl_catalog.functions("policy_losses"))
    table.update({name: registry.get("policy_losses", name) for name in registry.names("policy_losses")})
    return table


def resolve_policy_loss(name: str, registry: "PluginTable", where: str = "algorithm.loss",
                        params: dict[str, Any] | None = None,
                        params_where: str = "algorithm.loss_params") -> Callable[..., Any]:
    """The policy loss ``name`` with its checked ``loss_params`` bound."""
    table = policy_losses(registry)
    if name not in table:
        raise UserError(f"unknown policy loss '{name}'. Known: {', '.join(sorted(table))}", where=where)
    kwargs = plugin_params.bind(table[name], name, params or {}, params_where, keyword_only=True)
    return functools.partial(table[name], **kwargs) if kwargs else table[name]


@functools.lru_cache(maxsize=64)
def actor_config(clip_ratio: float, clip_ratio_low: float, clip_ratio_high: float, loss_agg_mode: str):
    """A real verl ``ActorConfig`` for the loss functions (gspo/sapo/cispo assert its type).

    ``strategy``/``rollout_n``/micro-batch are required by its validation but
    unused by the losses. ``global_batch_info`` stays empty: each loss is
    computed over a whole mini-batch in one call, so local normalisation is
    the global one.
    """
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=clip_ratio,
                       clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, loss_agg_mode=loss_agg_mode)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a (turns, tokens) matrix to a scalar exactly as verl does."""
    return _core_algos().agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate (``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``, ``+`` suffix)."""
    try:
        return _core_algos().kl_penalty(log_prob, ref_log_prob, kind)
    except NotImplementedError:
        raise ValueError(f"unsupported kl_type '{kind}'; use kl, k1, abs, mse, k2, low_var_kl or k3") from None


@dataclass(frozen=True)
class RoleObjective:
    """A role's own terms in its group's loss (``roles.<role>.entropy_coef`` / ``loss_weight``)."""

    entropy_coef: float | None = None
    """Entropy bonus on the role's tokens; None: the group's ``algorithm.entropy_coef``."""
    loss_weight: float = 1.0
    """Multiplier of the role's tokens in every term of the loss."""


def role_objectives(roles: dict[str, Any], group: str) -> dict[str, RoleObjective]:
    """The roles on ``group`` (``RoleConfig`` by name) that set their own terms; empty: the group's loss as is."""
    return {name: RoleObjective(entropy_coef=role.entropy_coef, loss_weight=role.loss_weight)
            for name, role in roles.items()
            if role.model == group and (role.entropy_coef is not None or role.loss_weight != 1.0)}


def token_coefficients(objectives: dict[str, RoleObjective], roles: list[str], settings: AlgorithmConfig,
                       like: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(loss weight, entropy coefficient) of each row, (rows, 1) with the dtype and device of ``like`` (a
    floating tensor), for :func:`compose_loss`.

    ``roles`` names each row's role. (None, None) when no row's role sets its own terms, so a config
    without per-role settings computes exactly the loss it always did.
    """
    if not objectives or not any(role in objectives for role in roles):
        return None, None
    default = RoleObjective()
    chosen = [objectives.get(role, default) for role in roles]
    weight = like.new_tensor([[o.loss_weight] for o in chosen])
    coef = like.new_tensor([[settings.entropy_coef if o.entropy_coef is None else o.entropy_coef] for o in chosen])
    return weight, coef


def role_entropy(entropy: torch.Tensor, response_mask: torch.Tensor, roles: list[str]) -> dict[str, float]:
    """``role/<role>/entropy``: the mean token entropy (nats) of each role's rows, (turns, tokens) tensors.

    A backend reports it from the entropies it computes for the loss anyway: on the first update pass they
    are the sampling distribution's (same weights, each turn's temperature), which is what shows a role
    that stopped exploring (``logging.entropy_warning``).
    """
    rows: dict[str, list[int]] = {}
    for i, role in enumerate(roles):
        if role:
            rows.setdefault(role, []).append(i)
    values = entropy.detach() * response_mask
    out = {}
    for role, index in rows.items():
        tokens = response_mask[index].sum()
        if float(tokens) > 0:
            out[f"role/{role}/entropy"] = float(values[index].sum() / tokens)
    return out


def _to_float(value: Any) -> float:
    return float(value.detach().item()) if hasattr(value, "detach") else float(value)  # a tensor, or a number


def compose_loss(
    policy_loss: Callable[..., Any],
    settings: AlgorithmConfig,
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    entropy: torch.Tensor,
    ref_log_prob: torch.Tensor | None = None,
    token_weight: torch.Tensor | None = None,
    entropy_coef: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar every backend minimises, and its parts as metrics. All tensors are (turns, tokens).

    ``entropy`` only needs a gradient when an entropy coefficient is > 0;
    ``ref_log_prob`` is required when ``settings.kl_coef > 0``.

    ``token_weight`` and ``entropy_coef`` (broadcastable to (turns, tokens); :func:`token_coefficients`)
    are the per-role terms: a token's weight multiplies its policy, entropy and KL terms, and its entropy
    coefficient replaces ``settings.entropy_coef``. The weight enters the policy loss through the
    advantage (a positive factor on it is a factor on the token's loss for every loss that is
    positively homogeneous in the advantage: PPO clip, dual clip, gspo, gpg), so any registered loss
    takes it without a new argument. The ``entropy`` metric stays the plain token entropy.
    """
    mode = settings.loss_agg_mode
    low = settings.clip_ratio if settings.clip_ratio_low is None else settings.clip_ratio_low
    high = settings.clip_ratio if settings.clip_ratio_high is None else settings.clip_ratio_high
    config = actor_config(float(settings.clip_ratio), float(low), float(high), mode)
    weighted = advantages if token_weight is None else advantages * token_weight
    pg_loss, pg_metrics = policy_loss(old_log_prob, log_prob, weighted, response_mask, loss_agg_mode=mode,
                                      config=config)
    if token_weight is None and entropy_coef is None:
        entropy_value = agg_loss(entropy, response_mask, mode)
        loss = pg_loss - settings.entropy_coef * entropy_value if settings.entropy_coef > 0 else pg_loss
    else:  # per-token coefficients: the bonus is aggregated like the plain entropy (agg_loss is linear in it)
        coef = settings.entropy_coef if entropy_coef is None else entropy_coef
        scale = coef if token_weight is None else coef * token_weight
        loss = pg_loss - agg_loss(entropy * scale, response_mask, mode)
        entropy_value = agg_loss(entropy.detach(), response_mask, mode)
    kl_value = loss.new_zeros(())
    if settings.kl_coef > 0:
        if ref_log_prob is None:
            raise ValueError("kl_coef > 0 needs reference log-probs")
        kl_tokens = kl_penalty(log_prob, ref_log_prob, settings.kl_type)
        kl_value = agg_loss(kl_tokens, response_mask, mode)
        if token_weight is None:
            loss = loss + settings.kl_coef * kl_value
        else:
            loss = loss + settings.kl_coef * agg_loss(kl_tokens * token_weight, response_mask, mode)
    pg = {key.removeprefix("actor/"): _to_float(value) for key, value in pg_metrics.items()}
    return loss, {"policy_loss": _to_float(pg_loss), "entropy": _to_float(entropy_value),
                  "kl": _to_float(kl_value), "clip_frac": pg.get("pg_clipfrac", 0.0), "ppo_kl": pg.get("ppo_kl", 0.0)}


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor,
               value_clip: float, loss_agg_mode: str = "token-mean") -> tuple[torch.Tensor, float]:
    """verl's clipped value loss (``core_algos.compute_value_loss``) and the share of tokens it clipped."""
    loss, clip_frac = _core_algos().compute_value_loss(vpreds=values, returns=returns, values=old_values,
                                                       response_mask=response_mask, cliprange_value=value_clip,
                                                       loss_agg_mode=loss_agg_mode)
    return loss, _to_float(clip_frac)
