"""Self-play against earlier selves: frozen groups that play snapshots of a trainable group.

A group with ``snapshot: {of: policy, every: K, pool: N}`` is a frozen copy of
``policy`` that is refreshed every ``K`` steps from a pool of the ``N`` newest
snapshots of ``policy``. Why a pool and not just the latest weights: a policy
that only ever meets its current self can cycle, forgetting how to beat
strategies it no longer plays; drawing the opponent from several earlier
versions keeps them in the mix (fictitious self-play).

Snapshots live in ``<run>/snapshots/<group>/step_NNNNNN`` and hold weights
only, as a plain Hugging Face model (:meth:`unimas.ModelGroup.save_weights`):
no optimiser or sampling state, as the frozen group keeps its own random
stream, so learner and opponent never sample with the same noise. The format
is every backend's, so the learner may be a verl group and the frozen group a
torch one playing its snapshots. Which
snapshot is played is drawn from ``(trainer.seed, step, group)``, and snapshots
that fell out of the pool are deleted only once a checkpoint no longer needs
them, so a run resumed from its latest checkpoint draws the same opponents as
one never stopped; snapshots newer than that checkpoint are deleted, as those
steps are redone.

Each checkpoint records its pools (:data:`POOLS_FILE`: the snapshot each group
plays and the pool's steps). A resume checks that record and the pool's
weights (no pickle-format file, readable safetensors) inside the checkpoint
load, so a bad record or snapshot makes that checkpoint unusable, named,
rather than stopping the run when the snapshot is played. Every path the
pools write or delete must lie inside the run directory (a symlinked pool is
refused, see :meth:`RunDir.owned`).
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from unimas.config.schema import ExperimentConfig, SnapshotConfig
from unimas.errors import UserError
from unimas.groups.base import Transport
from unimas.groups.hf.weight_files import check_weights
from unimas.output.checkpoints import notice
from unimas.output.rundir import RunDir
from unimas.safe_load import load_json

SNAPSHOT_PREFIX = "step_"
POOLS_FILE = "snapshot_pools.json"
"""In a checkpoint: each snapshot group's pool and the snapshot it plays."""


class PoolRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    playing: NonNegativeInt = Field(description="the step of the snapshot the group plays")
    pool: list[NonNegativeInt] = Field(description="the steps of the pool's snapshots, oldest first")


class PoolsRecord(BaseModel):
    """:data:`POOLS_FILE`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    step: NonNegativeInt = Field(description="the checkpoint's step")
    groups: dict[str, PoolRecord]


class SnapshotPools:
    """The snapshot pools of a run's frozen snapshot groups (none: every call is a no-op)."""

    def __init__(self, config: ExperimentConfig, transport: Transport, run_dir: RunDir):
        self.pools: dict[str, SnapshotConfig] = {name: group.snapshot for name, group in config.models.items()
                                                 if group.snapshot is not None}
        self.transport = transport
        self.run_dir = run_dir
        self.root = run_dir.root / "snapshots"
        self.seed = config.trainer.seed
        self.playing: dict[str, int] = {}

    def directory(self, group: str) -> Path:
        return self.run_dir.owned(self.root / group)

    def taken(self, group: str) -> list[tuple[int, Path]]:
        """``(step, path)`` of every snapshot of the group on disk, oldest first."""
        found = self.directory(group).glob(f"{SNAPSHOT_PREFIX}*")
        steps = [(int(p.name[len(SNAPSHOT_PREFIX):]), p) for p in found
                 if p.is_dir() and p.name[len(SNAPSHOT_PREFIX):].isdigit()]
        return sorted(steps)

    def pool(self, group: str, step: int) -> list[tuple[int, Path]]:
        """The pool as of ``step``: the ``pool`` newest snapshots taken at or before it."""
        return [entry for entry in self.taken(group) if entry[0] <= step][-self.pools[group].pool:]

    async def start(self, step: int) -> None:
        """Before the first step of a run (``step`` 0) or of a resumed one (``step`` = the checkpoint's).

        A fresh run snapshots the initial weights; a resumed one drops snapshots taken after its checkpoint
        and leaves the frozen group as the checkpoint restored it (the opponent it was playing then).
        """
        for group, snapshot in self.pools.items():
            for taken, path in self.taken(group):
                if taken > step:
                    self.run_dir.delete(path)
            if not self.taken(group):
                await self._take(group, snapshot, step)
                await self._play(group, step)
            elif group not in self.playing:  # restored by load() from a checkpoint that recorded it
                self.playing[group] = self._choose(group, snapshot, step - step % snapshot.every)[0]

    async def after_step(self, step: int) -> dict[str, float]:
        """After training step ``step`` (1-based): snapshot and refresh on every ``every``-th step.

        Returns per-group metrics: the step of the snapshot being played and the pool size.
        """
        metrics: dict[str, float] = {}
        for group, snapshot in self.pools.items():
            if step % snapshot.every == 0:
                await self._take(group, snapshot, step)
                await self._play(group, step)
            metrics[f"snapshot/{group}/playing_step"] = float(self.playing[group])
            metrics[f"snapshot/{group}/pool_size"] = float(len(self.pool(group, step)))
        return metrics

    def checkpointed(self, step: int) -> None:
        """A checkpoint of ``step`` is complete: snapshots older than its pool are no longer needed."""
        for group in self.pools:
            keep = {path for _, path in self.pool(group, step)}
            for taken, path in self.taken(group):
                if taken < step and path not in keep:
                    self.run_dir.delete(path)

    def save(self, directory: Path, step: int) -> None:
        """Record the pools into the checkpoint of ``step`` (nothing without snapshot groups)."""
        if not self.pools:
            return
        groups = {group: PoolRecord(playing=self.playing[group], pool=[taken for taken, _ in self.pool(group, step)])
                  for group in sorted(self.pools)}
        record = PoolsRecord(step=step, groups=groups)
        (directory / POOLS_FILE).write_text(json.dumps(record.model_dump(), indent=1))

    def load(self, directory: Path, step: int) -> dict[str, int]:
        """Check the checkpoint of ``step``'s pool record and pooled snapshots; the snapshot each group plays.

        A checkpoint without the record (written before it existed) gives
        nothing: :meth:`start` draws as before; so does one of another run
        directory (``unimas eval --checkpoint``), which plays no pool. A record of another step or
        other groups, or a pooled snapshot with bad weights, is a
        :class:`UserError` naming the file. A pooled snapshot a later
        checkpoint already deleted is announced; the pool goes on without it.
        """
        path = directory / POOLS_FILE
        if not self.pools or not path.exists() or not self._ours(directory):
            return {}
        record = load_json(path, PoolsRecord)
        if record.step != step:
            raise UserError(f"records step {record.step}, but it sits in the checkpoint of step {step} (copied "
                            "from another checkpoint or run?)", where=str(path))
        if set(record.groups) != set(self.pools):
            raise UserError(f"records pools of {', '.join(sorted(record.groups)) or 'no group'}, but this run's "
                            f"snapshot groups are {', '.join(sorted(self.pools))} (another run's file?)",
                            where=str(path))
        for group, pool in record.groups.items():
            if any(taken > step for taken in (pool.playing, *pool.pool)):
                raise UserError(f"{group}: plays snapshot {pool.playing} of pool {pool.pool}, taken after step "
                                f"{step}, which a checkpoint of step {step} cannot hold", where=str(path))
            for taken in pool.pool:  # read only: start() refuses a pool outside the run before writing to it
                snapshot = self.root / group / f"{SNAPSHOT_PREFIX}{taken:06d}"
                if snapshot.is_dir():
                    check_weights(snapshot)
                else:
                    notice(f"snapshot {snapshot} of this checkpoint's pool was deleted after it (a later checkpoint "
                           "no longer needed it): the pool goes on without it")
        return {group: pool.playing for group, pool in record.groups.items()}

    def _ours(self, checkpoint: Path) -> bool:
        return Path(checkpoint).absolute().parent == (self.run_dir.root / "checkpoints").absolute()

    def restore(self, playing: dict[str, int]) -> None:
        """Play what :meth:`load` returned (the checkpoint has restored the groups' weights)."""
        self.playing = dict(playing)

    async def _take(self, group: str, snapshot: SnapshotConfig, step: int) -> None:
        target = self.directory(group) / f"{SNAPSHOT_PREFIX}{step:06d}"
        partial = target.with_name(target.name + ".partial")
        for stale in (partial, target):
            if stale.exists():
                self.run_dir.delete(stale)
        partial.parent.mkdir(parents=True, exist_ok=True)
        await self.transport.save_weights(snapshot.of, partial)
        partial.rename(target)

    async def _play(self, group: str, step: int) -> None:
        taken, path = self._choose(group, self.pools[group], step)
        await self.transport.load_weights(group, path)
        self.playing[group] = taken

    def _choose(self, group: str, snapshot: SnapshotConfig, step: int) -> tuple[int, Path]:
        pool = self.pool(group, step)
        if snapshot.pick == "latest":
            return pool[-1]
        rng = random.Random(self.seed * 1_000_003 + step * 7919 + zlib.crc32(group.encode()))
        return rng.choice(pool)
