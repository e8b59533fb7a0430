"""Per-step metrics: names are a contract (see docs/metrics.md)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from unimas.credit import CreditedTurn
from unimas.trajectory import GraphTrajectory


def _mean(values: list[float]) -> float:
    return float(statistics.fmean(values)) if values else 0.0


def _std(values: list[float]) -> float:
    """Population std; numpy because ``statistics.pstdev`` computes in exact fractions (slow per step)."""
    return float(np.std(values)) if len(values) > 1 else 0.0


def rollout_metrics(
    trajectories: list[GraphTrajectory], credited: list[CreditedTurn], roles: Iterable[str], primary_reward: str | None
) -> dict[str, float]:
    """Reward, per-role and per-episode statistics of one batch of episodes."""
    metrics: dict[str, float] = {}
    episode_rewards = [
        float(t.rewards.get(primary_reward, 0.0)) if primary_reward else 0.0 for t in trajectories
    ]
    metrics["reward/mean"] = _mean(episode_rewards)
    metrics["reward/std"] = _std(episode_rewards)
    by_role: dict[str, list[CreditedTurn]] = defaultdict(list)
    for c in credited:
        by_role[c.turn.role].append(c)
    all_turns = defaultdict(list)
    for traj in trajectories:
        for turn in traj.turns():
            all_turns[turn.role].append(turn)
    for role in roles:
        turns = all_turns.get(role, [])
        rewards = [t.reward for t in turns if t.reward is not None]
        advantages = [c.advantage for c in by_role.get(role, [])]
        keys: dict[str, list[float]] = defaultdict(list)
        for c in by_role.get(role, []):
            keys[c.key].append(c.credit)
        flat = [k for k, v in keys.items() if max(v) - min(v) < 1e-8]
        prefix = f"role/{role}/"
        metrics[prefix + "reward_mean"] = _mean(rewards)
        metrics[prefix + "reward_std"] = _std(rewards)
        metrics[prefix + "advantage_std"] = _std(advantages)
        metrics[prefix + "format_error_rate"] = _mean([float(t.parse_error is not None) for t in turns])
        metrics[prefix + "response_length"] = _mean([float(len(t.response_ids)) for t in turns])
        metrics[prefix + "zero_variance_frac"] = len(flat) / len(keys) if keys else 0.0
        metrics[prefix + "turns"] = float(len(turns))
    metrics["episode/turns"] = _mean([float(len(t.turns())) for t in trajectories])
    metrics["episode/tool_calls"] = _mean([float(len(t.tool_calls())) for t in trajectories])
    metrics["episode/failures"] = float(sum(t.failed for t in trajectories))
    metrics["episode/wall_s"] = _mean([t.ended - t.started for t in trajectories])
    return metrics


def throughput_metrics(trajectories: list[GraphTrajectory], group_metrics: dict[str, float]) -> dict[str, float]:
    """Generation and training throughput per model group.

    ``gen_time_s`` is the wall time during which at least one of the group's
    requests was queued or generating (union of the turns' intervals).
    """
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    tokens: dict[str, int] = defaultdict(int)
    for traj in trajectories:
        for turn in traj.turns():
            spans[turn.model_group].append((turn.started, turn.ended))
            tokens[turn.model_group] += len(turn.response_ids)
    metrics: dict[str, float] = {}
    for group, intervals in spans.items():
        busy, covered = 0.0, float("-inf")
        for start, end in sorted(intervals):
            busy += max(0.0, end - max(start, covered))
            covered = max(covered, end)
        metrics[f"group/{group}/gen_time_s"] = busy
        metrics[f"group/{group}/gen_tokens_per_s"] = tokens[group] / busy if busy > 0 else 0.0
    for key, seconds in group_metrics.items():
        if key.endswith("/update_time_s"):
            prefix = key[: -len("update_time_s")]
            metrics[prefix + "train_tokens_per_s"] = group_metrics[prefix + "tokens"] / seconds if seconds > 0 else 0.0
    return metrics


class MetricsWriter:
    """Appends one JSON object per line, flushed per line, so a killed run stays readable."""

    def __init__(self, path: Path):
        self.path = path
        self._handle = open(path, "a", buffering=1)

    def write(self, record: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl``, ignoring a torn last line from a killed run."""
    records = []
    with open(path) as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
