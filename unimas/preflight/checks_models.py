"""Checks of each model group (``models.<group>``): its backend, options, training, policy loss and snapshot pool.

:func:`check_model_groups` runs :data:`GROUP_CHECKS` on one group after the
other, so a group's problems are listed together, in the config's order.
"""

from __future__ import annotations

from typing import Iterator

from unimas.algorithms.losses import policy_losses as known_policy_losses
from unimas.config.schema import ExperimentConfig
from unimas.contract.protocols import Backend, capability
from unimas.contract.registry import Registry
from unimas.errors import UserError
from unimas.groups.verl import preflight as verl_preflight
from unimas.preflight.problems import EntryCheck, Problem
from unimas.runtime.build import backend_options


def unknown_backend(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """A backend name nothing registered: every other check of the group asks that backend, so they are skipped."""
    group = config.models[name]
    if not registry.has("backends", group.backend):
        yield (f"models.{name}.backend", f"unknown backend '{group.backend}'; registered: "
               f"{', '.join(registry.names('backends'))}{registry.broken_hint()}")


def invalid_options(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """``models.<group>.options`` its backend's options model refuses (each wrong option named)."""
    try:
        backend_options(config, registry, name)
    except UserError as exc:
        yield (f"models.{name}.options", str(exc))


def trained_on_generating_backend(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """A trainable group on a backend that only generates (``can_train`` False): its update would fail."""
    group = config.models[name]
    if group.trainable and not capability(registry.get("backends", group.backend), Backend, "can_train"):
        yield (f"models.{name}.trainable", f"backend '{group.backend}' only generates; set trainable: false")


def unknown_policy_loss(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """A trainable group whose policy loss (its own or ``algorithm.loss``) is neither a plugin's nor verl's."""
    group = config.models[name]
    losses = known_policy_losses(registry)
    loss = config.algorithm_for(name).loss
    if group.trainable and loss not in losses:
        where = f"models.{name}.algorithm.loss" if group.algorithm.loss else "algorithm.loss"
        yield (where, f"unknown policy loss '{loss}'; known: {', '.join(sorted(losses))}{registry.broken_hint()}")


MODEL_SOURCE_OPTIONS = ("path", "tiny", "init_from")
"""The options that say which model a group loads, named alike by the torch and verl backends."""


def snapshot_pool(config: ExperimentConfig, registry: Registry, name: str) -> list[Problem]:
    """A snapshot group is a frozen copy of a trainable group that loads the same model: its options, or on
    another backend (a torch group playing a verl learner's snapshots) the same model source."""
    group = config.models[name]
    if group.snapshot is None:
        return []
    where = f"models.{name}.snapshot.of"
    source = config.models.get(group.snapshot.of)
    if source is None:
        return [(where, f"model group '{group.snapshot.of}' is not declared under 'models' "
                 f"(declared: {', '.join(config.models)})")]
    problems = []
    if group.trainable:
        problems.append((f"models.{name}.trainable", "a snapshot group only plays earlier weights of "
                         f"'{group.snapshot.of}'; set trainable: false"))
    if not source.trainable or source.snapshot is not None:
        problems.append((where, f"'{group.snapshot.of}' must be a trainable group (snapshots of it are played)"))
    if group.backend == source.backend and group.options != source.options:
        problems.append((f"models.{name}.options", f"a snapshot group must load the same model as "
                         f"'{group.snapshot.of}': copy its options"))
    elif group.backend != source.backend and _model_source(group.options) != _model_source(source.options):
        problems.append((f"models.{name}.options", f"a snapshot group must load the same model as "
                         f"'{group.snapshot.of}': copy its {', '.join(MODEL_SOURCE_OPTIONS)} options"))
    if group.lora is not None or source.lora is not None:
        problems.append((f"models.{name}.lora", "snapshot pools of LoRA groups are not supported: snapshot a "
                         "group that trains its full weights"))
    return problems


def _model_source(options: dict) -> dict:
    return {key: options.get(key) for key in MODEL_SOURCE_OPTIONS}


GROUP_CHECKS: tuple[EntryCheck, ...] = (invalid_options, trained_on_generating_backend, unknown_policy_loss,
                                        snapshot_pool)
"""What :func:`check_model_groups` checks on each group whose backend is registered, in this order."""


def check_model_groups(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """Each ``models.<group>``: an unknown backend alone, else every one of :data:`GROUP_CHECKS`."""
    for name in config.models:
        unknown = list(unknown_backend(config, registry, name))
        yield from unknown or (problem for check in GROUP_CHECKS for problem in check(config, registry, name))


def check_verl_groups(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """verl groups' settings and mixes the verl backend cannot run (:mod:`unimas.groups.verl.preflight`)."""
    return verl_preflight.config_problems(config)
