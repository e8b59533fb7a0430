"""The run directory layout, a contract other tools rely on (see DESIGN.md).

::

    RUN_DIR/
      config.yaml                 resolved config
      metrics.jsonl               one JSON object per step (line-buffered)
      trajectories/train.jsonl    sampled training episodes (graph JSON)
      trajectories/eval.jsonl     evaluation episodes
      checkpoints/step_000050/    one dir per model group + trainer_state.json + manifest.json
                                  (+ pending_rollouts.jsonl, replay_state.json, snapshot_pools.json
                                  when the run has them) + COMPLETE (written last: marks a finished checkpoint)
      snapshots/<group>/step_N/   a snapshot pool's weights (unimas/training/snapshots.py)
      checkpoints/damaged-step_N/ a damaged checkpoint a resume skipped (kept for inspection)
      run_end.json                how training ended: finished, stopped (trainer.stop_when), crashed or
                                  interrupted, at which step (unimas/output/run_end.py); none while running
                                  or after a kill
      report.html, plots/*.png    written by `unimas report`

Every path a run writes or deletes goes through :meth:`RunDir.owned`: it must
resolve (symlinks followed) inside the run directory, so a symlinked
``checkpoints/``, checkpoint or snapshot pool that points elsewhere is
refused (exit 2) before anything there is changed.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from unimas.errors import UserError
from unimas.safe_load import load_json
from unimas.trajectory import recorded_step


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def new(cls, name: str, base: Path = Path("runs")) -> "RunDir":
        stamp = time.strftime("%Y%m%d-%H%M%S")
        root = base / f"{name}-{stamp}"
        suffix = 1
        while root.exists():
            suffix += 1
            root = base / f"{name}-{stamp}-{suffix}"
        return cls(root)

    def create(self) -> "RunDir":
        self.root.mkdir(parents=True, exist_ok=True)
        self.owned(self.root / "trajectories").mkdir(exist_ok=True)
        self.owned(self.root / "checkpoints").mkdir(exist_ok=True)
        return self

    def owned(self, path: Path) -> Path:
        """``path``, once it is sure to resolve inside the run directory; a :class:`UserError` naming it if not.

        The run writes and deletes only what it owns: a symlink (or ``..``) that
        leads out of the run directory would make a checkpoint write, a pruning
        or a snapshot pool's deletions land in someone else's files.
        """
        root, resolved = self.root.resolve(), Path(path).resolve()
        if resolved != root and root not in resolved.parents:
            raise UserError(f"resolves to {resolved}, outside the run directory {root} (a symlink?): unimas writes "
                            "and deletes only inside its run directory, so it refuses to touch it; nothing there "
                            "was changed", where=str(path))
        return Path(path)

    @property
    def config(self) -> Path:
        return self.owned(self.root / "config.yaml")

    @property
    def metrics(self) -> Path:
        return self.owned(self.root / "metrics.jsonl")

    def trajectories(self, split: str) -> Path:
        return self.owned(self.root / "trajectories" / f"{split}.jsonl")

    def checkpoint(self, step: int) -> Path:
        return self.owned(self.root / "checkpoints" / f"step_{step:06d}")

    def _checkpoint_dirs(self) -> list[Path]:
        found = (self.root / "checkpoints").glob("step_*")
        return sorted(p for p in found if p.is_dir() and STEP_DIR.fullmatch(p.name))

    def complete_checkpoints(self) -> list[Path]:
        """Checkpoint dirs with a ``COMPLETE`` marker, oldest first."""
        return [p for p in self._checkpoint_dirs() if self.is_complete(p)]

    def partial_checkpoints(self) -> list[Path]:
        """Checkpoint dirs without ``COMPLETE``: writes that were cut off."""
        return [p for p in self._checkpoint_dirs() if not self.is_complete(p)]

    def latest_checkpoint(self) -> Path | None:
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None

    def move_aside(self, checkpoint: Path) -> Path:
        """Rename a damaged checkpoint out of the resume order (``damaged-step_N``); the new path."""
        target = checkpoint.with_name(f"damaged-{checkpoint.name}")
        suffix = 1
        while target.exists():
            suffix += 1
            target = checkpoint.with_name(f"damaged-{checkpoint.name}-{suffix}")
        self.owned(checkpoint).rename(self.owned(target))
        return target

    def delete(self, path: Path) -> None:
        """Remove a directory the run owns (see :meth:`owned`)."""
        shutil.rmtree(self.owned(path))

    def prune(self, keep: int) -> None:
        """Delete all but the newest ``keep`` complete checkpoints (0 = keep all); the marker goes
        first, so a deletion cut off midway leaves a partial checkpoint, never a damaged complete one."""
        for old in self.complete_checkpoints()[:-keep] if keep else []:
            (self.owned(old) / COMPLETE).unlink()
            self.delete(old)

    def truncate_logs(self, step: int) -> None:
        """Cut metrics and trajectories after ``step`` (-1: everything), and any torn last line.

        A killed run logged steps after its last checkpoint; the resumed run
        logs them again. The files are in step order, so what stays is a prefix
        and cutting is one truncate, in place (the metrics writer may hold the file open).
        """
        _truncate_after(self.metrics, step, lambda record: record.get("step"))
        for split in ("train", "eval"):
            _truncate_after(self.trajectories(split), step, recorded_step)

    @staticmethod
    def is_complete(checkpoint: Path) -> bool:
        return (Path(checkpoint) / COMPLETE).exists()


COMPLETE = "COMPLETE"
"""Written last into a checkpoint directory: marks it finished (``manifest.json`` says whether it is intact)."""
STEP_DIR = re.compile(r"step_\d{6,}")


def _truncate_after(path: Path, step: int, step_of: Callable[[dict[str, Any]], Any]) -> None:
    if not path.exists():
        return
    keep = 0
    with open(path, "rb") as handle:
        for line in handle:
            try:
                record = json.loads(line)
                value = step_of(record) if line.endswith(b"\n") else None
            except (ValueError, AttributeError):
                value = None
            if not isinstance(value, int) or value > step:
                break
            keep += len(line)
    with open(path, "r+b") as handle:
        handle.truncate(keep)


TRAINER_STATE = "trainer_state.json"


class TrainerState(BaseModel):
    """``trainer_state.json``: where the loop stood when the checkpoint was written."""

    model_config = ConfigDict(extra="forbid", strict=True)
    step: int = Field(ge=0, description="the checkpoint's step (steps trained)")
    failed_steps_in_a_row: int = Field(0, ge=0)
    weight_versions: dict[str, NonNegativeInt] | None = Field(
        None, description="each group's update count; absent in states written before versions were counted")


def write_trainer_state(directory: Path, state: TrainerState) -> None:
    (directory / TRAINER_STATE).write_text(json.dumps(state.model_dump(exclude_none=True), indent=2))


def mark_complete(directory: Path) -> None:
    (directory / COMPLETE).write_text("ok\n")


def checkpoint_step(directory: Path) -> int | None:
    """The step a ``step_N`` directory's name gives; None for a checkpoint copied under another name."""
    return int(directory.name[5:]) if STEP_DIR.fullmatch(directory.name) else None


def read_trainer_state(directory: Path, step: int | None) -> TrainerState:
    """The trainer state of the checkpoint of ``step`` (None: not known); another step's state is refused."""
    path = directory / TRAINER_STATE
    state = load_json(path, TrainerState)
    if step is not None and state.step != step:
        raise UserError(f"records step {state.step}, but it sits in the checkpoint of step {step} (copied from "
                        "another checkpoint or run?)", where=str(path))
    return state
