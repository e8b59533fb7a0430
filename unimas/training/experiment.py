"""Resolve a validated config against the plugin registry.

Everything a run needs that comes from plugins — the workflow coroutine, tool
and reward functions, the task lists, the estimator — is looked up once here,
so `validate`, `train` and `eval` see exactly the same objects.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from unimas.algorithms.credit import reward_keys
from unimas.algorithms.estimators import Estimator, resolve_estimator
from unimas.config.schema import ExperimentConfig, ParserConfig
from unimas.contract.registry import Registry, build_registry
from unimas.errors import UserError, describe
from unimas.workflow.graph import make_graph_workflow


@dataclass
class Experiment:
    config: ExperimentConfig
    registry: Registry
    workflow: Callable[..., Any]
    tools: dict[str, Callable[..., Any]]
    rewards: dict[str, Callable[..., Any]]
    estimator: Estimator
    parsers: dict[str, Callable[[str], Any]]
    """Per role with a ``parser``: its ``parse(text)``."""
    _tasks: dict[str, list[dict]] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def resolve(cls, config: ExperimentConfig, registry: Registry | None = None) -> "Experiment":
        registry = registry or build_registry(config.plugins)
        for name, role in config.roles.items():
            if role.template is None and config.workflow.agent is None:
                raise UserError(f"role '{name}' needs a 'template': only an `agent` workflow, whose requests bring "
                                "their own messages, may leave it out", where=f"roles.{name}.template")
        if config.workflow.graph is not None:
            workflow = make_graph_workflow(config.workflow.graph)
        elif config.workflow.agent is not None:
            from unimas.gateway.agent import AgentWorkflow  # the gateway's web stack: only for agent workflows

            workflow = AgentWorkflow(config.workflow.agent, config.roles)
        else:
            workflow = registry.get("workflows", config.workflow.name, where="workflow.name")
            _check_async(workflow, config.workflow.name, registry.provider("workflows", config.workflow.name))
            if config.workflow.params:
                workflow = _bind_params(workflow, config.workflow.params)
        tools = {name: registry.get("tools", name) for name in registry.names("tools")}
        rewards = {r.name: registry.get("rewards", r.name, where=f"rewards[{i}].name")
                   for i, r in enumerate(config.rewards)}
        registry.get("datasets", config.data.name, where="data.name")
        estimator = resolve_estimator(config.algorithm.estimator, registry, config.algorithm.estimator_params)
        parsers = {}
        for name, role in config.roles.items():
            if role.parser is not None:
                try:
                    parsers[name] = make_parser(registry, role.parser)
                except ValueError as exc:
                    raise UserError(str(exc), where=f"roles.{name}.parser") from None
        return cls(config, registry, workflow, tools, rewards, estimator, parsers)

    def tasks(self, split: str) -> list[dict]:
        """The dataset's tasks for ``split``, each with an ``id``; loaded and checked once per split."""
        if split not in self._tasks:
            self._tasks[split] = self._load_tasks(split)
        return [dict(task) for task in self._tasks[split]]

    def _load_tasks(self, split: str) -> list[dict]:
        data = self.config.data
        params = data.eval_params if (split == "eval" and data.eval_params is not None) else data.params
        factory = self.registry.get("datasets", data.name, where="data.name")
        try:
            tasks = factory(split=split, seed=self.config.trainer.seed, **params)
        except UserError:
            raise
        except TypeError as exc:
            raise UserError(f"dataset '{data.name}' rejected its params: {exc}", where="data.params") from None
        except Exception as exc:  # noqa: BLE001 - a dataset that raises is the plugin's bug or its input's
            raise UserError(f"dataset '{data.name}' failed for split '{split}': {describe(exc)}",
                            where="data") from None
        if not isinstance(tasks, (list, tuple)):
            raise UserError(f"dataset '{data.name}' returned a {type(tasks).__name__}; it must return a list of "
                            "dicts, one per task", where="data.name")
        if not tasks:
            raise UserError(f"dataset '{data.name}' returned no tasks for split '{split}'", where="data")
        return [_checked_task(task, i, split, data.name) for i, task in enumerate(tasks)]

    @property
    def primary_reward(self) -> str | None:
        """The first trajectory-level reward: what `eval/accuracy` and `reward/mean` report."""
        for key, spec in zip(reward_keys(self.config.rewards), self.config.rewards):
            if spec.level == "trajectory":
                return key
        return None


def make_parser(registry: Registry, spec: ParserConfig) -> Callable[[str], Any]:
    """The parse function of a registered parser; ``ValueError`` names what is wrong with ``spec``."""
    if not registry.has("parsers", spec.name):
        raise ValueError(f"unknown parser '{spec.name}'; registered: {', '.join(registry.names('parsers'))}")
    try:
        return registry.get("parsers", spec.name)(**spec.params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"parser '{spec.name}' rejected its params {spec.params}: {exc}") from None


def _check_async(workflow: Callable[..., Any], name: str, provider: str) -> None:
    """A plain ``def`` workflow would only fail at the first step with "coroutine was never awaited"."""
    call = getattr(workflow, "__call__", None)
    if inspect.iscoroutinefunction(workflow) or inspect.iscoroutinefunction(call):
        return
    where = _source(workflow)
    raise UserError(f"workflow '{name}' from {provider} is a plain function{where}; a workflow must be "
                    "`async def workflow(ctx, task)` so that its turns can run concurrently (use `await ctx.act(...)`)",
                    where="workflow.name")


def _source(obj: Any) -> str:
    try:
        return f" ({inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]})"
    except (TypeError, OSError):
        return ""


def _bind_params(workflow: Callable[..., Any], params: dict[str, Any]) -> Callable[..., Any]:
    async def bound(ctx, task):
        return await workflow(ctx, task, **params)

    bound.__name__ = getattr(workflow, "__name__", "workflow")
    return bound


def _checked_task(task: Any, index: int, split: str, dataset: str) -> dict:
    """A task row as a dict with an ``id``; rows that are not JSON-like mappings are the data's mistake.

    Tasks are written to trajectory files and checkpoints as JSON, so a value
    that cannot be is refused here, naming the row, not halfway through a run.
    """
    where = f"data ({dataset}, {split} split, row {index})"
    if not isinstance(task, Mapping):
        raise UserError(f"a task must be a mapping of field -> value, got {type(task).__name__}: {task!r:.80}",
                        where=where)
    try:
        task = dict(task, id=task.get("id", f"{split}-{index}"))
    except Exception as exc:  # noqa: BLE001 - a mapping class of the plugin's that cannot be read
        raise UserError(f"the task cannot be read as a mapping: {describe(exc)}", where=where) from None
    try:
        json.dumps(task)
    except (TypeError, ValueError, RecursionError) as exc:
        raise UserError(f"the task is not JSON-serialisable ({exc}); use strings, numbers, booleans, null, "
                        "lists and string-keyed mappings", where=where) from None
    return task
