"""Checkpoints of a training run: writing one, and resuming the run from one.

A checkpoint holds everything the next step depends on: each model group's
weights, optimiser and random streams (written by the group, through the
transport), the rollouts generated ahead of the step (the pipeline), the
replay buffer (the rollout), the snapshot pools, the loop's own counters
(``trainer_state.json``) and the manifest that vouches for all of them;
``COMPLETE`` is written last (the run directory: ``unimas/output/rundir.py``;
manifests and the choice of checkpoint: ``unimas/output/checkpoints.py``).

This is apart from the loop (``trainer.py``) because the order of these
writes and reads is what makes a resumed run bit-identical to one never
stopped, whatever step the loop is on: the loop decides when to save, this
module how. Restoring reads and checks every state file before anything
changes, so a bad checkpoint leaves nothing half-loaded and the resume falls
back to an older one. The objects whose state a checkpoint holds are handed
to :class:`Checkpointer`; the loop's counters go in and come out as a
:class:`TrainerState`, which the loop applies itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from unimas.config.schema import ExperimentConfig
from unimas.errors import UserError
from unimas.groups.base import Transport
from unimas.output import checkpoints
from unimas.output.metrics import read_metrics
from unimas.output.rundir import (
    TRAINER_STATE,
    RunDir,
    TrainerState,
    checkpoint_step,
    mark_complete,
    read_trainer_state,
    write_trainer_state,
)
from unimas.training.pipeline import RolloutPipeline, read_pending
from unimas.training.rollout import Rollout
from unimas.training.snapshots import SnapshotPools


class RunAlreadyComplete(Exception):
    """``--resume`` of a run whose checkpoint already has every step trained (or its stop condition met):
    nothing to do, which ``unimas train`` reports in one line with exit code 0."""


class Checkpointer:
    """Writes the checkpoints of one run and restores the run from them."""

    def __init__(self, config: ExperimentConfig, run_dir: RunDir, transport: Transport, pipeline: RolloutPipeline,
                 rollout: Rollout, snapshots: SnapshotPools):
        self.config = config
        self.run_dir = run_dir
        self.transport = transport
        self.pipeline = pipeline
        self.rollout = rollout
        self.snapshots = snapshots
        self.groups = sorted(config.models)

    async def save(self, state: TrainerState) -> Path:
        """The checkpoint of ``state.step``: groups, trainer state, manifest, then ``COMPLETE``; older checkpoints,
        and snapshots no checkpoint needs any more, are pruned only after that."""
        step = state.step
        directory = self.run_dir.checkpoint(step)
        directory.mkdir(parents=True, exist_ok=True)
        await self.pipeline.save(directory)  # first: rollouts in flight finish before the groups' RNG is saved
        await asyncio.gather(*(self.transport.save(g, directory / g) for g in self.groups))
        self.rollout.save(directory)
        self.snapshots.save(directory, step)
        write_trainer_state(directory, state)
        checkpoints.write_manifest(directory, step, self.config)
        mark_complete(directory)
        self.run_dir.prune(self.config.trainer.keep_checkpoints)
        self.snapshots.checkpointed(step)
        return directory

    async def load(self, directory: Path, manifest: checkpoints.Manifest | None = None) -> TrainerState:
        """Restore every group, the pipeline, the rollout and the snapshot pools from a complete checkpoint;
        the loop's state it recorded, with each group's weight version (counted for older states).

        Files are checked against ``manifest.json`` first (``manifest``: already
        checked); a damaged file is a :class:`UserError` naming it. A checkpoint
        without a manifest loads with a notice: it cannot be verified.
        """
        if manifest is None and not (directory / checkpoints.MANIFEST).exists():
            checkpoints.notice(f"{directory} has no {checkpoints.MANIFEST}: its files cannot be verified")
        elif manifest is None:
            manifest = checkpoints.verify(directory)
        # the state files first, and checked whole, before anything changes: a bad one leaves nothing half-loaded
        state = read_trainer_state(directory, _checkpoint_step(directory, manifest))
        step = state.step
        versions = _weight_versions(self.config, directory, state)
        pending = read_pending(directory, step, self.config.roles)
        playing = self.snapshots.load(directory, step)
        await asyncio.gather(*(self.transport.load(g, directory / g) for g in self.groups))
        self.rollout.load(directory, last_step=max(pending, default=step - 1))
        self.pipeline.load(pending)
        self.snapshots.restore(playing)
        return state.model_copy(update={"weight_versions": versions})

    async def resume(self) -> TrainerState | None:
        """Restore the run from its newest usable checkpoint (see :func:`checkpoints.resume`); the loop's state
        there, or None when none is usable and the run starts over from step 0.

        Raises :class:`RunAlreadyComplete` when that checkpoint ends the run.
        """
        restored: list[TrainerState] = []

        async def load(directory: Path, manifest: checkpoints.Manifest) -> int:
            restored.append(await self.load(directory, manifest))
            return restored[-1].step

        step = await checkpoints.resume(self.run_dir, self.config, load, reset=self._initial_weights)
        self._refuse_if_complete(step)
        return restored[-1] if restored else None

    async def _initial_weights(self) -> None:
        """Every group back to its initial weights: a checkpoint that failed to load must leave nothing behind."""
        await asyncio.gather(*(self.transport.restart(g, None) for g in self.groups))

    def _refuse_if_complete(self, step: int) -> None:
        """Raise :class:`RunAlreadyComplete` when the checkpoint resumed at ``step`` ends the run: it is of
        ``trainer.steps`` (or later), or its step's record meets the stop condition in force."""
        if step >= self.config.trainer.steps:
            raise RunAlreadyComplete(f"already complete at step {step} (trainer.steps: {self.config.trainer.steps}); "
                                     "nothing to resume")
        stop = self.config.stop_condition
        try:
            logged = read_metrics(self.run_dir.metrics) if step and self.run_dir.metrics.exists() else []
        except OSError as exc:  # unreadable, or a pipe or device in the run's place
            raise UserError(f"cannot be read to resume: {exc.strerror or exc}", where=str(self.run_dir.metrics)) \
                from None
        records = [r for r in logged if r["step"] == step]
        if stop is not None and records and stop.reached(records[-1]):
            field = "trainer.stop_when" if self.config.trainer.stop_when is not None else "trainer.stop_at_accuracy"
            raise RunAlreadyComplete(f"already complete at step {step} ({field} was met there); nothing to resume")


def _checkpoint_step(directory: Path, manifest: checkpoints.Manifest | None) -> int | None:
    """The step the checkpoint is of, by its manifest and its ``step_N`` name; None when neither says."""
    named = checkpoint_step(directory)
    if manifest is not None and named is not None and manifest.step != named:
        raise UserError(f"says step {manifest.step}, but the checkpoint directory is of step {named} (copied "
                        "from another checkpoint or run?)", where=str(directory / checkpoints.MANIFEST))
    return manifest.step if manifest is not None else named


def _weight_versions(config: ExperimentConfig, directory: Path, state: TrainerState) -> dict[str, int]:
    """Each trainable group's update count (older states: one update per step); unknown groups are refused."""
    trainable = [g for g, m in config.models.items() if m.trainable]
    if state.weight_versions is None:
        return dict.fromkeys(trainable, state.step)
    strangers = sorted(set(state.weight_versions) - set(config.models))
    if strangers:
        raise UserError(f"weight_versions counts updates of group(s) {', '.join(strangers)}, which this run "
                        "does not have (another run's file?)", where=str(directory / TRAINER_STATE))
    return state.weight_versions
