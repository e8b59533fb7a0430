"""Config features a group's backend cannot serve, refused by the backend's capability flags before any model loads.

Without these checks the run would fail only when the feature is first used:
LoRA adapters when the groups are built, scoring after the first step's
episodes were sampled, a snapshot when the first one is taken. One check per
flag of :class:`unimas.contract.protocols.Backend`; ``can_train`` and
``supports_critic`` are checked with the group's training and critic
(:mod:`unimas.preflight.checks_models`, :mod:`unimas.preflight.checks_algorithm`).
"""

from __future__ import annotations

from typing import Iterator

from unimas.config.schema import ExperimentConfig
from unimas.contract.protocols import Backend, UpdateOrder, capability
from unimas.contract.registry import Registry
from unimas.preflight.checks_algorithm import built_plugin
from unimas.preflight.problems import Problem, registered_backend


def _lacks(config: ExperimentConfig, registry: Registry, group: str, flag: str) -> bool:
    """Whether ``models.<group>`` is declared, its backend registered, and that backend lacks ``flag``."""
    declared = config.models.get(group)
    backend = registered_backend(registry, declared) if declared is not None else None
    return backend is not None and not capability(backend, Backend, flag)


def check_adapters_hosted(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """LoRA on a backend that cannot host adapters (``can_host_adapters``): its build would refuse the group."""
    for name, group in config.models.items():
        if group.lora is not None and _lacks(config, registry, name, "can_host_adapters"):
            yield (f"models.{name}.lora", f"backend '{group.backend}' cannot host LoRA adapters; remove the lora "
                   "section")
    for name, role in config.roles.items():
        if role.adapter and _lacks(config, registry, role.model, "can_host_adapters"):
            yield (f"roles.{name}.adapter", f"backend '{config.models[role.model].backend}' cannot host LoRA "
                   f"adapters; drop the adapter (the role then acts with model group '{role.model}' itself)")


def check_turns_scored(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """An update order that needs probability ratios on a group whose backend cannot score turns
    (``can_score_turns``): the group is asked to score its turns after it updates in a stage. A group its backend
    cannot train at all is refused for that alone (``can_train``)."""
    order = built_plugin(config, registry, "update_order")
    if order is None or not capability(order, UpdateOrder, "needs_ratios"):
        return
    name = config.algorithm.update_order.name
    training = {role.model for role in config.roles.values() if role.trainable}
    for group_name, group in config.models.items():
        trained = group.trainable and group_name in training and not _lacks(config, registry, group_name, "can_train")
        if trained and _lacks(config, registry, group_name, "can_score_turns"):
            yield ("algorithm.update_order", f"'{name}' with these params needs probability ratios, but backend "
                   f"'{group.backend}' of model group '{group_name}' cannot score turns; use an update order "
                   "without ratios, or a backend that scores turns")


def check_weights_saved(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """A snapshot pool on a backend that cannot save weights and load them back (``can_save_weights``): the
    pool copies the weights of ``snapshot.of`` into the snapshot group."""
    for name, group in config.models.items():
        if group.snapshot is None:
            continue
        if _lacks(config, registry, name, "can_save_weights"):
            yield (f"models.{name}.snapshot", f"backend '{group.backend}' cannot load saved weights, so this group "
                   "cannot play snapshots; put it on a backend that saves weights (torch, verl)")
        source = group.snapshot.of
        if _lacks(config, registry, source, "can_save_weights"):
            yield (f"models.{name}.snapshot.of", f"backend '{config.models[source].backend}' of model group "
                   f"'{source}' cannot save its weights, so no snapshot of it can be taken; snapshot a group of a "
                   "backend that saves weights (torch, verl)")
