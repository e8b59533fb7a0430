"""The run directory layout, a contract other tools rely on (see DESIGN.md).

::

    RUN_DIR/
      config.yaml                 resolved config
      metrics.jsonl               one JSON object per step (line-buffered)
      trajectories/train.jsonl    sampled training episodes (graph JSON)
      trajectories/eval.jsonl     evaluation episodes
      checkpoints/step_000050/    one dir per model group + trainer_state.json
                                  + COMPLETE (written last: marks a usable checkpoint)
      report.html, plots/*.png    written by `unimas report`
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def latest_checkpoint(self) -> Path | None:
        complete = sorted(p.parent for p in (self.root / "checkpoints").glob(f"step_*/{COMPLETE}"))
        return complete[-1] if complete else None

    @staticmethod
    def is_complete(checkpoint: Path) -> bool:
        return (Path(checkpoint) / COMPLETE).exists()


COMPLETE = "COMPLETE"
"""Written last into a checkpoint directory: marks it usable."""


def write_trainer_state(directory: Path, state: dict[str, Any]) -> None:
    (directory / "trainer_state.json").write_text(json.dumps(state, indent=2))
    (directory / COMPLETE).write_text("ok\n")


def read_trainer_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "trainer_state.json").read_text())
