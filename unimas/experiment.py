"""Resolve a validated config against the plugin registry.

Everything a run needs that comes from plugins — the workflow coroutine, tool
and reward functions, the task lists, the estimator — is looked up once here,
so `validate`, `train` and `eval` see exactly the same objects.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from unimas.algorithms import Estimator, resolve_estimator
from unimas.config import ExperimentConfig
from unimas.credit import reward_keys
from unimas.errors import UserError
from unimas.registry import Registry, build_registry
from unimas.workflow.graph import make_graph_workflow


@dataclass
class Experiment:
    config: ExperimentConfig
    registry: Registry
    workflow: Callable[..., Any]
    tools: dict[str, Callable[..., Any]]
    rewards: dict[str, Callable[..., Any]]
    estimator: Estimator

    @classmethod
    def resolve(cls, config: ExperimentConfig, registry: Registry | None = None) -> "Experiment":
        registry = registry or build_registry(config.plugins)
        if config.workflow.graph is not None:
            workflow = make_graph_workflow(config.workflow.graph)
        else:
            workflow = registry.get("workflows", config.workflow.name, where="workflow.name")
            _check_async(workflow, config.workflow.name, registry.provider("workflows", config.workflow.name))
            if config.workflow.params:
                workflow = _bind_params(workflow, config.workflow.params)
        tools = {name: registry.get("tools", name) for name in registry.names("tools")}
        rewards = {r.name: registry.get("rewards", r.name, where=f"rewards[{i}].name")
                   for i, r in enumerate(config.rewards)}
        registry.get("datasets", config.data.name, where="data.name")
        estimator = resolve_estimator(config.algorithm.estimator, registry)
        return cls(config, registry, workflow, tools, rewards, estimator)

    def tasks(self, split: str) -> list[dict]:
        data = self.config.data
        params = data.eval_params if (split == "eval" and data.eval_params is not None) else data.params
        factory = self.registry.get("datasets", data.name, where="data.name")
        try:
            tasks = factory(split=split, seed=self.config.trainer.seed, **params)
        except TypeError as exc:
            raise UserError(f"dataset '{data.name}' rejected its params: {exc}", where="data.params") from None
        if not tasks:
            raise UserError(f"dataset '{data.name}' returned no tasks for split '{split}'", where="data")
        return [dict(task, id=task.get("id", f"{split}-{i}")) for i, task in enumerate(tasks)]

    @property
    def primary_reward(self) -> str | None:
        """The first trajectory-level reward: what `eval/accuracy` and `reward/mean` report."""
        for key, spec in zip(reward_keys(self.config.rewards), self.config.rewards):
            if spec.level == "trajectory":
                return key
        return None


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
