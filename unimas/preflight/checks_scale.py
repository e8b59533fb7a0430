"""Counts that are valid numbers but too large for any machine: a typo that would end in a MemoryError or a hang."""

from __future__ import annotations

from typing import Iterator

from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import Registry
from unimas.preflight.problems import Problem

MAX_EPISODES_PER_STEP = 1_000_000
"""Most episodes one training step or one evaluation may run: each is held in memory at once, so a count
beyond this is a typo (``tasks_per_step: 320000000``) that would end in a MemoryError or a hang."""

MAX_TORCH_THREADS = 1024
"""Most torch threads per process: beyond the cores of any machine, and torch aborts on counts it cannot start."""


def check_scale(config: ExperimentConfig, registry: Registry) -> Iterator[Problem]:
    """Threads and episodes per step beyond any machine (the eval split's size is checked by
    :func:`eval_scale_problems`, once the split is loaded)."""
    trainer = config.trainer
    if trainer.torch_threads > MAX_TORCH_THREADS:
        yield ("trainer.torch_threads", f"{trainer.torch_threads} threads per process; at most {MAX_TORCH_THREADS}")
    episodes = trainer.tasks_per_step * config.algorithm.group_size
    if episodes > MAX_EPISODES_PER_STEP:
        yield ("trainer.tasks_per_step", f"{trainer.tasks_per_step} tasks x algorithm.group_size "
               f"{config.algorithm.group_size} = {episodes} episodes per step; at most {MAX_EPISODES_PER_STEP}")


def eval_scale_problems(config: ExperimentConfig, eval_tasks: int) -> list[Problem]:
    """An evaluation runs ``eval_samples`` episodes on each of at most ``eval_size`` tasks of the eval split."""
    trainer = config.trainer
    episodes = min(trainer.eval_size, eval_tasks) * trainer.eval_samples
    if episodes <= MAX_EPISODES_PER_STEP:
        return []
    return [("trainer.eval_samples", f"{trainer.eval_samples} samples x {min(trainer.eval_size, eval_tasks)} eval "
             f"tasks = {episodes} episodes per evaluation; at most {MAX_EPISODES_PER_STEP}")]
