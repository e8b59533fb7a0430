"""Checks of what runs the episodes and scores them: the workflow (or agent program), its dataset, the rewards."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import Registry
from unimas.preflight.problems import Problem, params_problems


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


def check_agent_command(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """A ``workflow.agent.command`` whose program could not be started (:func:`agent_command_problem`)."""
    agent = config.workflow.agent
    if agent is not None and agent.command is not None:
        problem = agent_command_problem(agent.command[0])
        if problem is not None:
            yield ("workflow.agent.command", problem)


def check_rewards(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """Each ``rewards[i]``: a registered name, params the function takes, roles that are declared."""
    for index, reward in enumerate(config.rewards):
        where = f"rewards[{index}]"
        if not registry.has("rewards", reward.name):
            yield (f"{where}.name", f"unknown reward '{reward.name}'; registered: "
                   f"{', '.join(registry.names('rewards'))}{registry.broken_hint()}")
        else:
            yield from params_problems(registry.get("rewards", reward.name), reward.name, reward.params,
                                       f"{where}.params", inputs=2)
        for role in reward.roles or []:
            if role not in config.roles:
                yield (f"{where}.roles", f"role '{role}' is not declared under 'roles'")


def check_trajectory_reward(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """No trajectory-level reward: nothing would define reward/mean and eval/accuracy."""
    if not any(reward.level == "trajectory" for reward in config.rewards):
        yield ("rewards", "add at least one trajectory-level reward: it defines reward/mean and eval/accuracy")


def check_workflow(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """``workflow.name``: a registered workflow, called with params it takes."""
    name = config.workflow.name
    if name is None:
        return
    if not registry.has("workflows", name):
        yield ("workflow.name", f"unknown workflow '{name}'; registered: "
               f"{', '.join(registry.names('workflows'))}{registry.broken_hint()}")
    else:
        yield from params_problems(registry.get("workflows", name), name, config.workflow.params, "workflow.params",
                                   inputs=2)


def check_dataset(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """``data.name``: a registered dataset (its rows are checked once loaded: ``check_tasks``)."""
    if not registry.has("datasets", config.data.name):
        yield ("data.name", f"unknown dataset '{config.data.name}'; registered: "
               f"{', '.join(registry.names('datasets'))}{registry.broken_hint()}")
