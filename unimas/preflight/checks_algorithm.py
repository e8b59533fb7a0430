"""Checks of ``algorithm``: its plugins and their params, the loss params, the estimator and the critics it needs."""

from __future__ import annotations

from typing import Any, Iterator

from unimas.algorithms.estimators import Estimator
from unimas.algorithms.estimators import estimators as known_estimators
from unimas.algorithms.losses import policy_losses as known_policy_losses
from unimas.config.schema import ExperimentConfig
from unimas.contract.protocols import (Backend, CreditShaper, ReplayBuffer, RolloutControl, UpdateOrder, capability,
                                       declares)
from unimas.contract.registry import Registry, singular
from unimas.preflight import references
from unimas.preflight.problems import Problem, params_problems, registered_backend
from unimas.training import central_critic

ALGORITHM_PLUGINS = {"rollout": "rollout_controls", "replay": "replay_buffers", "update_order": "update_orders",
                     "credit": "credit_shapers"}
"""``algorithm.<field>`` -> the registry kind its ``name`` must be registered under."""
ALGORITHM_PROTOCOLS: dict[str, type] = {"rollout": RolloutControl, "replay": ReplayBuffer, "update_order": UpdateOrder,
                                        "credit": CreditShaper}
"""``algorithm.<field>`` -> the protocol its plugin follows, which declares the capability flags it may set."""


def forks_episodes(field: str, factory: Any) -> bool:
    """Whether the ``algorithm.<field>`` plugin made by ``factory`` forks recorded episodes (its declared flag)."""
    protocol = ALGORITHM_PROTOCOLS[field]
    return declares(protocol, "uses_forks") and capability(factory, protocol, "uses_forks")


def takes_values(config: ExperimentConfig, registry: Registry) -> bool:
    """Whether the run's estimator reads a critic's values (``gae``)."""
    estimator = known_estimators(registry).get(config.algorithm.estimator)
    return estimator is not None and estimator.needs_critic


def built_plugin(config: ExperimentConfig, registry: Registry, field: str) -> Any | None:
    """The ``algorithm.<field>`` plugin as the run builds it, to read the flags its params decide; None when the
    field is unset, or its name or params are wrong (reported by :func:`check_algorithm_plugins`)."""
    entry = getattr(config.algorithm, field)
    kind = ALGORITHM_PLUGINS[field]
    if entry is None or not registry.has(kind, entry.name):
        return None
    factory = registry.get(kind, entry.name)
    if params_problems(factory, entry.name, entry.params, f"algorithm.{field}.params"):
        return None
    return factory(**entry.params)


def check_algorithm_plugins(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """Each ``algorithm.<key>``: a registered name, params its factory accepts, no fork of an agent program."""
    for field, kind in ALGORITHM_PLUGINS.items():
        entry = getattr(config.algorithm, field)
        if entry is None:
            continue
        if not registry.has(kind, entry.name):
            yield (f"algorithm.{field}.name", f"unknown {singular(kind)} '{entry.name}'; "
                   f"registered: {', '.join(registry.names(kind)) or 'none'}{registry.broken_hint()}")
            continue
        factory = registry.get(kind, entry.name)
        wrong_params = params_problems(factory, entry.name, entry.params, f"algorithm.{field}.params")
        yield from wrong_params
        if field == "update_order" and not wrong_params and takes_values(config, registry) \
                and capability(factory(**entry.params), UpdateOrder, "rescales_advantages"):
            yield ("algorithm.update_order.params", f"'{entry.name}' with these params rescales each turn's "
                   f"advantage, but algorithm.estimator '{config.algorithm.estimator}' computes per-token advantages "
                   "from a critic inside the update, which the rescaling would not reach; drop the params that "
                   "rescale, or use an estimator without values")
        if config.workflow.agent is not None and forks_episodes(field, factory):
            yield (f"algorithm.{field}.name", f"'{entry.name}' forks recorded episodes, which is not supported for "
                   "a workflow.agent program (its requests carry no turn ids to replay; docs/algorithms.md); use a "
                   "rollout control that does not fork")


def check_loss_params(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """Each trainable group's ``loss_params`` against its policy loss (groups that share them: reported once)."""
    losses = known_policy_losses(registry)
    problems: list[Problem] = []
    for name, group in config.models.items():
        algorithm = config.algorithm_for(name)
        if not group.trainable or algorithm.loss not in losses:
            continue
        where = (f"models.{name}.algorithm.loss_params" if group.algorithm.loss_params is not None
                 else "algorithm.loss_params")
        for problem in params_problems(losses[algorithm.loss], algorithm.loss, algorithm.loss_params or {}, where,
                                       keyword_only=True):
            if problem not in problems:
                problems.append(problem)
    return problems


def check_critic_paths(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """``models.<g>.critic.path`` that is no local model dir (:mod:`unimas.preflight.references`)."""
    return references.critic_path_problems(config)


def check_credit_channels(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """Credit-shaper channels no reward writes (:mod:`unimas.preflight.references`)."""
    return references.credit_channel_problems(config)


def _estimator(config: ExperimentConfig, registry: Registry) -> Estimator | None:
    return known_estimators(registry).get(config.algorithm.estimator)


def check_estimator(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """``algorithm.estimator``: known, fed with the inputs unimas produces, with groups to normalise within."""
    algorithm = config.algorithm
    estimators = known_estimators(registry)
    estimator = estimators.get(algorithm.estimator)
    if estimator is None:
        yield ("algorithm.estimator", f"unknown estimator '{algorithm.estimator}'; known: "
               f"{', '.join(sorted(estimators))}{registry.broken_hint()}")
    elif estimator.usable_with_critic:
        return  # its critics: check_critics_for_values and check_central_critic
    elif not estimator.usable:
        needs = "a critic (value estimates)" if estimator.needs_critic else ", ".join(estimator.missing_inputs)
        usable = ", ".join(sorted(name for name, e in estimators.items() if e.usable))
        yield ("algorithm.estimator", f"'{algorithm.estimator}' needs {needs}, which unimas does not produce; use "
               f"one of {usable} or a plugin estimator")
    elif estimator.group_normalised and algorithm.group_size < 2:
        yield ("algorithm.group_size", f"'{algorithm.estimator}' normalises within groups; group_size must be >= 2")


def check_critics_for_values(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """An estimator that takes values, with per-group critics: a critic on every group that trains roles, each on
    a backend with critics (docs/critic.md)."""
    estimator = _estimator(config, registry)
    if estimator is None or not estimator.usable_with_critic or config.algorithm.critic != "per_group":
        return []
    return _critic_problems(config, registry, needs_values=True)


def check_estimator_params(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """``algorithm.estimator_params`` against the keyword arguments the estimator takes."""
    algorithm = config.algorithm
    estimator = _estimator(config, registry)
    if estimator is None:
        return []
    return params_problems(estimator.fn, algorithm.estimator, algorithm.estimator_params,
                           "algorithm.estimator_params", keyword_only=True)


def check_critics_without_values(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """An estimator that takes no values: a critic section anywhere would train for nothing."""
    estimator = _estimator(config, registry)
    if estimator is None or estimator.needs_critic:
        return []
    return _critic_problems(config, registry, needs_values=False)


def check_central_critic(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """``algorithm.critic`` / ``central_critic`` against the groups and the estimator
    (:func:`unimas.training.central_critic.config_problems`)."""
    estimator = _estimator(config, registry)
    if estimator is None:
        return []
    return central_critic.config_problems(config, registry, takes_values=estimator.needs_critic)


def _critic_problems(config: ExperimentConfig, registry: Registry, needs_values: bool) -> list[Problem]:
    """``models.<g>.critic``: on every group that trains roles when the estimator takes values (gae), on a
    trainable group of a backend that has critics, and nowhere else (docs/critic.md)."""
    problems: list[Problem] = []
    estimator = config.algorithm.estimator
    trains_roles = {role.model for role in config.roles.values() if role.trainable}
    for name, group in config.models.items():
        where = f"models.{name}.critic"
        backend = registered_backend(registry, group)
        if group.critic is None:
            if needs_values and group.trainable and name in trains_roles:
                problems.append((where, f"algorithm.estimator '{estimator}' needs value estimates: give this "
                                 "trainable group a critic (e.g. critic: {optim: {lr: 0.001}}; docs/critic.md), or "
                                 "use one centralized critic group (algorithm.critic: centralized), or an "
                                 "estimator without values (grpo, rloo, ...)"))
        elif not group.trainable:
            problems.append((where, "a frozen group (trainable: false) trains nothing, so a critic would have no "
                             "turns to learn values of; remove it"))
        elif not needs_values:
            problems.append((where, f"algorithm.estimator '{estimator}' takes no values, so this critic would "
                             "train for nothing; use estimator: gae, or remove the critic"))
        elif backend is not None and not capability(backend, Backend, "supports_critic"):
            problems.append((where, f"backend '{group.backend}' has no critic (only the torch and verl backends do)"))
    return problems
