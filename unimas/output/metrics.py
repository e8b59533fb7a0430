"""Per-step metrics: names are a contract (see docs/metrics.md)."""

from __future__ import annotations

import errno
import json
import os
import stat
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from unimas.algorithms.credit import reward_keys
from unimas.config.schema import ExperimentConfig
from unimas.errors import UserError
from unimas.output.jsonl import text_lines
from unimas.safe_load import open_regular
from unimas.trajectory import GraphTrajectory


def _mean(values: list[float]) -> float:
    return float(statistics.fmean(values)) if values else 0.0


def _std(values: list[float]) -> float:
    """Population std; numpy because ``statistics.pstdev`` computes in exact fractions (slow per step)."""
    return float(np.std(values)) if len(values) > 1 else 0.0


def rollout_metrics(trajectories: list[GraphTrajectory], roles: Iterable[str],
                    primary_reward: str | None) -> dict[str, float]:
    """Reward, per-role and per-episode statistics of one batch of episodes (credit diagnostics come from credit)."""
    metrics: dict[str, float] = {}
    episode_rewards = [float(t.rewards.get(primary_reward, 0.0)) if primary_reward else 0.0 for t in trajectories]
    metrics["reward/mean"] = _mean(episode_rewards)
    metrics["reward/std"] = _std(episode_rewards)
    turns_by_role = defaultdict(list)
    for traj in trajectories:
        for turn in traj.turns():
            turns_by_role[turn.role].append(turn)
    for role in roles:
        turns = turns_by_role.get(role, [])
        rewards = [t.reward for t in turns if t.reward is not None]
        prefix = f"role/{role}/"
        metrics[prefix + "reward_mean"] = _mean(rewards)
        metrics[prefix + "reward_std"] = _std(rewards)
        metrics[prefix + "advantage_std"] = 0.0  # credit overwrites both for roles with trainable turns
        metrics[prefix + "zero_variance_frac"] = 0.0
        metrics[prefix + "format_error_rate"] = _mean([float(t.parse_error is not None) for t in turns])
        metrics[prefix + "response_length"] = _mean([float(len(t.response_ids)) for t in turns])
        metrics[prefix + "truncated_prompts"] = _mean([float(t.truncated) for t in turns])
        metrics[prefix + "rerendered_turns"] = float(sum(t.rerendered is not None for t in turns))
        metrics[prefix + "turns"] = float(len(turns))
    metrics["episode/turns"] = _mean([float(len(t.turns())) for t in trajectories])
    metrics["episode/tool_calls"] = _mean([float(len(t.tool_calls())) for t in trajectories])
    metrics["episode/failures"] = float(sum(t.failed for t in trajectories))
    metrics["episode/wall_s"] = _mean([t.ended - t.started for t in trajectories])
    metrics.update(workflow_metrics(trajectories))
    return metrics


def workflow_metrics(trajectories: list[GraphTrajectory], prefix: str = "workflow/") -> dict[str, float]:
    """What workflows logged with ``ctx.metric``: per name, the mean over the episodes that logged it (each
    episode weighs one, with the mean of its own values) and how many episodes did (``<name>/count``)."""
    per_episode: dict[str, list[float]] = defaultdict(list)
    for traj in trajectories:
        for name, values in traj.metrics.items():
            if values:
                per_episode[name].append(_mean(values))
    metrics: dict[str, float] = {}
    for name in sorted(per_episode):
        metrics[f"{prefix}{name}"] = _mean(per_episode[name])
        metrics[f"{prefix}{name}/count"] = float(len(per_episode[name]))
    return metrics


def evaluation_metrics(trajectories: list[GraphTrajectory], config: ExperimentConfig, primary_reward: str | None,
                       samples: int) -> dict[str, float]:
    """``eval/*``: trajectory-level rewards, the primary one as ``eval/accuracy``, pass@k, per-role rewards."""
    metrics: dict[str, float] = {}
    for key, spec in zip(reward_keys(config.rewards), config.rewards):
        if spec.level == "trajectory":
            metrics[f"eval/reward/{key}"] = _mean([t.rewards[key] for t in trajectories])
    if primary_reward is not None:
        metrics["eval/accuracy"] = metrics[f"eval/reward/{primary_reward}"]
        if samples > 1:
            by_task: dict[str, list[float]] = defaultdict(list)
            for t in trajectories:
                by_task[t.task_id].append(t.rewards[primary_reward])
            metrics[f"eval/pass@{samples}"] = sum(max(v) >= 1.0 for v in by_task.values()) / len(by_task)
    for role in config.roles:
        turns = [turn for t in trajectories for turn in t.turns(role)]
        if turns:
            metrics[f"eval/role/{role}/reward_mean"] = _mean([t.reward for t in turns])
    metrics["eval/failures"] = float(sum(t.failed for t in trajectories))
    metrics.update(workflow_metrics(trajectories, prefix="eval/workflow/"))
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


def append_regular(path: Path) -> int:
    """A descriptor appending to ``path``, created when missing; a pipe or a device there is a :class:`UserError`.

    Opening a FIFO for writing waits for a reader that never comes (a resume then hung before its first step),
    and writing metrics into a device loses them; opened without blocking and checked on the descriptor.
    """
    refused = UserError("not a regular file (a pipe or a device where the run writes its metrics)", where=str(path))
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise refused from None
        raise UserError(f"cannot be written: {exc.strerror or exc}", where=str(path)) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise refused
    os.set_blocking(descriptor, True)
    return descriptor


class MetricsWriter:
    """Appends one JSON object per line, flushed per line, so a killed run stays readable."""

    def __init__(self, path: Path):
        self.path = path
        self._handle = open(append_regular(path), "a", buffering=1)

    def write(self, record: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def read_metrics(path: Path, skipped: list[tuple[int, str]] | None = None) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl``, keeping only records a reader can plot.

    A torn last line (killed run), damaged or over-long lines and records
    without an integer ``step`` are left out, each appended to ``skipped`` as
    (line number, why) so a report can name what it did not show. Invalid
    UTF-8 is replaced, not fatal. Raises ``OSError`` when the file cannot be read, or is not a regular file.
    """
    notes: list[tuple[int, str]] = [] if skipped is None else skipped
    records = []
    with open_regular(path) as handle:  # a FIFO or /dev/zero planted as metrics.jsonl would never end
        # a step's record is a few KB; a line over 1 MiB is damage, not worth the memory
        for number, text, complete in text_lines(handle, lambda n, why: notes.append((n, why)), 1 << 20):
            try:
                record = json.loads(text)
            except (ValueError, RecursionError):  # also too-long integers and too-deep nesting
                notes.append((number, "not valid JSON" if complete else "torn last line (run killed?)"))
                continue
            step = record.get("step") if isinstance(record, dict) else None
            if not isinstance(record, dict):
                notes.append((number, f"not a JSON object ({type(record).__name__})"))
            elif isinstance(step, bool) or not isinstance(step, int):
                notes.append((number, f"step is {json.dumps(step)[:40]}, not an integer"))
            else:
                records.append(record)
    return records
