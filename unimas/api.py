"""``unimas.train``: a training run from Python, exactly as ``unimas train`` runs it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, Callable

from unimas.config.loading import config_from_dict, load_config
from unimas.config.schema import ExperimentConfig
from unimas.errors import UserError
from unimas.output.loggers import build_loggers
from unimas.output.run_end import write_run_end
from unimas.output.rundir import RunDir
from unimas.preflight.validate import validate
from unimas.process import torch_setup, until_interrupted
from unimas.report import write_report
from unimas.runtime.transport import start_transport
from unimas.training.experiment import Experiment
from unimas.training.trainer import Trainer


def _merge(tree: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            _merge(tree[key], value)
        else:
            tree[key] = value
    return tree


def resolve_config(config_or_path: ExperimentConfig | str | Path, overrides: dict[str, Any]) -> ExperimentConfig:
    """A config from a YAML path or an ``ExperimentConfig``, with nested-dict overrides merged in."""
    if isinstance(config_or_path, ExperimentConfig):
        if not overrides:
            return config_or_path
        tree = _merge(config_or_path.model_dump(mode="json", by_alias=True), overrides)
        return config_from_dict(tree, "<ExperimentConfig with overrides>")
    config = load_config(config_or_path)
    if not overrides:
        return config
    return config_from_dict(_merge(config.model_dump(mode="json", by_alias=True), overrides), str(config_or_path))


def run_training(experiment: Experiment, run_dir: RunDir, resume: bool = False,
                 log: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Start the groups, run the loop, stop the groups (also on Ctrl-C); the metrics history."""
    config = experiment.config
    run_dir.create()
    torch_setup(config.trainer.torch_threads, config.trainer.seed)
    transport = start_transport(config, experiment.registry)
    logged_before = _size(run_dir.metrics)
    try:
        history = asyncio.run(until_interrupted(Trainer(experiment, run_dir, transport, log=log).run(resume=resume)))
    except BaseException as error:
        # A refusal before the first step (a resume that does not fit) leaves the run as it was; the end
        # record is best effort here, so that a full disk cannot hide the error that ended the run.
        if _size(run_dir.metrics) != logged_before:
            with contextlib.suppress(OSError, UserError):
                write_run_end(run_dir, config, [], error)
        raise
    finally:
        transport.shutdown()  # group actors stop, and a Ray instance we started stops
    write_run_end(run_dir, config, history)
    return history


def _size(path: Path) -> int:
    """The file's size, -1 when absent: a change tells that the run wrote (or cut) metrics."""
    return path.stat().st_size if path.exists() else -1


def train(config_or_path: ExperimentConfig | str | Path, *, run_dir: str | Path | None = None,
          resume: bool = False, **overrides: Any) -> list[dict[str, Any]]:
    """Train as ``unimas train`` does (validation, run directory, loggers, report); returns the metrics records.

    Overrides are nested dicts merged into the config before validation::

        history = unimas.train("examples/quickstart.yaml", trainer={"steps": 20})
        print(history[-1]["eval/accuracy"])

    Raises :class:`unimas.UserError` for config mistakes, like the CLI's exit 2.
    """
    experiment = validate(resolve_config(config_or_path, overrides))
    config = experiment.config
    if resume and run_dir is None:
        raise UserError("resuming needs the run directory of the run to continue", where="--resume")
    directory = RunDir(Path(run_dir)) if run_dir is not None else RunDir.new(config.name)
    if not resume and directory.metrics.exists() and directory.metrics.stat().st_size:
        raise UserError("this run directory already holds a run; pass --resume to continue it or choose a new "
                        "--run-dir (nothing was changed)", where=str(directory.root))
    logger = build_loggers(config, directory)
    try:
        history = run_training(experiment, directory, resume=resume, log=logger.log)
    finally:
        logger.close()
    if config.logging.report:
        write_report(directory.root)
    return history

