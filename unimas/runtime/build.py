"""From the mapping to model groups: which backend, options, adapters, seed and update settings."""

from __future__ import annotations

import zlib

from pydantic import ValidationError

from unimas.algorithms import estimators, losses
from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import Registry
from unimas.errors import UserError
from unimas.groups.base import GroupSpec, ModelGroup


def adapters_of(config: ExperimentConfig, group: str) -> list[str]:
    return sorted({r.adapter for r in config.roles.values() if r.model == group and r.adapter})


def group_seed(seed: int, group: str) -> int:
    """Per-group seed that does not depend on how many other groups exist."""
    return (seed * 1_000_003 + zlib.crc32(group.encode())) % 2**31


def backend_options(config: ExperimentConfig, registry: Registry, name: str):
    """``models.<name>.options`` validated by the group's backend; errors name each option."""
    group = config.models[name]
    backend = registry.get("backends", group.backend, where=f"models.{name}.backend")
    try:
        return backend.options.model_validate(group.options)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = "unknown option (check spelling)" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"  models.{name}.options{'.' + loc if loc else ''}: {msg}")
        raise UserError(f"invalid options for backend '{group.backend}':\n" + "\n".join(lines)) from None


def group_spec(config: ExperimentConfig, registry: Registry, name: str) -> GroupSpec:
    algorithm = config.algorithm_for(name)
    group = config.models[name]
    params_where = (f"models.{name}.algorithm.loss_params" if group.algorithm.loss_params is not None
                    else "algorithm.loss_params")
    policy_loss = (losses.resolve_policy_loss(algorithm.loss, registry, where=f"models.{name}.algorithm.loss",
                                                  params=algorithm.loss_params, params_where=params_where)
                   if group.trainable else None)
    estimator = (estimators.resolve_estimator(config.algorithm.estimator, registry, config.algorithm.estimator_params)
                 if group.trainable and group.critic is not None else None)
    return GroupSpec(name=name, config=group, options=backend_options(config, registry, name),
                     adapters=adapters_of(config, name), seed=group_seed(config.trainer.seed, name),
                     algorithm=algorithm, policy_loss=policy_loss, estimator=estimator,
                     total_updates=config.trainer.steps,
                     role_objectives=losses.role_objectives(config.roles, name))


def build_group(config: ExperimentConfig, registry: Registry, name: str) -> ModelGroup:
    backend = registry.get("backends", config.models[name].backend, where=f"models.{name}.backend")
    return backend.build(group_spec(config, registry, name))
