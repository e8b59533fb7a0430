"""Small helpers the built-in methods share: per-turn histories, grouped statistics (and ``episode_return``)."""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from typing import Hashable, Iterable, Sequence

from unimas import GraphTrajectory, TurnNode
from unimas.methods import episode_return  # noqa: F401 - one definition of an episode's return for all methods


def history_key(trajectory: GraphTrajectory, turn: TurnNode) -> str:
    """The turn's state: task, role and the exact token context the model saw (its prompt ids)."""
    digest = hashlib.sha1(repr(turn.prompt_ids).encode()).hexdigest()[:16]
    return f"{trajectory.task_id}|{turn.role}|{digest}"


def group_means(pairs: Iterable[tuple[Hashable, float]]) -> dict[Hashable, tuple[float, float, int]]:
    """``key -> (mean, population std, count)``."""
    values: dict[Hashable, list[float]] = defaultdict(list)
    for key, value in pairs:
        values[key].append(value)
    return {k: (statistics.fmean(v), statistics.pstdev(v), len(v)) for k, v in values.items()}


def leave_one_out(values: Sequence[float]) -> list[float]:
    """Each value minus the mean of the others (RLOO); 0 for a group of one."""
    if len(values) < 2:
        return [0.0] * len(values)
    total = sum(values)
    return [v - (total - v) / (len(values) - 1) for v in values]
