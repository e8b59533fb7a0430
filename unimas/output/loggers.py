"""Metric sinks chosen by the ``logging`` section of the config.

``metrics.jsonl`` is always written by the trainer itself (it is the run
directory contract); these are the optional extra sinks: the console,
TensorBoard (``logging.tensorboard: true``, events under
``RUN_DIR/tensorboard``) and Weights & Biases (``logging.wandb: {...}``, the
mapping is passed to ``wandb.init``). wandb is never a dependency: asking for
it without it installed is a config error, not an ImportError mid-run.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol

from unimas.config.schema import ExperimentConfig
from unimas.errors import UserError
from unimas.output.console import ConsoleLogger
from unimas.output.rundir import RunDir


class Logger(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardLogger:
    """One scalar per metric name, at the record's step."""

    def __init__(self, run_dir: RunDir):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir.root / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for key, value in _scalars(record).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A W&B run with the resolved config attached; files go under the run directory."""

    def __init__(self, config: ExperimentConfig, run_dir: RunDir):
        try:
            import wandb
        except ImportError:
            raise UserError("is set but the wandb package is not installed: `pip install wandb`, "
                            "or remove logging.wandb", where="logging.wandb") from None
        settings = {"name": run_dir.root.name, "dir": str(run_dir.root), **(config.logging.wandb or {})}
        try:
            self.run = wandb.init(config=config.model_dump(mode="json", by_alias=True), **settings)
        except TypeError as exc:
            raise UserError(f"not accepted by wandb.init: {exc}", where="logging.wandb") from None

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(_scalars(record), step=int(record.get("step", 0)))

    def close(self) -> None:
        self.run.finish()


class Loggers:
    """Fans each metrics record out to every configured sink; closes them all even if one fails."""

    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers

    def log(self, record: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(record)

    def close(self) -> None:
        errors = []
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as exc:  # noqa: BLE001 - close the rest, then re-raise the first
                errors.append(exc)
        if errors:
            raise errors[0]


def build_loggers(config: ExperimentConfig, run_dir: RunDir, mode: Literal["train", "eval"] = "train") -> Loggers:
    """The sinks ``config.logging`` asks for; the console one is always first (it may print nothing)."""
    loggers: list[Logger] = []
    try:
        if config.logging.wandb is not None:
            loggers.append(WandbLogger(config, run_dir))
        if config.logging.tensorboard:
            loggers.append(TensorBoardLogger(run_dir))
        loggers.insert(0, ConsoleLogger(config, run_dir, mode=mode))
    except BaseException:
        Loggers(loggers).close()
        raise
    return Loggers(loggers)
