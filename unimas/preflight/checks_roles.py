"""Checks of each role (``roles.<role>``): its generation lengths, model group, adapter, training, templates, parser.

:func:`check_roles` runs the checks on one role after the other, so a role's
problems are listed together, in the config's order.
"""

from __future__ import annotations

from typing import Iterator

from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import Registry
from unimas.preflight.problems import EntryCheck, Problem, group_options
from unimas.preflight.role_settings import role_objective_problems
from unimas.training.experiment import make_parser
from unimas.workflow.templates import template_fields


def generation_beyond_positions(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """``max_new_tokens`` that fill the group's positions: the prompt would have no room left."""
    role = config.roles[name]
    limit = getattr(group_options(config, registry, role.model), "max_positions", None)
    for key in ("generation", "eval_generation"):
        generation = getattr(role, key)
        if limit is not None and generation is not None and generation.max_new_tokens >= limit:
            yield (f"roles.{name}.{key}.max_new_tokens", f"{generation.max_new_tokens} new tokens leave no room for "
                   f"the prompt in model group '{role.model}' ({limit} positions); lower it below {limit} or raise "
                   f"models.{role.model}.options.tiny.max_positions")


def undeclared_model(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """A role on a model group ``models`` lacks: the checks of :data:`ROLE_CHECKS` read that group, so they are
    skipped."""
    role = config.roles[name]
    if role.model not in config.models:
        yield (f"roles.{name}.model", f"model group '{role.model}' is not declared under 'models' "
               f"(declared: {', '.join(config.models)})")


def adapter_without_lora(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """A LoRA adapter on a group without a ``lora`` section, which says how adapters are made."""
    role = config.roles[name]
    if role.adapter and config.models[role.model].lora is None:
        yield (f"roles.{name}.adapter", f"role uses LoRA adapter '{role.adapter}' but model group '{role.model}' has "
               "no 'lora' section; add models.{0}.lora: {{r: 8}} or drop the adapter".format(role.model))


def trained_without_adapter(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """A trainable role without an adapter on a group that trains adapters only: it would train nothing."""
    role = config.roles[name]
    group = config.models[role.model]
    if (group.lora is not None and not role.adapter and role.trainable and group.trainable
            and not group.lora.train_base):
        yield (f"roles.{name}.adapter", f"model group '{role.model}' trains LoRA adapters only, and this role has "
               f"none, so it would train nothing; give it one (adapter: {name}), or set trainable: false to act "
               "with the frozen base, or lora.train_base: true")


def trainable_on_frozen_group(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """An explicit ``trainable: true`` on a role of a frozen group, which trains nothing."""
    role = config.roles[name]
    if role.trainable and not config.models[role.model].trainable:
        yield (f"roles.{name}.trainable", f"roles.{name}.trainable: true conflicts with models.{role.model}.trainable: "
               f"false (a frozen group trains nothing); drop roles.{name}.trainable (the roles of a frozen group "
               f"are frozen) or set models.{role.model}.trainable: true")


def unreadable_templates(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """``system`` or ``template`` that is no valid format string (no template at all: an agent role)."""
    role = config.roles[name]
    for attr in ("system", "template"):
        try:
            template_fields(getattr(role, attr) or "")
        except ValueError as exc:
            yield (f"roles.{name}.{attr}", str(exc))


def unbuildable_parser(config: ExperimentConfig, registry: Registry, name: str) -> Iterator[Problem]:
    """A ``parser`` that is not registered or whose params its factory refuses."""
    role = config.roles[name]
    if role.parser is not None:
        try:
            make_parser(registry, role.parser)
        except ValueError as exc:
            yield (f"roles.{name}.parser", str(exc))


ROLE_CHECKS: tuple[EntryCheck, ...] = (adapter_without_lora, trained_without_adapter, trainable_on_frozen_group,
                                       unreadable_templates, unbuildable_parser)
"""What :func:`check_roles` checks on each role whose model group is declared, in this order."""


def check_roles(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """Each ``roles.<role>``: its generation lengths, then an undeclared model group alone, else :data:`ROLE_CHECKS`."""
    for name in config.roles:
        yield from generation_beyond_positions(config, registry, name)
        undeclared = list(undeclared_model(config, registry, name))
        yield from undeclared or (problem for check in ROLE_CHECKS for problem in check(config, registry, name))


def check_role_objectives(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """Per-role loss settings on roles that are never trained (:mod:`unimas.preflight.role_settings`)."""
    return role_objective_problems(config)
