"""Static checks that run before any model loads (`unimas validate`).

Each problem is reported with the config path that holds it and how to fix
it; all problems are collected, not just the first, so one edit round fixes
them all.
"""

from __future__ import annotations

from pathlib import Path

from unimas import verl_compat
from unimas.config import ExperimentConfig
from unimas.errors import UserError
from unimas.experiment import Experiment
from unimas.registry import Registry, build_registry
from unimas.workflow.templates import template_fields

GROUP_NORMALISED = {"grpo", "grpo_vectorized", "grpo_passk", "gdpo", "rloo", "rloo_vectorized", "opo",
                    "reinforce_plus_plus_baseline", "gpg"}
NEEDS_CRITIC = {"gae"}
NEEDS_EXTRA_INPUTS = {"remax", "optimal_token_baseline", "tir_optimal_token_baseline"}


def check_config(config: ExperimentConfig, registry: Registry) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    add = lambda where, message: problems.append((where, message))  # noqa: E731

    for name, group in config.models.items():
        if not registry.has("backends", group.backend):
            add(f"models.{name}.backend", f"unknown backend '{group.backend}'; registered: "
                f"{', '.join(registry.names('backends'))}")
        if (group.backend == "openai") != (group.endpoint is not None):
            add(f"models.{name}.endpoint", "an 'endpoint' goes with backend: openai, and backend: openai needs one")
        if group.endpoint is not None and group.trainable:
            add(f"models.{name}.trainable", "a group served by an API endpoint cannot train; set trainable: false")
        for attr in ("path", "init_from"):
            value = getattr(group, attr)
            if value and not Path(value).is_dir():
                add(f"models.{name}.{attr}", f"directory '{value}' does not exist (paths are relative to the config file)")

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
        if role.trainable and not group.trainable:
            add(f"{where}.trainable", f"model group '{role.model}' is frozen (trainable: false); "
                f"set roles.{name}.trainable: false")
        for attr in ("system", "template"):
            try:
                template_fields(getattr(role, attr))
            except ValueError as exc:
                add(f"{where}.{attr}", str(exc))

    for index, reward in enumerate(config.rewards):
        where = f"rewards[{index}]"
        if not registry.has("rewards", reward.name):
            add(f"{where}.name", f"unknown reward '{reward.name}'; registered: {', '.join(registry.names('rewards'))}")
        for role in reward.roles or []:
            if role not in config.roles:
                add(f"{where}.roles", f"role '{role}' is not declared under 'roles'")
    if not any(r.level == "trajectory" for r in config.rewards):
        add("rewards", "add at least one trajectory-level reward: it defines reward/mean and eval/accuracy")

    if config.workflow.name is not None and not registry.has("workflows", config.workflow.name):
        add("workflow.name", f"unknown workflow '{config.workflow.name}'; registered: "
            f"{', '.join(registry.names('workflows'))}")
    if not registry.has("datasets", config.data.name):
        add("data.name", f"unknown dataset '{config.data.name}'; registered: {', '.join(registry.names('datasets'))}")

    algo = config.algorithm
    if algo.estimator in NEEDS_CRITIC | NEEDS_EXTRA_INPUTS:
        add("algorithm.estimator", f"'{algo.estimator}' needs a critic or extra rollout inputs unimas does not "
            "produce; use grpo, rloo, reinforce_plus_plus or a plugin estimator")
    elif not registry.has("estimators", algo.estimator) and algo.estimator not in verl_compat.estimator_names():
        add("algorithm.estimator", f"unknown estimator '{algo.estimator}'")
    if algo.estimator in GROUP_NORMALISED and algo.group_size < 2:
        add("algorithm.group_size", f"'{algo.estimator}' normalises within groups; group_size must be >= 2")
    if algo.loss not in verl_compat.policy_loss_names():
        add("algorithm.loss", f"unknown policy loss '{algo.loss}'; verl has: {', '.join(verl_compat.policy_loss_names())}")
    return problems


def check_graph_workflow(config: ExperimentConfig, registry: Registry, task_keys: set[str] | None):
    from unimas.workflow.graph import check_graph

    return check_graph(config.workflow.graph, config.roles, set(registry.names("tools")), task_keys)


def validate(config: ExperimentConfig, registry: Registry | None = None) -> Experiment:
    """Raise one UserError listing every problem, or return the resolved experiment."""
    registry = registry or build_registry(config.plugins)
    problems = check_config(config, registry)
    if not problems and config.workflow.graph is not None:
        experiment = Experiment.resolve(config, registry)
        task_keys = set().union(*(t.keys() for t in experiment.tasks("train")[:64]))
        problems = check_graph_workflow(config, registry, task_keys)
    if problems:
        lines = "\n".join(f"  {where}: {message}" for where, message in problems)
        raise UserError(f"{len(problems)} problem(s) in the config:\n{lines}")
    return Experiment.resolve(config, registry)


def summary(experiment: Experiment) -> str:
    config = experiment.config
    lines = ["roles -> model groups:"]
    for name, role in config.roles.items():
        extras = [f"adapter {role.adapter}"] if role.adapter else []
        if not role.trainable:
            extras.append("frozen")
        lines.append(f"  {name} -> {role.model}" + (f" ({', '.join(extras)})" if extras else ""))
    lines.append("model groups:")
    for name, group in config.models.items():
        roles = [r for r, spec in config.roles.items() if spec.model == name]
        adapters = sorted({config.roles[r].adapter for r in roles if config.roles[r].adapter})
        if not group.trainable:
            scheme = "frozen"
        elif adapters:
            scheme = f"LoRA adapter per role on one base ({', '.join(adapters)})"
        elif len(roles) > 1:
            scheme = f"shared by {len(roles)} roles"
        else:
            scheme = "one role (separate)"
        source = group.path or group.init_from or group.endpoint or f"tiny {group.tiny.architecture}"
        lines.append(f"  {name}: {scheme}; backend {group.backend}; {source}; roles: {', '.join(roles) or 'none'}")
    if config.workflow.graph is not None:
        graph = config.workflow.graph
        lines.append(f"workflow: graph with {len(graph.nodes)} nodes, {len(graph.edges)} edges, start '{graph.start}'")
    else:
        lines.append(f"workflow: python workflow '{config.workflow.name}'")
    algo = config.algorithm
    lines.append(f"algorithm: {algo.estimator} grouped by {algo.grouping}, G={algo.group_size}, loss {algo.loss}, "
                 f"KL {algo.kl_coef}; runtime {config.runtime.kind}")
    return "\n".join(lines)
