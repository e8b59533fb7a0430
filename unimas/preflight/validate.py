"""Static checks that run before any model loads (`unimas validate`).

Each problem is reported with the config path that holds it and how to fix
it; all problems are collected, not just the first, so one edit round fixes
them all. The checks are small functions (:data:`unimas.preflight.problems.Check`),
one rule each, kept in modules by what they check (``checks_models``,
``checks_capabilities``, ``checks_algorithm``, ``checks_roles``,
``checks_workflow``, ``checks_scale``; ``checks_tasks`` for the dataset's
rows) and run in the order of :data:`CONFIG_CHECKS`.
"""

from __future__ import annotations

from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import Registry, build_registry
from unimas.errors import UserError
from unimas.preflight.checks_algorithm import (ALGORITHM_PLUGINS, ALGORITHM_PROTOCOLS, check_algorithm_plugins,
                                               check_central_critic, check_credit_channels, check_critic_paths,
                                               check_critics_for_values, check_critics_without_values,
                                               check_estimator, check_estimator_params, check_loss_params,
                                               forks_episodes, takes_values)
from unimas.preflight.checks_capabilities import check_adapters_hosted, check_turns_scored, check_weights_saved
from unimas.preflight.checks_models import check_model_groups, check_verl_groups
from unimas.preflight.checks_roles import check_role_objectives, check_roles
from unimas.preflight.checks_scale import MAX_EPISODES_PER_STEP, MAX_TORCH_THREADS, check_scale, eval_scale_problems
from unimas.preflight.checks_tasks import check_tasks
from unimas.preflight.checks_workflow import (agent_command_problem, check_agent_command, check_dataset,
                                              check_rewards, check_trajectory_reward, check_workflow)
from unimas.preflight.problems import Check, Problem
from unimas.training.experiment import Experiment

__all__ = ["ALGORITHM_PLUGINS", "ALGORITHM_PROTOCOLS", "CONFIG_CHECKS", "MAX_EPISODES_PER_STEP", "MAX_TORCH_THREADS",
           "TASK_SAMPLE", "agent_command_problem", "check_config", "check_tasks", "forks_episodes", "takes_values",
           "validate"]

TASK_SAMPLE = 64
"""Tasks of the train split whose keys and values are checked against the roles."""

CONFIG_CHECKS: tuple[Check, ...] = (
    check_model_groups,
    check_adapters_hosted,
    check_turns_scored,
    check_weights_saved,
    check_verl_groups,
    check_scale,
    check_critic_paths,
    check_credit_channels,
    check_algorithm_plugins,
    check_loss_params,
    check_role_objectives,
    check_agent_command,
    check_roles,
    check_rewards,
    check_trajectory_reward,
    check_workflow,
    check_dataset,
    check_estimator,
    check_critics_for_values,
    check_estimator_params,
    check_critics_without_values,
    check_central_critic,
)
"""Every check of the config alone, in the order their problems are listed: model groups and what their
backends can do first, then the algorithm's plugins, the roles, the workflow and its rewards, the estimator and
its critics."""


def check_config(config: ExperimentConfig, registry: Registry) -> list[Problem]:
    """Every problem :data:`CONFIG_CHECKS` find in ``config``, check by check."""
    return [problem for check in CONFIG_CHECKS for problem in check(config, registry)]


def validate(config: ExperimentConfig, registry: Registry | None = None) -> Experiment:
    """Raise one UserError listing every problem, or return the resolved experiment."""
    registry = registry or build_registry(config.plugins)
    problems = check_config(config, registry)
    if not problems:
        experiment = Experiment.resolve(config, registry)
        eval_tasks = len(experiment.tasks("eval"))  # loads and checks the eval split too
        problems = check_tasks(config, registry, experiment.tasks("train")[:TASK_SAMPLE])
        problems += eval_scale_problems(config, eval_tasks)
    if problems:
        lines = "\n".join(f"  {where}: {message}" for where, message in problems)
        raise UserError(f"{len(problems)} problem(s) in the config:\n{lines}")
    return experiment
