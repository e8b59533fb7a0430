"""The asynchronous pipeline: episodes for the next steps are generated while model groups update on this one.

Depth. ``depth`` = the largest ``algorithm.max_staleness`` of a trainable
group. The rollout of step ``k`` may start once the update of step
``k - 1 - depth`` is done, so while groups update on step ``k`` the rollouts
of steps ``k+1 .. k+depth`` run with the weights the groups have. Depth 0 is
the synchronous loop itself (collect, then update), call for call.

Versions and staleness. Each group counts its updates (its weight version)
and stamps every result with the version that sampled it; a torch group
sampling in a rollout process (``options.rollout_process``) stamps the
version that process reports it sampled with
(``unimas/groups/torch/rollout_replica.py``), so the bookkeeping below needs
no change for it.
:class:`WeightVersions` is the trainer's count of the same updates; a turn's
staleness is that count minus the turn's version when the turn is trained.
A group's own ``max_staleness`` may be lower than the pipeline's depth: its
turns past the bound are dropped, or trained re-weighted
(``algorithm.stale_turns``). Turns within the bound train with the truncated
importance ratio against their recorded log-probs (see
``unimas/groups/torch/learner.py``).

Checkpoints. Saving step ``N`` first lets every rollout in flight finish;
the finished rollouts not yet trained (steps ``N+1 .. N+depth``) are written
into the checkpoint (:data:`PENDING`, one trajectory per line) and trained,
not regenerated, after a resume: no step is lost and no turn trained twice.
Each line is checked on load (:class:`PendingRollout`): a rollout recorded
for a step the checkpoint already trained, or played by a role this run does
not have, makes the checkpoint unusable instead of being dropped or trained.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any, Awaitable, Callable, Collection

from pydantic import BaseModel, ConfigDict, Field

from unimas.algorithms.credit import CreditedTurn
from unimas.config.schema import ExperimentConfig
from unimas.errors import UserError
from unimas.output.checkpoints import notice
from unimas.safe_load import parse_json_line, read_bytes, reading
from unimas.trajectory import GraphTrajectory

PENDING = "pending_rollouts.jsonl"
"""Rollouts generated ahead of a checkpoint's step, saved with it."""


def pipeline_depth(config: ExperimentConfig) -> int:
    """How many steps rollouts run ahead of updates: the largest ``max_staleness`` of a trainable group."""
    return max((config.algorithm_for(g).max_staleness for g, m in config.models.items() if m.trainable), default=0)


class PendingRollout(BaseModel):
    """One line of :data:`PENDING`: a finished, untrained episode and the (0-based) step it belongs to."""

    model_config = ConfigDict(extra="forbid", strict=True)
    step: int = Field(ge=0)
    episode: dict[str, Any]


def read_pending(directory: Path, checkpoint_step: int, roles: Collection[str]) -> dict[int, list[GraphTrajectory]]:
    """The rollouts a checkpoint of ``checkpoint_step`` saved, by step; none when it has no :data:`PENDING`.

    A line that does not parse, an episode of a step the checkpoint already
    trained (0-based step below ``checkpoint_step``), of a step it cannot hold
    (the pipeline starts steps in order, so the saved ones are the steps right
    after ``checkpoint_step`` with none missing) or of a role not in ``roles``
    is a :class:`UserError` naming the file and line.
    """
    path = directory / PENDING
    if not path.exists():
        return {}
    ready: dict[int, list[GraphTrajectory]] = defaultdict(list)
    first_line: dict[int, int] = {}
    with reading(path):  # a FIFO or /dev/zero planted here would block or never end: refused, named
        lines = read_bytes(path).decode("utf-8").splitlines()
    for number, text in enumerate(lines, 1):
        record = parse_json_line(text, PendingRollout, path, number)
        where = f"{path}:{number}"
        if record.step < checkpoint_step:
            raise UserError(f"a rollout of step {record.step + 1}, which the checkpoint of step {checkpoint_step} "
                            "already trained (copied from another checkpoint or run?): refused, not dropped",
                            where=where)
        with reading(Path(where)):
            episode = GraphTrajectory.from_dict(record.episode)
        strangers = sorted({turn.role for turn in episode.turns()} - set(roles))
        if strangers:
            raise UserError(f"an episode played by role(s) {', '.join(strangers)}, which this run does not have "
                            "(another run's file?)", where=where)
        ready[record.step].append(episode)
        first_line.setdefault(record.step, number)
    for expected, step in enumerate(sorted(ready), start=checkpoint_step):
        if step != expected:
            raise UserError(f"rollouts of step {step + 1}, but the checkpoint of step {checkpoint_step} can hold "
                            f"only the steps right after it, in order (step {expected + 1} is missing): copied "
                            "from another checkpoint or run? Refused, not dropped",
                            where=f"{path}:{first_line[step]}")
    return dict(ready)


class RolloutPipeline:
    """Rollouts of steps started ahead, by step; ``take(step)`` hands a step's trajectories over once."""

    def __init__(self, collect: Callable[[int], Awaitable[list[GraphTrajectory]]], depth: int, steps: int):
        self.collect = collect
        self.depth = depth
        self.steps = steps
        self.running: dict[int, asyncio.Task] = {}
        self.ready: dict[int, list[GraphTrajectory]] = {}

    async def take(self, step: int) -> list[GraphTrajectory]:
        """Start the rollouts of ``step .. step + depth`` not started yet; the trajectories of ``step``."""
        if self.depth == 0 and step not in self.ready:
            return await self.collect(step)
        for ahead in range(step, min(step + self.depth, self.steps - 1) + 1):
            if ahead not in self.running and ahead not in self.ready:
                self.running[ahead] = asyncio.create_task(self.collect(ahead))
        if step in self.ready:
            return self.ready.pop(step)
        return await self.running.pop(step)

    async def drain(self) -> dict[int, list[GraphTrajectory]]:
        """Let every rollout in flight finish; the finished, untrained ones by step."""
        for step in sorted(self.running):
            self.ready[step] = await self.running.pop(step)
        return self.ready

    async def close(self) -> None:
        """Cancel what is still running (the run ended early or failed)."""
        for task in self.running.values():
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        self.running.clear()

    # -- persistence ------------------------------------------------------
    async def save(self, directory: Path) -> None:
        pending = await self.drain()
        if not pending:
            return
        with open(directory / PENDING, "w") as handle:
            for step in sorted(pending):
                for trajectory in pending[step]:  # to_json: what user code returned may be values JSON refuses
                    handle.write(f'{{"step":{int(step)},"episode":{trajectory.to_json()}}}\n')

    def load(self, ready: dict[int, list[GraphTrajectory]]) -> None:
        """Continue with the rollouts a checkpoint saved (:func:`read_pending`); those of steps past the run's end
        (``trainer.steps`` lowered on resume) are dropped with a notice, never silently."""
        beyond = sorted(step for step in ready if step >= self.steps)
        if beyond:
            count = sum(len(ready[step]) for step in beyond)
            notice(f"{count} pending rollout(s) saved in the checkpoint ({PENDING}) for step(s) "
                   f"{', '.join(str(step + 1) for step in beyond)} are not trained: this run ends at step "
                   f"{self.steps} (trainer.steps)")
        self.ready = {step: episodes for step, episodes in ready.items() if step < self.steps}


class WeightVersions:
    """The trainer's count of each group's updates, and the staleness of turns measured against it."""

    def __init__(self, config: ExperimentConfig, versions: dict[str, int] | None = None):
        self.versions: dict[str, int] = defaultdict(int, versions or {})
        self._owner = {name: role.model for name, role in config.roles.items()}
        """Role -> the model group that trains it."""
        self._algorithms = {group: config.algorithm_for(group) for group in config.models}
        """Each group's algorithm settings (its overrides applied), read once per run, not once per turn."""

    def admit(self, credited: list[CreditedTurn]) -> tuple[list[CreditedTurn], dict[str, float]]:
        """Write each turn's staleness; drop turns past their group's bound (``stale_turns: drop``).

        A turn that arrives with a staleness already (an episode replay mixed in) is trained as it is: the
        bound is about the pipeline, and the group still corrects such a turn by its importance ratio.

        Returns the turns to train and ``group/<g>/staleness_mean|max`` and ``stale_dropped``.
        """
        kept: list[CreditedTurn] = []
        seen: dict[str, list[int]] = defaultdict(list)
        dropped: dict[str, int] = defaultdict(int)
        for c in credited:
            group = self._owner[c.turn.role]
            if c.turn.staleness > 0:  # mixed in by replay (unimas/training/replay.py), on purpose: kept, as recorded
                seen[group].append(c.turn.staleness)
                kept.append(c)
                continue
            version = c.turn.weight_version
            staleness = 0 if version is None else self.versions[group] - version
            c.turn.staleness = staleness
            seen[group].append(staleness)
            algorithm = self._algorithms[group]
            if staleness > algorithm.max_staleness and algorithm.stale_turns == "drop":
                dropped[group] += 1
            else:
                kept.append(c)
        metrics = {}
        for group, values in seen.items():
            metrics[f"group/{group}/staleness_mean"] = sum(values) / len(values)
            metrics[f"group/{group}/staleness_max"] = float(max(values))
            metrics[f"group/{group}/stale_dropped"] = float(dropped[group])
        return kept, metrics

    def advance(self, trained: list[CreditedTurn], group_metrics: dict[str, float]) -> None:
        """Count the step's updates: a group's reported version, else one more for a group that returned
        update metrics without one (a backend that does not count); a group that was not updated keeps its."""
        for group in {self._owner[role] for role in {c.turn.role for c in trained}}:
            reported = group_metrics.get(f"group/{group}/weight_version")
            if reported is not None:
                self.versions[group] = int(reported)
            elif any(key.startswith(f"group/{group}/") for key in group_metrics):
                self.versions[group] += 1

    def state(self) -> dict[str, int]:
        return dict(self.versions)
