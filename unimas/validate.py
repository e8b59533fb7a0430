"""Static checks that run before any model loads (`unimas validate`).

Each problem is reported with the config path that holds it and how to fix
it; all problems are collected, not just the first, so one edit round fixes
them all.
"""

from __future__ import annotations

import re

from unimas import algorithms
from unimas.config import ExperimentConfig
from unimas.errors import UserError
from unimas.experiment import Experiment
from unimas.groups.build import backend_options
from unimas.registry import Registry, build_registry
from unimas.report.data import model_mapping
from unimas.workflow.graph import check_graph
from unimas.workflow.templates import template_fields


def check_config(config: ExperimentConfig, registry: Registry) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    add = lambda where, message: problems.append((where, message))  # noqa: E731

    losses = algorithms.policy_losses(registry)
    for name, group in config.models.items():
        if not registry.has("backends", group.backend):
            add(f"models.{name}.backend", f"unknown backend '{group.backend}'; registered: "
                f"{', '.join(registry.names('backends'))}{registry.broken_hint()}")
            continue
        backend = registry.get("backends", group.backend)
        try:
            backend_options(config, registry, name)
        except UserError as exc:
            add(f"models.{name}.options", str(exc))
        if group.trainable and not getattr(backend, "can_train", True):
            add(f"models.{name}.trainable", f"backend '{group.backend}' only generates; set trainable: false")
        loss = config.algorithm_for(name).loss
        if group.trainable and loss not in losses:
            where = f"models.{name}.algorithm.loss" if group.algorithm.loss else "algorithm.loss"
            add(where, f"unknown policy loss '{loss}'; known: {', '.join(sorted(losses))}{registry.broken_hint()}")

    for name, role in config.roles.items():
        where = f"roles.{name}"
        group = config.models.get(role.model)
        if group is None:
            add(f"{where}.model", f"model group '{role.model}' is not declared under 'models' "
                f"(declared: {', '.join(config.models)})")
            continue
        if role.adapter and group.lora is None:
            add(f"{where}.adapter", f"role uses LoRA adapter '{role.adapter}' but model group '{role.model}' has no "
                "'lora' section; add models.{0}.lora: {{r: 8}} or drop the adapter".format(role.model))
        if (group.lora is not None and not role.adapter and role.trainable and group.trainable
                and not group.lora.train_base):
            add(f"{where}.adapter", f"model group '{role.model}' trains LoRA adapters only, and this role has none, so "
                f"it would train nothing; give it one (adapter: {name}), or set trainable: false to act with the "
                "frozen base, or lora.train_base: true")
        if role.trainable and not group.trainable:
            add(f"{where}.trainable", f"model group '{role.model}' is frozen (trainable: false); "
                f"set roles.{name}.trainable: false")
        for attr in ("system", "template"):
            try:
                template_fields(getattr(role, attr))
            except ValueError as exc:
                add(f"{where}.{attr}", str(exc))
        if role.parser is not None:
            try:
                re.compile(role.parser)
            except re.error as exc:
                add(f"{where}.parser", f"invalid regular expression {role.parser!r}: {exc}")

    for index, reward in enumerate(config.rewards):
        where = f"rewards[{index}]"
        if not registry.has("rewards", reward.name):
            add(f"{where}.name", f"unknown reward '{reward.name}'; registered: {', '.join(registry.names('rewards'))}"
                f"{registry.broken_hint()}")
        for role in reward.roles or []:
            if role not in config.roles:
                add(f"{where}.roles", f"role '{role}' is not declared under 'roles'")
    if not any(r.level == "trajectory" for r in config.rewards):
        add("rewards", "add at least one trajectory-level reward: it defines reward/mean and eval/accuracy")

    if config.workflow.name is not None and not registry.has("workflows", config.workflow.name):
        add("workflow.name", f"unknown workflow '{config.workflow.name}'; registered: "
            f"{', '.join(registry.names('workflows'))}{registry.broken_hint()}")
    if not registry.has("datasets", config.data.name):
        add("data.name", f"unknown dataset '{config.data.name}'; registered: "
            f"{', '.join(registry.names('datasets'))}{registry.broken_hint()}")

    algo = config.algorithm
    estimators = algorithms.estimators(registry)
    estimator = estimators.get(algo.estimator)
    if estimator is None:
        add("algorithm.estimator", f"unknown estimator '{algo.estimator}'; known: {', '.join(sorted(estimators))}"
            f"{registry.broken_hint()}")
    elif not estimator.usable:
        needs = "a critic (value estimates)" if estimator.needs_critic else ", ".join(estimator.missing_inputs)
        usable = ", ".join(sorted(name for name, e in estimators.items() if e.usable))
        add("algorithm.estimator", f"'{algo.estimator}' needs {needs}, which unimas does not produce; use one of "
            f"{usable} or a plugin estimator")
    elif estimator.group_normalised and algo.group_size < 2:
        add("algorithm.group_size", f"'{algo.estimator}' normalises within groups; group_size must be >= 2")
    return problems


def check_graph_workflow(config: ExperimentConfig, registry: Registry, task_keys: set[str] | None):
    return check_graph(config.workflow.graph, config.roles, set(registry.names("tools")), task_keys)


def validate(config: ExperimentConfig, registry: Registry | None = None) -> Experiment:
    """Raise one UserError listing every problem, or return the resolved experiment."""
    registry = registry or build_registry(config.plugins)
    problems = check_config(config, registry)
    if not problems:
        experiment = Experiment.resolve(config, registry)
        if config.workflow.graph is not None:
            task_keys = set().union(*(t.keys() for t in experiment.tasks("train")[:64]))
            problems = check_graph_workflow(config, registry, task_keys)
    if problems:
        lines = "\n".join(f"  {where}: {message}" for where, message in problems)
        raise UserError(f"{len(problems)} problem(s) in the config:\n{lines}")
    return experiment


def summary(experiment: Experiment) -> str:
    """What `unimas validate` prints: the mapping (as the report header shows it), workflow, algorithm."""
    config = experiment.config
    lines = ["roles -> model groups:"]
    for name, role in config.roles.items():
        extras = [f"adapter {role.adapter}"] if role.adapter else []
        if not role.trainable:
            extras.append("frozen")
        lines.append(f"  {name} -> {role.model}" + (f" ({', '.join(extras)})" if extras else ""))
    lines.append("model groups:")
    for row in model_mapping(config.model_dump(mode="json")):
        options = config.models[row.group].options
        source = next((f"{key} {options[key]}" for key in ("path", "init_from", "endpoint") if key in options),
                      "tiny model" if "tiny" in options else None)
        parts = [row.scheme, f"backend {row.backend}", source, f"roles: {', '.join(row.roles) or 'none'}"]
        lines.append(f"  {row.group}: " + "; ".join(part for part in parts if part))
    if config.workflow.graph is not None:
        graph = config.workflow.graph
        lines.append(f"workflow: graph with {len(graph.nodes)} nodes, {len(graph.edges)} edges, start '{graph.start}'")
    else:
        lines.append(f"workflow: python workflow '{config.workflow.name}'")
    algo = config.algorithm
    lines.append(f"algorithm: {algo.estimator} grouped by {algo.grouping}, G={algo.group_size}, loss {algo.loss}, "
                 f"KL {algo.kl_coef}; runtime {config.runtime.kind}")
    return "\n".join(lines)
