"""What `unimas validate` prints once a config passed: the mapping, the workflow and the algorithm in force, one line per
extension point, so that a plugin left out (or in) is seen before anything trains."""

from __future__ import annotations

from unimas.contract.registry import Registry
from unimas.preflight.role_settings import role_objective_lines
from unimas.preflight.validate import ALGORITHM_PLUGINS, forks_episodes, takes_values
from unimas.report.data import model_mapping
from unimas.runtime.build import backend_options
from unimas.training.experiment import Experiment


def summary(experiment: Experiment) -> str:
    """What `unimas validate` prints: the mapping (as the report header shows it), workflow, algorithm."""
    config = experiment.config
    lines = ["roles -> model groups:"]
    templated = {group: _has_chat_template(experiment, group) for group in config.models}
    for name, role in config.roles.items():
        extras = [f"adapter {role.adapter}"] if role.adapter else []
        if not role.trainable:
            extras.append("frozen")
        chat = "chat template" if role.chat == "auto" and templated[role.model] else "plain prompt"
        extras += [chat, f"memory {role.memory}"]
        lines.append(f"  {name} -> {role.model} ({', '.join(extras)})")
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
    elif config.workflow.agent is not None:
        agent = config.workflow.agent
        lines.append(f"workflow: agent {agent.command or agent.function} through the OpenAI-compatible gateway")
    else:
        lines.append(f"workflow: python workflow '{config.workflow.name}'")
    lines += algorithm_summary(experiment)
    lines.append(f"runtime: {config.runtime.kind}")
    return "\n".join(lines)


PLUGIN_DEFAULTS = {"rollout": "default: group_size independent episodes per task", "replay": "none",
                   "update_order": "default: all groups in parallel", "credit": "none: the summed rewards"}
PLUGIN_LABELS = {"rollout": "rollout control", "replay": "replay", "update_order": "update order",
                 "credit": "credit shaper"}


def algorithm_summary(experiment: Experiment) -> list[str]:
    """The algorithm in force, one line per extension point, so that a plugin left out (or in) is seen."""
    config, registry = experiment.config, experiment.registry
    algo = config.algorithm
    estimator_params = f" {algo.estimator_params}" if algo.estimator_params else ""
    loss_params = f" {algo.loss_params}" if algo.loss_params else ""
    lines = ["algorithm:",
             f"  estimator: {algo.estimator}{estimator_params} ({_provider(registry, 'estimators', algo.estimator)})"
             f", grouped by {algo.grouping}, G={algo.group_size}",
             f"  loss: {algo.loss}{loss_params} ({_provider(registry, 'policy_losses', algo.loss)}), "
             f"KL {algo.kl_coef:g}, entropy {algo.entropy_coef:g}"]
    lines += role_objective_lines(config)
    forks = []
    for field, kind in ALGORITHM_PLUGINS.items():
        entry = getattr(algo, field)
        if entry is None:
            lines.append(f"  {PLUGIN_LABELS[field]}: {PLUGIN_DEFAULTS[field]}")
            continue
        params = f" {entry.params}" if entry.params else ""
        lines.append(f"  {PLUGIN_LABELS[field]}: {entry.name}{params} ({_provider(registry, kind, entry.name)})")
        if forks_episodes(field, registry.get(kind, entry.name)):
            forks.append(f"algorithm.{field} '{entry.name}' forks recorded episodes")
    staleness = (f"{algo.max_staleness} (asynchronous: stale turns {algo.stale_turns}, importance cap "
                 f"{algo.importance_cap:g})" if algo.max_staleness else "0 (synchronous: rollouts, then updates)")
    if takes_values(config, registry):
        where = f" (model group '{algo.central_critic}')" if algo.critic == "centralized" else ""
        lines.append(f"  critic: {algo.critic}{where}, gamma {algo.gamma:g}, lam {algo.lam:g}")
    lines.append(f"  max_staleness: {staleness}")
    lines.append(f"  forking: {'; '.join(forks) if forks else 'no'}")
    for name, group in config.models.items():
        overrides = group.algorithm.model_dump(exclude_none=True)
        if overrides:
            lines.append(f"  models.{name}.algorithm: " + ", ".join(f"{k} {v}" for k, v in overrides.items()))
    return lines


def _provider(registry: Registry, kind: str, name: str) -> str:
    """Who registered ``name``: e.g. ``unimas`` or a plugin package (the built-in verl names are not registered)."""
    return f"from {registry.provider(kind, name)}" if registry.has(kind, name) else "built in"


def _has_chat_template(experiment: Experiment, group: str) -> bool:
    """Whether the group's tokenizer has a chat template, as its backend tells (False when it cannot say)."""
    backend = experiment.registry.get("backends", experiment.config.models[group].backend)
    check = getattr(backend, "has_chat_template", None)
    return bool(check(backend_options(experiment.config, experiment.registry, group))) if callable(check) else False
