"""Console progress for `unimas train` / `unimas eval`.

On a terminal: a live rich display — a progress bar with step, elapsed time,
ETA and mean reward, plus one compact line per role (reward, advantage std,
KL and entropy of the role's model group, response length, format errors);
evaluation results are printed above it so they stay in the scrollback.

Anywhere else (CI logs, pipes, files): only evaluation lines (step 0 and
every ``eval_every``) and one final line, so logs stay short and readable.
Whether it is a terminal is decided by ``stream.isatty()`` alone, so a
``FORCE_COLOR`` set in CI does not turn logs into redraw noise.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Literal

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from unimas.config.schema import ExperimentConfig
from unimas.output.rundir import RunDir

ROLE_COLUMNS = [("reward", "reward_mean"), ("adv std", "advantage_std"), ("len", "response_length"),
                ("fmt err", "format_error_rate")]
GROUP_COLUMNS = [("KL", "kl"), ("entropy", "entropy")]


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


def eval_reward_label(config: ExperimentConfig) -> str:
    """Console name of ``eval/accuracy``: the primary reward's mean, which may be graded, so not "accuracy".

    The primary reward is the first trajectory-level entry, keyed ``name#index`` when names repeat
    (as the reward values are stored).
    """
    names = [r.name for r in config.rewards]
    for index, spec in enumerate(config.rewards):
        if spec.level == "trajectory":
            return f"eval reward ({spec.name if names.count(spec.name) == 1 else f'{spec.name}#{index}'})"
    return "eval reward"


class ConsoleLogger:
    """Shows training (``mode="train"``) or evaluation (``mode="eval"``) progress; call ``log`` per record."""

    def __init__(self, config: ExperimentConfig, run_dir: RunDir, stream: IO[str] | None = None,
                 mode: Literal["train", "eval"] = "train"):
        self.config = config
        self.eval_label = eval_reward_label(config)
        self.mode = mode
        self.total = config.trainer.steps if mode == "train" else None
        self.enabled = config.logging.console
        stream = stream if stream is not None else sys.stdout
        self.interactive = self.enabled and stream.isatty()
        self.console = Console(file=stream, force_terminal=self.interactive, highlight=False, soft_wrap=True)
        self.started = time.perf_counter()
        self.last_train: dict[str, Any] = {}
        self.last_eval: dict[str, Any] = {}
        self.live: Live | None = None
        if self.interactive:
            if mode == "train":
                columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("steps"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                           TextColumn("{task.fields[reward]}")]
            else:
                columns = [SpinnerColumn(), TextColumn("[bold]{task.description}: evaluating"), TimeElapsedColumn()]
            self.progress = Progress(*columns, console=self.console)
            self.task = self.progress.add_task(escape(config.name), total=self.total, reward="")
            self.live = Live(self._renderable(), console=self.console, refresh_per_second=4)
            self.live.start()
            self.console.print(f"run directory: {run_dir.root}", markup=False)

    def _renderable(self) -> Group:
        return Group(self.progress, self._role_table()) if self.last_train else Group(self.progress)

    def _role_table(self) -> Table:
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
        table.add_column("role")
        for title, _ in ROLE_COLUMNS + GROUP_COLUMNS:
            table.add_column(title, justify="right")
        for role, spec in self.config.roles.items():
            record = self.last_train
            cells = [record.get(f"role/{role}/{key}") for _, key in ROLE_COLUMNS]
            cells += [record.get(f"group/{spec.model}/{key}") for _, key in GROUP_COLUMNS]
            table.add_row(role, *(_fmt(c) for c in cells))
        return table

    def eval_line(self, record: dict[str, Any]) -> str:
        parts = [f"step {record.get('step', 0):>4}" + (f"/{self.total}" if self.total is not None else "")]
        if "reward/mean" in record:
            parts.append(f"reward {record['reward/mean']:.3f}")
        if "eval/accuracy" in record:
            parts.append(f"{self.eval_label} {record['eval/accuracy']:.3f}")
        roles = [f"{r} {record[f'eval/role/{r}/reward_mean']:.2f}" for r in self.config.roles
                 if f"eval/role/{r}/reward_mean" in record]
        if roles:
            parts.append("eval role reward: " + ", ".join(roles))
        parts.append(f"{time.perf_counter() - self.started:.1f}s")
        return " | ".join(parts)

    def log(self, record: dict[str, Any]) -> None:
        """Take one metrics record (as written to metrics.jsonl)."""
        if not self.enabled:
            return
        is_eval = any(key.startswith("eval/") for key in record)
        if "reward/mean" in record:
            self.last_train = record
        if is_eval:
            self.last_eval = record
            self.console.print(self.eval_line(record), markup=False)
        if self.live is not None:
            if "reward/mean" in record:
                self.progress.update(self.task, completed=record["step"], reward=f"reward {record['reward/mean']:.3f}")
            self.live.update(self._renderable())

    def close(self) -> None:
        """Stop the live display (also after an exception) and print one summary line."""
        if self.live is not None:
            self.live.stop()
            self.live = None
        if not self.enabled:
            return
        parts = [f"{time.perf_counter() - self.started:.1f}s"]
        if self.mode == "train":
            done = self.last_train.get("step", self.last_eval.get("step", 0))
            parts.insert(0, f"{'done' if done == self.total else 'stopped'}: {done}/{self.total} steps")
        else:
            parts.insert(0, "evaluation done" if self.last_eval else "evaluation stopped")
        if "reward/mean" in self.last_train:
            parts.append(f"reward {self.last_train['reward/mean']:.3f}")
        if "eval/accuracy" in self.last_eval:
            parts.append(f"{self.eval_label} {self.last_eval['eval/accuracy']:.3f} (step {self.last_eval['step']})")
        self.console.print(" | ".join(parts), markup=False)
        self.console.file.flush()
