"""Console progress for `unimas train`: one compact line per step.

Quiet on non-TTY output except for evaluation lines, so CI logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from unimas.config import ExperimentConfig
from unimas.rundir import RunDir


class ConsoleLogger:
    def __init__(self, config: ExperimentConfig, run_dir: RunDir, stream=None):
        self.config = config
        self.stream = stream or sys.stdout
        self.enabled = config.logging.console
        self.started = time.perf_counter()
        print(f"run directory: {run_dir.root}", file=self.stream)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        step = record["step"]
        elapsed = time.perf_counter() - self.started
        parts = [f"step {step:>4}/{self.config.trainer.steps}", f"{elapsed:6.1f}s"]
        if "reward/mean" in record:
            parts.append(f"reward {record['reward/mean']:.3f}")
        if "eval/accuracy" in record:
            parts.append(f"eval/accuracy {record['eval/accuracy']:.3f}")
        roles = [f"{r} {record[f'role/{r}/reward_mean']:.2f}" for r in self.config.roles
                 if f"role/{r}/reward_mean" in record]
        if roles:
            parts.append("roles: " + ", ".join(roles))
        if self.stream.isatty() or "eval/accuracy" in record:
            print(" | ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        self.stream.flush()
