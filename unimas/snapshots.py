"""Self-play against earlier selves: frozen groups that play snapshots of a trainable group.

A group with ``snapshot: {of: policy, every: K, pool: N}`` is a frozen copy of
``policy`` that is refreshed every ``K`` steps from a pool of the ``N`` newest
snapshots of ``policy``. Why a pool and not just the latest weights: a policy
that only ever meets its current self can cycle, forgetting how to beat
strategies it no longer plays; drawing the opponent from several earlier
versions keeps them in the mix (fictitious self-play).

Snapshots live in ``<run>/snapshots/<group>/step_NNNNNN`` and hold weights
only (no optimiser or sampling state: the frozen group keeps its own random
stream, so learner and opponent never sample with the same noise). Which
snapshot is played is drawn from ``(trainer.seed, step, group)``, and snapshots
that fell out of the pool are deleted only once a checkpoint no longer needs
them, so a run resumed from its latest checkpoint draws the same opponents as
one never stopped; snapshots newer than that checkpoint are deleted, as those
steps are redone.
"""

from __future__ import annotations

import random
import shutil
import zlib
from pathlib import Path

from unimas.config import ExperimentConfig, SnapshotConfig
from unimas.groups.torch.checkpoint import keep_weights_only
from unimas.groups.transport import Transport
from unimas.rundir import RunDir

SNAPSHOT_PREFIX = "step_"


class SnapshotPools:
    """The snapshot pools of a run's frozen snapshot groups (none: every call is a no-op)."""

    def __init__(self, config: ExperimentConfig, transport: Transport, run_dir: RunDir):
        self.pools: dict[str, SnapshotConfig] = {name: group.snapshot for name, group in config.models.items()
                                                 if group.snapshot is not None}
        self.transport = transport
        self.root = run_dir.root / "snapshots"
        self.seed = config.trainer.seed
        self.playing: dict[str, int] = {}

    def directory(self, group: str) -> Path:
        return self.root / group

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
                    shutil.rmtree(path)
            if not self.taken(group):
                await self._take(group, snapshot, step)
                await self._play(group, step)
            else:
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
                    shutil.rmtree(path)

    async def _take(self, group: str, snapshot: SnapshotConfig, step: int) -> None:
        target = self.directory(group) / f"{SNAPSHOT_PREFIX}{step:06d}"
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        await self.transport.save(snapshot.of, partial)
        keep_weights_only(partial)
        partial.rename(target)

    async def _play(self, group: str, step: int) -> None:
        taken, path = self._choose(group, self.pools[group], step)
        await self.transport.load(group, path)
        self.playing[group] = taken

    def _choose(self, group: str, snapshot: SnapshotConfig, step: int) -> tuple[int, Path]:
        pool = self.pool(group, step)
        if snapshot.pick == "latest":
            return pool[-1]
        rng = random.Random(self.seed * 1_000_003 + step * 7919 + zlib.crc32(group.encode()))
        return rng.choice(pool)
