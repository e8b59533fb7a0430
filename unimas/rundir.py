"""The run directory layout, a contract other tools rely on (see DESIGN.md).

::

    RUN_DIR/
      config.yaml                 resolved config
      metrics.jsonl               one JSON object per step (line-buffered)
      trajectories/train.jsonl    sampled training episodes (graph JSON)
      trajectories/eval.jsonl     evaluation episodes
      checkpoints/step_000050/    one dir per model group + trainer_state.json + manifest.json
                                  + COMPLETE (written last: marks a finished checkpoint)
      checkpoints/damaged-step_N/ a damaged checkpoint a resume skipped (kept for inspection)
      report.html, plots/*.png    written by `unimas report`
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from unimas.errors import UserError


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
        (self.root / "trajectories").mkdir(parents=True, exist_ok=True)
        (self.root / "checkpoints").mkdir(exist_ok=True)
        return self

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    def trajectories(self, split: str) -> Path:
        return self.root / "trajectories" / f"{split}.jsonl"

    def checkpoint(self, step: int) -> Path:
        return self.root / "checkpoints" / f"step_{step:06d}"

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
        checkpoint.rename(target)
        return target

    def prune(self, keep: int) -> None:
        """Delete all but the newest ``keep`` complete checkpoints (0 = keep all); the marker goes
        first, so a deletion cut off midway leaves a partial checkpoint, never a damaged complete one."""
        for old in self.complete_checkpoints()[:-keep] if keep else []:
            (old / COMPLETE).unlink()
            shutil.rmtree(old)

    def truncate_logs(self, step: int) -> None:
        """Cut metrics and trajectories after ``step`` (-1: everything), and any torn last line.

        A killed run logged steps after its last checkpoint; the resumed run
        logs them again. The files are in step order, so what stays is a prefix
        and cutting is one truncate, in place (the metrics writer may hold the file open).
        """
        _truncate_after(self.metrics, step, lambda record: record.get("step"))
        for split in ("train", "eval"):
            _truncate_after(self.trajectories(split), step, lambda record: record.get("outcome", {}).get("_step"))

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


def write_trainer_state(directory: Path, state: dict[str, Any]) -> None:
    (directory / "trainer_state.json").write_text(json.dumps(state, indent=2))


def mark_complete(directory: Path) -> None:
    (directory / COMPLETE).write_text("ok\n")


def read_trainer_state(directory: Path) -> dict[str, Any]:
    path = directory / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read the trainer state: {type(exc).__name__}: {exc}", where=str(path)) from None
    return state
