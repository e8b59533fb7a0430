"""From rewards to one advantage per trainable turn, in three pluggable steps.

1. **Reward allocation** (:func:`score_episode`, :func:`turn_credit`). Each
   reward plugin scores an episode at the level its config entry names. The
   credit of a turn ``t`` of role ``r`` is::

       credit(t) = sum over trajectory rewards  w * R
                 + sum over role rewards        w * R[r]
                 + sum over turn rewards        w * R[t.id]

   where a reward entry with ``roles: [...]`` only reaches turns of those
   roles. A failed episode (workflow exception) scores 0 everywhere.
2. **Grouping** (:func:`group_key`). Decides which turns are normalised
   together: ``role`` — all turns of one role across the G episodes of one
   task (default); ``role_turn`` — additionally split by the role's turn
   index; ``trajectory`` — all turns of the task's G episodes together.
3. **Estimation** (:func:`estimate_advantages`). One scalar credit per turn
   goes through an estimator with verl's signature, taken from the plugin
   registry first and verl's ``core_algos`` registry second (grpo, rloo,
   reinforce_plus_plus, ...). The advantage is broadcast over the turn's
   response tokens by the backend.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from unimas import verl_compat
from unimas.config import AlgorithmConfig, RewardConfig
from unimas.errors import UserError
from unimas.registry import Registry
from unimas.trajectory import GraphTrajectory, TurnNode


def reward_keys(rewards: Sequence[RewardConfig]) -> list[str]:
    """Stable names under which each reward entry's value is stored."""
    counts = Counter(r.name for r in rewards)
    return [r.name if counts[r.name] == 1 else f"{r.name}#{i}" for i, r in enumerate(rewards)]


def score_episode(
    trajectory: GraphTrajectory, rewards: Sequence[RewardConfig], functions: Mapping[str, Callable[..., Any]]
) -> None:
    """Run every reward plugin on one episode; values land in ``trajectory.rewards``."""
    for key, spec in zip(reward_keys(rewards), rewards):
        if trajectory.failed:
            trajectory.rewards[key] = 0.0 if spec.level == "trajectory" else {}
            continue
        value = functions[spec.name](trajectory, trajectory.task, **spec.params)
        if spec.level == "trajectory":
            if not isinstance(value, (int, float)):
                raise UserError(f"reward '{spec.name}' returned {type(value).__name__}; "
                                "at level 'trajectory' it must return a number", where=f"rewards.{key}")
            value = float(value)
        elif not isinstance(value, Mapping):
            raise UserError(f"reward '{spec.name}' returned {type(value).__name__}; at level '{spec.level}' it "
                            f"must return a dict of {spec.level} -> number", where=f"rewards.{key}")
        else:
            value = {str(k): float(v) for k, v in value.items()}
        trajectory.rewards[key] = value


def turn_credit(trajectory: GraphTrajectory, turn: TurnNode, rewards: Sequence[RewardConfig]) -> float:
    total = 0.0
    for key, spec in zip(reward_keys(rewards), rewards):
        if spec.roles is not None and turn.role not in spec.roles:
            continue
        value = trajectory.rewards.get(key, 0.0)
        if spec.level == "trajectory":
            total += spec.weight * value
        elif spec.level == "role":
            total += spec.weight * value.get(turn.role, 0.0)
        else:
            total += spec.weight * value.get(turn.id, 0.0)
    return total


def group_key(grouping: str, task_uid: str, turn: TurnNode) -> str:
    if grouping == "role":
        return f"{task_uid}|{turn.role}"
    if grouping == "role_turn":
        return f"{task_uid}|{turn.role}|{turn.role_turn_index}"
    return task_uid


@dataclass
class CreditedTurn:
    trajectory: GraphTrajectory
    turn: TurnNode
    credit: float
    key: str
    advantage: float = 0.0


def resolve_estimator(name: str, registry: Registry) -> Callable[..., Any] | str:
    if registry.has("estimators", name):
        return registry.get("estimators", name)
    if name in verl_compat.estimator_names():
        return name
    known = sorted(set(registry.names("estimators")) | set(verl_compat.estimator_names()))
    raise UserError(f"unknown estimator '{name}'. Known: {', '.join(known)}", where="algorithm.estimator")


def estimate_advantages(
    turns: list[CreditedTurn], algorithm: AlgorithmConfig, estimator: Callable[..., Any] | str
) -> dict[str, float]:
    """Fill ``advantage`` on every turn; returns grouping diagnostics."""
    if not turns:
        return {}
    scores = torch.tensor([[t.credit] for t in turns], dtype=torch.float32)
    mask = torch.ones_like(scores)
    index = np.array([t.key for t in turns], dtype=object)
    advantages = verl_compat.compute_estimator(
        estimator, scores, mask, index, norm_by_std=algorithm.norm_by_std, gamma=algorithm.gamma
    )
    for turn, value in zip(turns, advantages[:, 0].tolist()):
        turn.advantage = value
    by_key: dict[str, list[float]] = {}
    for t in turns:
        by_key.setdefault(t.key, []).append(t.credit)
    zero_var = sum(1 for v in by_key.values() if max(v) - min(v) < 1e-8)
    return {"zero_variance_groups": zero_var / len(by_key)}
