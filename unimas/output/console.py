"""Console progress for `unimas train` / `unimas eval`.

On a terminal: a live rich display — a progress bar with step, steps/s,
ETA and the mean training reward, plus one compact line per role
(credit, advantage std, KL and entropy of the role's model group, response
length, format errors); evaluation results are printed above it so they stay
in the scrollback.

Anywhere else (CI logs, pipes, files): only evaluation lines (step 0 and
every ``eval_every``) and one final line, so logs stay short and readable.
Whether it is a terminal is decided by ``stream.isatty()`` alone, so a
``FORCE_COLOR`` set in CI does not turn logs into redraw noise.

Numbers are labelled by what they are, never by metric keys: a role's
"credit" is a sum of the rewards that reach its turns (so it can exceed 1).
:func:`quiet_libraries` keeps library warnings and log chatter out of a run's
output unless ``--debug`` asks for them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
import warnings
from pathlib import PurePath
from typing import IO, Any, Iterator, Literal

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from unimas.config.schema import ExperimentConfig
from unimas.output.rundir import RunDir

ROLE_COLUMNS = [("credit", "reward_mean"), ("adv std", "advantage_std"), ("len", "response_length"),
                ("fmt err", "format_error_rate")]
GROUP_COLUMNS = [("KL", "kl"), ("entropy", "entropy")]
CREDIT_NOTE = "credit = a turn's weighted sum of rewards (mean over the role's turns)"

LIBRARIES = ("transformers", "verl", "torch", "ray", "peft", "accelerate", "tensorboard", "huggingface_hub",
             "tokenizers", "datasets", "urllib3", "httpx", "numpy", "vllm", "sglang", "unimas")
"""Whose warnings and log records below ERROR a run hides without ``--debug``. unimas itself warns only
through ``notice`` lines and its own loggers, so a Python warning raised in its frames is a library's
(torch and transformers attribute theirs to the caller)."""
_LIBRARY_MODULE = re.compile(rf"({'|'.join(LIBRARIES)})(\.|$)")
QUIET_ENVIRONMENT = {"TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
                     "VERL_LOGGING_LEVEL": "ERROR", "TF_CPP_MIN_LOG_LEVEL": "3"}
"""Read by the libraries when they set up their loggers, which happens at import, possibly after this."""


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


def primary_reward_name(config: ExperimentConfig) -> str | None:
    """The primary reward (the first trajectory-level entry) as a reader knows it: its name, with its place in
    ``rewards`` when the name is listed twice (never the internal ``name#index`` key)."""
    names = [r.name for r in config.rewards]
    for index, spec in enumerate(config.rewards):
        if spec.level == "trajectory":
            return spec.name if names.count(spec.name) == 1 else f"{spec.name}, rewards[{index}]"
    return None


def eval_reward_label(config: ExperimentConfig) -> str:
    """Console name of ``eval/accuracy``: the primary reward's mean, which may be graded, so not "accuracy"."""
    name = primary_reward_name(config)
    return f"eval reward ({name})" if name else "eval reward"


def train_reward_label(config: ExperimentConfig) -> str:
    """Console name of ``reward/mean``: the primary reward's mean over the step's training episodes."""
    name = primary_reward_name(config)
    return f"train reward ({name})" if name else "train reward"


def eval_metric_note(config: ExperimentConfig, key: str) -> str:
    """What an ``eval/*`` metric key means, for ``unimas eval``'s listing: the reward entry behind an internal
    ``name#index`` key, and that a role's number is the sum of the rewards its turns got ("" when the key says it)."""
    from unimas.algorithms.credit import reward_keys

    if key.startswith("eval/reward/"):
        stored = key.removeprefix("eval/reward/")
        for index, (name, spec) in enumerate(zip(reward_keys(config.rewards), config.rewards)):
            if name == stored and name != spec.name:
                return f"reward '{spec.name}', rewards[{index}]"
    if key == "eval/accuracy":
        name = primary_reward_name(config)
        return f"mean of the primary reward ({name})" if name else ""
    if key.startswith("eval/role/") and key.endswith("/reward_mean"):
        return "mean over the role's turns of the sum of the rewards each turn got"
    return ""


class StepRateColumn(ProgressColumn):
    """Steps per second since the bar started (rich's own speed estimate, over its recent samples)."""

    def render(self, task: Any) -> Text:
        return Text(f"{task.speed:.2f} steps/s" if task.speed else "– steps/s", style="dim")


def _library_logger(name: str) -> bool:
    """Whether a logger belongs to one of :data:`LIBRARIES`: by its module name, or for a logger named by its
    file (verl's ``getLogger(__file__)``) by the installed package the file is in."""
    if _LIBRARY_MODULE.match(name):
        return True
    parts = PurePath(name).parts
    installed = [i for i, part in enumerate(parts) if part in ("site-packages", "dist-packages")]
    return bool(installed) and installed[-1] + 1 < len(parts) and parts[installed[-1] + 1] in LIBRARIES


class _LibraryNoise(logging.Filter):
    """Drops records below ERROR from :data:`LIBRARIES`' loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not _library_logger(record.name)


@contextlib.contextmanager
def quiet_libraries(show: bool = False) -> Iterator[None]:
    """During a run: library warnings and log records below ERROR are not shown (``show``: ``--debug``, all are).

    Warnings attributed to the libraries' (or unimas's) modules are ignored; a
    filter on the handlers library records reach (the root's, the last-resort
    one and the libraries' own) drops their chatter; environment defaults make
    libraries imported later start quiet. A user's own warnings and loggers,
    unimas's notices and every error still show.
    """
    if show:
        yield
        return
    noise = _LibraryNoise()
    handlers = {logging.lastResort, *logging.getLogger().handlers}
    handlers.update(h for name in LIBRARIES for h in logging.getLogger(name).handlers)
    handlers.discard(None)
    previous = {key: os.environ.get(key) for key in QUIET_ENVIRONMENT}
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    for handler in handlers:
        handler.addFilter(noise)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=_LIBRARY_MODULE.pattern)
            yield
    finally:
        for handler in handlers:
            handler.removeFilter(noise)
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class ConsoleLogger:
    """Shows training (``mode="train"``) or evaluation (``mode="eval"``) progress; call ``log`` per record."""

    def __init__(self, config: ExperimentConfig, run_dir: RunDir, stream: IO[str] | None = None,
                 mode: Literal["train", "eval"] = "train"):
        self.config = config
        self.eval_label = eval_reward_label(config)
        self.train_label = train_reward_label(config)
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
                columns = [TextColumn("[bold]{task.description}"), BarColumn(bar_width=12), TextColumn("step"),
                           MofNCompleteColumn(), StepRateColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                           TextColumn("{task.fields[reward]}")]  # fits 80 columns; elapsed is in the eval lines
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
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim", caption=CREDIT_NOTE,
                      caption_style="dim", caption_justify="left")
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
            parts.append(f"{self.train_label} {record['reward/mean']:.3f}")
        if "eval/accuracy" in record:
            parts.append(f"{self.eval_label} {record['eval/accuracy']:.3f}")
        roles = [f"{r} {record[f'eval/role/{r}/reward_mean']:.2f}" for r in self.config.roles
                 if f"eval/role/{r}/reward_mean" in record]
        if roles:
            parts.append("eval credit per turn (sum of rewards): " + ", ".join(roles))
        parts.append(f"{time.perf_counter() - self.started:.1f}s elapsed")
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
                self.progress.update(self.task, completed=record["step"], reward=f"train reward {record['reward/mean']:.3f}")
            self.live.update(self._renderable())

    def close(self) -> None:
        """Stop the live display (also after an exception) and print one summary line.

        Called while an exception propagates (a failed run: ``close`` runs in a
        ``finally``), no summary: the error says what happened, and a
        "stopped: 0/N steps" before it would only mislead.
        """
        if self.live is not None:
            self.live.stop()
            self.live = None
        if not self.enabled or sys.exc_info()[1] is not None:
            return
        parts = [f"{time.perf_counter() - self.started:.1f}s elapsed"]
        if self.mode == "train":
            done = self.last_train.get("step", self.last_eval.get("step", 0))
            parts.insert(0, f"{'done' if done == self.total else 'stopped early'}: {done}/{self.total} steps")
        else:
            parts.insert(0, "evaluation done" if self.last_eval else "evaluation stopped")
        if "reward/mean" in self.last_train:
            parts.append(f"{self.train_label} {self.last_train['reward/mean']:.3f}")
        if "eval/accuracy" in self.last_eval:
            parts.append(f"{self.eval_label} {self.last_eval['eval/accuracy']:.3f} (step {self.last_eval['step']})")
        self.console.print(" | ".join(parts), markup=False)
        self.console.file.flush()
