"""Static checks that run before any model loads (`unimas validate`).

Each problem is reported with the config path that holds it and how to fix
it; all problems are collected, not just the first, so one edit round fixes
them all.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from unimas.algorithms.estimators import estimators as known_estimators
from unimas.algorithms.losses import policy_losses as known_policy_losses
from unimas.config import plugin_params
from unimas.config.schema import ExperimentConfig, RoleConfig
from unimas.contract.protocols import (Backend, CreditShaper, ReplayBuffer, RolloutControl, UpdateOrder, capability,
                                       declares)
from unimas.contract.registry import Registry, build_registry, singular
from unimas.errors import UserError
from unimas.groups.verl import preflight as verl_preflight
from unimas.preflight import references
from unimas.preflight.role_settings import role_objective_problems
from unimas.runtime.build import backend_options
from unimas.training import central_critic
from unimas.training.experiment import Experiment, make_parser
from unimas.workflow.graph import check_graph
from unimas.workflow.templates import render, template_fields

ALGORITHM_PLUGINS = {"rollout": "rollout_controls", "replay": "replay_buffers", "update_order": "update_orders",
                     "credit": "credit_shapers"}
"""``algorithm.<field>`` -> the registry kind its ``name`` must be registered under."""
ALGORITHM_PROTOCOLS: dict[str, type] = {"rollout": RolloutControl, "replay": ReplayBuffer, "update_order": UpdateOrder,
                                        "credit": CreditShaper}
"""``algorithm.<field>`` -> the protocol its plugin follows, which declares the capability flags it may set."""

TASK_SAMPLE = 64
"""Tasks of the train split whose keys and values are checked against the roles."""

MAX_EPISODES_PER_STEP = 1_000_000
"""Most episodes one training step or one evaluation may run: each is held in memory at once, so a count
beyond this is a typo (``tasks_per_step: 320000000``) that would end in a MemoryError or a hang."""

MAX_TORCH_THREADS = 1024
"""Most torch threads per process: beyond the cores of any machine, and torch aborts on counts it cannot start."""


def check_config(config: ExperimentConfig, registry: Registry) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    add = lambda where, message: problems.append((where, message))  # noqa: E731

    losses = known_policy_losses(registry)
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
        if group.trainable and not capability(backend, Backend, "can_train"):
            add(f"models.{name}.trainable", f"backend '{group.backend}' only generates; set trainable: false")
        loss = config.algorithm_for(name).loss
        if group.trainable and loss not in losses:
            where = f"models.{name}.algorithm.loss" if group.algorithm.loss else "algorithm.loss"
            add(where, f"unknown policy loss '{loss}'; known: {', '.join(sorted(losses))}{registry.broken_hint()}")
        if group.snapshot is not None:
            problems.extend(_snapshot_problems(config, name))
    problems.extend(verl_preflight.config_problems(config))
    problems.extend(_scale_problems(config))
    problems.extend(references.critic_path_problems(config) + references.credit_channel_problems(config))

    problems.extend(_algorithm_plugin_problems(config, registry))
    problems.extend(_loss_params_problems(config, registry, losses))
    problems.extend(role_objective_problems(config))
    if config.workflow.agent is not None and config.workflow.agent.command is not None:
        problem = agent_command_problem(config.workflow.agent.command[0])
        if problem is not None:
            add("workflow.agent.command", problem)

    options = _group_options(config, registry)
    for name, role in config.roles.items():
        where = f"roles.{name}"
        group = config.models.get(role.model)
        limit = getattr(options.get(role.model), "max_positions", None)
        for key in ("generation", "eval_generation"):
            generation = getattr(role, key)
            if limit is not None and generation is not None and generation.max_new_tokens >= limit:
                add(f"{where}.{key}.max_new_tokens", f"{generation.max_new_tokens} new tokens leave no room for the "
                    f"prompt in model group '{role.model}' ({limit} positions); lower it below {limit} or raise "
                    f"models.{role.model}.options.tiny.max_positions")
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
            add(f"{where}.trainable", f"roles.{name}.trainable: true conflicts with models.{role.model}.trainable: "
                f"false (a frozen group trains nothing); drop roles.{name}.trainable (the roles of a frozen group "
                f"are frozen) or set models.{role.model}.trainable: true")
        for attr in ("system", "template"):
            try:
                template_fields(getattr(role, attr) or "")  # no template: an agent role
            except ValueError as exc:
                add(f"{where}.{attr}", str(exc))
        if role.parser is not None:
            try:
                make_parser(registry, role.parser)
            except ValueError as exc:
                add(f"{where}.parser", str(exc))

    for index, reward in enumerate(config.rewards):
        where = f"rewards[{index}]"
        if not registry.has("rewards", reward.name):
            add(f"{where}.name", f"unknown reward '{reward.name}'; registered: {', '.join(registry.names('rewards'))}"
                f"{registry.broken_hint()}")
        else:
            problems.extend(_params_problems(registry.get("rewards", reward.name), reward.name, reward.params,
                                             f"{where}.params", inputs=2))
        for role in reward.roles or []:
            if role not in config.roles:
                add(f"{where}.roles", f"role '{role}' is not declared under 'roles'")
    if not any(r.level == "trajectory" for r in config.rewards):
        add("rewards", "add at least one trajectory-level reward: it defines reward/mean and eval/accuracy")

    if config.workflow.name is not None and not registry.has("workflows", config.workflow.name):
        add("workflow.name", f"unknown workflow '{config.workflow.name}'; registered: "
            f"{', '.join(registry.names('workflows'))}{registry.broken_hint()}")
    elif config.workflow.name is not None:
        problems.extend(_params_problems(registry.get("workflows", config.workflow.name), config.workflow.name,
                                         config.workflow.params, "workflow.params", inputs=2))
    if not registry.has("datasets", config.data.name):
        add("data.name", f"unknown dataset '{config.data.name}'; registered: "
            f"{', '.join(registry.names('datasets'))}{registry.broken_hint()}")

    algo = config.algorithm
    estimators = known_estimators(registry)
    estimator = estimators.get(algo.estimator)
    if estimator is None:
        add("algorithm.estimator", f"unknown estimator '{algo.estimator}'; known: {', '.join(sorted(estimators))}"
            f"{registry.broken_hint()}")
    elif estimator.usable_with_critic:  # a centralized critic: central_critic.config_problems below
        problems.extend(_critic_problems(config, registry, needs_values=True) if algo.critic == "per_group" else [])
    elif not estimator.usable:
        needs = "a critic (value estimates)" if estimator.needs_critic else ", ".join(estimator.missing_inputs)
        usable = ", ".join(sorted(name for name, e in estimators.items() if e.usable))
        add("algorithm.estimator", f"'{algo.estimator}' needs {needs}, which unimas does not produce; use one of "
            f"{usable} or a plugin estimator")
    elif estimator.group_normalised and algo.group_size < 2:
        add("algorithm.group_size", f"'{algo.estimator}' normalises within groups; group_size must be >= 2")
    if estimator is not None:
        problems.extend(_params_problems(estimator.fn, algo.estimator, algo.estimator_params,
                                         "algorithm.estimator_params", keyword_only=True))
        if not estimator.needs_critic:
            problems.extend(_critic_problems(config, registry, needs_values=False))
        problems.extend(central_critic.config_problems(config, registry, takes_values=estimator.needs_critic))
    return problems


def _scale_problems(config: ExperimentConfig) -> list[tuple[str, str]]:
    """Counts that are valid numbers but too large for any machine (the eval split's size is checked in
    :func:`validate`, once the split is loaded)."""
    problems = []
    trainer = config.trainer
    if trainer.torch_threads > MAX_TORCH_THREADS:
        problems.append(("trainer.torch_threads", f"{trainer.torch_threads} threads per process; at most "
                         f"{MAX_TORCH_THREADS}"))
    episodes = trainer.tasks_per_step * config.algorithm.group_size
    if episodes > MAX_EPISODES_PER_STEP:
        problems.append(("trainer.tasks_per_step", f"{trainer.tasks_per_step} tasks x algorithm.group_size "
                         f"{config.algorithm.group_size} = {episodes} episodes per step; at most "
                         f"{MAX_EPISODES_PER_STEP}"))
    return problems


def _eval_scale_problems(config: ExperimentConfig, eval_tasks: int) -> list[tuple[str, str]]:
    """An evaluation runs ``eval_samples`` episodes on each of at most ``eval_size`` tasks of the eval split."""
    trainer = config.trainer
    episodes = min(trainer.eval_size, eval_tasks) * trainer.eval_samples
    if episodes <= MAX_EPISODES_PER_STEP:
        return []
    return [("trainer.eval_samples", f"{trainer.eval_samples} samples x {min(trainer.eval_size, eval_tasks)} eval "
             f"tasks = {episodes} episodes per evaluation; at most {MAX_EPISODES_PER_STEP}")]


def _critic_problems(config: ExperimentConfig, registry: Registry, needs_values: bool) -> list[tuple[str, str]]:
    """``models.<g>.critic``: on every group that trains roles when the estimator takes values (gae), on a
    trainable group of a backend that has critics, and nowhere else (docs/critic.md)."""
    problems: list[tuple[str, str]] = []
    estimator = config.algorithm.estimator
    trains_roles = {role.model for role in config.roles.values() if role.trainable}
    for name, group in config.models.items():
        where = f"models.{name}.critic"
        backend = registry.get("backends", group.backend) if registry.has("backends", group.backend) else None
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
        elif backend is not None and not getattr(backend, "supports_critic", False):
            problems.append((where, f"backend '{group.backend}' has no critic (only the torch and verl backends do)"))
    return problems


def _params_problems(obj: Any, name: str, params: dict[str, Any], where: str,
                     keyword_only: bool = False, inputs: int = 0) -> list[tuple[str, str]]:
    """The config's params checked against what ``obj`` declares (:mod:`unimas.config.plugin_params`)."""
    try:
        return plugin_params.params_spec(obj, name, keyword_only=keyword_only, inputs=inputs).check(params, where)[1]
    except UserError as exc:  # the plugin's annotations cannot be read
        return [(where, str(exc))]


def _algorithm_plugin_problems(config: ExperimentConfig, registry: Registry) -> list[tuple[str, str]]:
    """Each ``algorithm.<key>``: a registered name, params its factory accepts, no fork of an agent program."""
    problems = []
    for field, kind in ALGORITHM_PLUGINS.items():
        entry = getattr(config.algorithm, field)
        if entry is None:
            continue
        if not registry.has(kind, entry.name):
            problems.append((f"algorithm.{field}.name", f"unknown {singular(kind)} '{entry.name}'; "
                             f"registered: {', '.join(registry.names(kind)) or 'none'}{registry.broken_hint()}"))
            continue
        factory = registry.get(kind, entry.name)
        params_problems = _params_problems(factory, entry.name, entry.params, f"algorithm.{field}.params")
        problems += params_problems
        if field == "update_order" and not params_problems and takes_values(config, registry) \
                and capability(factory(**entry.params), UpdateOrder, "rescales_advantages"):
            problems.append(("algorithm.update_order.params", f"'{entry.name}' with these params rescales each "
                             f"turn's advantage, but algorithm.estimator '{config.algorithm.estimator}' computes "
                             "per-token advantages from a critic inside the update, which the rescaling would "
                             "not reach; drop the params that rescale, or use an estimator without values"))
        if config.workflow.agent is not None and forks_episodes(field, factory):
            problems.append((f"algorithm.{field}.name", f"'{entry.name}' forks recorded episodes, which is not "
                             "supported for a workflow.agent program (its requests carry no turn ids to replay; "
                             "docs/algorithms.md); use a rollout control that does not fork"))
    return problems


def forks_episodes(field: str, factory: Any) -> bool:
    """Whether the ``algorithm.<field>`` plugin made by ``factory`` forks recorded episodes (its declared flag)."""
    protocol = ALGORITHM_PROTOCOLS[field]
    return declares(protocol, "uses_forks") and capability(factory, protocol, "uses_forks")


def takes_values(config: ExperimentConfig, registry: Registry) -> bool:
    """Whether the run's estimator reads a critic's values (``gae``)."""
    estimator = known_estimators(registry).get(config.algorithm.estimator)
    return estimator is not None and estimator.needs_critic


def _loss_params_problems(config: ExperimentConfig, registry: Registry,
                          losses: dict[str, Any]) -> list[tuple[str, str]]:
    """Each trainable group's ``loss_params`` against its policy loss (groups that share them: reported once)."""
    problems: list[tuple[str, str]] = []
    for name, group in config.models.items():
        algorithm = config.algorithm_for(name)
        if not group.trainable or algorithm.loss not in losses:
            continue
        where = (f"models.{name}.algorithm.loss_params" if group.algorithm.loss_params is not None
                 else "algorithm.loss_params")
        for problem in _params_problems(losses[algorithm.loss], algorithm.loss, algorithm.loss_params or {}, where,
                                        keyword_only=True):
            if problem not in problems:
                problems.append(problem)
    return problems


def agent_command_problem(program: str) -> str | None:
    """Why the agent runner could not start ``program``, or None.

    It is found as ``exec`` finds it: a name with a path separator relative to
    the directory unimas runs in (``workflow.agent.command`` says so), a bare
    name on ``PATH``.
    """
    if os.sep not in program and not (os.altsep and os.altsep in program):
        if shutil.which(program) is None:
            local = f"; a program in this directory is ./{program}" if Path(program).is_file() else ""
            return f"program '{program}' is not on PATH{local}"
        return None
    path = Path(program)
    if not path.exists():
        return (f"program '{program}' does not exist (a relative path is relative to the directory unimas runs in, "
                f"{Path.cwd()})")
    if path.is_dir():
        return f"program '{program}' is a directory, not a program"
    if not os.access(path, os.X_OK):
        return (f"program '{program}' is not executable: `chmod +x {program}`, or run it through its interpreter, "
                f"e.g. [python, {program}]")
    return None


def _snapshot_problems(config: ExperimentConfig, name: str) -> list[tuple[str, str]]:
    """A snapshot group is a frozen torch copy of a trainable torch group with the same model settings."""
    group = config.models[name]
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
    if group.backend != "torch" or source.backend != "torch":
        problems.append((f"models.{name}.backend", "snapshot pools need the torch backend on both groups"))
    if group.options != source.options:
        problems.append((f"models.{name}.options", f"a snapshot group must load the same model as "
                         f"'{group.snapshot.of}': copy its options"))
    if group.lora is not None or source.lora is not None:
        problems.append((f"models.{name}.lora", "snapshot pools of LoRA groups are not supported: snapshot a "
                         "group that trains its full weights"))
    return problems


def _group_options(config: ExperimentConfig, registry: Registry) -> dict[str, Any]:
    """Each group's validated backend options; groups whose options are wrong are reported elsewhere."""
    options = {}
    for name, group in config.models.items():
        if registry.has("backends", group.backend):
            try:
                options[name] = backend_options(config, registry, name)
            except UserError:
                continue
    return options


def check_tasks(config: ExperimentConfig, registry: Registry, tasks: list[dict]) -> list[tuple[str, str]]:
    """What the first tasks reveal: graph inputs the rows lack, characters a tiny model cannot read."""
    problems: list[tuple[str, str]] = []
    graph = config.workflow.graph
    if graph is not None:
        task_keys = set().union(*(task.keys() for task in tasks))
        problems += check_graph(graph, config.roles, set(registry.names("tools")), task_keys)
        problems += _rows_missing_inputs(config, tasks)
    options = _group_options(config, registry)
    for name, role in config.roles.items():
        alphabet = getattr(options.get(role.model), "alphabet", None)
        if alphabet is not None:
            problems += _outside_alphabet(name, role, set(alphabet), tasks, config.data.name)
    return problems


def _rows_missing_inputs(config: ExperimentConfig, tasks: list[dict]) -> list[tuple[str, str]]:
    """Template fields a graph node takes from the task that some rows lack (all rows lacking: check_graph)."""
    problems = []
    for node_name, node in config.workflow.graph.nodes.items():
        role = config.roles.get(node.role or "")
        if node.kind != "llm" or role is None:
            continue
        for field in dict.fromkeys(template_fields(role.template)):
            rows = [i for i, task in enumerate(tasks) if field not in task]
            if field not in node.inputs and rows and len(rows) < len(tasks):
                problems.append((f"workflow.graph.nodes.{node_name}.inputs", f"row {rows[0]} of dataset "
                                 f"'{config.data.name}' has no field '{field}', which the template of role "
                                 f"'{node.role}' needs; add it to every row or pass it under inputs"))
    return problems


def _outside_alphabet(name: str, role: RoleConfig, alphabet: set[str], tasks: list[dict],
                      dataset: str) -> list[tuple[str, str]]:
    """Prompt characters a char-level model would read as <unk>: literal text first, then task values."""
    def shown(chars: set[str]) -> str:
        return ", ".join(repr(c) for c in sorted(chars))

    hint = f"add them to models.{role.model}.options.tiny.alphabet"
    problems = []
    fields = dict.fromkeys(template_fields(role.template or ""))
    literal = {"system": role.system, "template": render(role.template or "", dict.fromkeys(fields, ""))}
    for key, text in literal.items():
        if set(text) - alphabet:
            problems.append((f"roles.{name}.{key}", f"characters outside the alphabet of model group '{role.model}': "
                                                    f"{shown(set(text) - alphabet)}; {hint} or change the text"))
    for field in fields:
        row = next((i for i, task in enumerate(tasks) if field in task and set(str(task[field])) - alphabet), None)
        if row is not None:
            bad = set(str(tasks[row][field])) - alphabet
            problems.append((f"roles.{name}.template", f"{{{field}}} of row {row} of dataset '{dataset}' has "
                                                       f"characters outside the alphabet: {shown(bad)}; {hint}"))
    return problems


def validate(config: ExperimentConfig, registry: Registry | None = None) -> Experiment:
    """Raise one UserError listing every problem, or return the resolved experiment."""
    registry = registry or build_registry(config.plugins)
    problems = check_config(config, registry)
    if not problems:
        experiment = Experiment.resolve(config, registry)
        eval_tasks = len(experiment.tasks("eval"))  # loads and checks the eval split too
        problems = check_tasks(config, registry, experiment.tasks("train")[:TASK_SAMPLE])
        problems += _eval_scale_problems(config, eval_tasks)
    if problems:
        lines = "\n".join(f"  {where}: {message}" for where, message in problems)
        raise UserError(f"{len(problems)} problem(s) in the config:\n{lines}")
    return experiment
