"""``RUN_DIR/run_end.json``: how a training run ended, written once when the loop returns or raises.

metrics.jsonl alone cannot tell a run that met its ``trainer.stop_when``
condition at step 40 of 100 from one that crashed there or is still running;
the report reads this record to say which. A run killed by a signal (SIGKILL,
the OOM killer) or still running has none. A record behind metrics.jsonl was
left by an earlier invocation that a resume continued, and readers treat it as absent.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from unimas.config.schema import ExperimentConfig
from unimas.errors import UserError
from unimas.output.metrics import read_metrics
from unimas.output.rundir import RunDir
from unimas.safe_load import load_json

RUN_END = "run_end.json"
MAX_REASON = 500
"""Characters of an exception message kept: the console and the log have the rest."""


class RunEnd(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    status: Literal["finished", "stopped", "crashed", "interrupted"] = Field(
        ..., description="finished: all trainer.steps; stopped: trainer.stop_when met; crashed: an error; "
                         "interrupted: Ctrl-C")
    step: int = Field(..., ge=0, description="the last step in metrics.jsonl when the run ended")
    planned_steps: int = Field(..., ge=0, description="trainer.steps of the run")
    reason: str = Field(..., description="what ended it, in words")
    ended_at: str = Field(..., description="UTC time, ISO 8601")


def _last_step(path: Path) -> int:
    try:
        steps = [r["step"] for r in read_metrics(path, []) if isinstance(r.get("step"), int)]
    except OSError:  # missing or unreadable: nothing was logged that the record could point at
        return 0
    return max(steps, default=0)


def describe_end(config: ExperimentConfig, history: list[dict[str, Any]], error: BaseException | None,
                 logged_step: int) -> RunEnd:
    """The record of a run that returned ``history`` or raised ``error``; ``logged_step``: the last step logged."""
    planned = config.trainer.steps
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if error is not None:
        interrupted = isinstance(error, KeyboardInterrupt)
        message = (str(error).strip().splitlines() or [""])[0][:MAX_REASON]
        reason = "Ctrl-C (KeyboardInterrupt)" if interrupted else f"{type(error).__name__}: {message}".rstrip(": ")
        return RunEnd(status="interrupted" if interrupted else "crashed", step=logged_step, planned_steps=planned,
                      reason=reason, ended_at=stamp)
    last = history[-1] if history else {}
    step = last.get("step", 0) if isinstance(last.get("step"), int) else 0
    stop = config.stop_condition
    if stop is not None and step < planned and stop.reached(last):
        field = "trainer.stop_when" if config.trainer.stop_when is not None else "trainer.stop_at_accuracy"
        bound = f">= {stop.at_least:g}" if stop.at_least is not None else f"<= {stop.at_most:g}"
        return RunEnd(status="stopped", step=step, planned_steps=planned, ended_at=stamp,
                      reason=f"{field}: {stop.metric} = {last[stop.metric]:.4g} ({bound})")
    return RunEnd(status="finished", step=step, planned_steps=planned, reason=f"all {planned} steps trained",
                  ended_at=stamp)


def write_run_end(run_dir: RunDir, config: ExperimentConfig, history: list[dict[str, Any]],
                  error: BaseException | None = None) -> None:
    """Record how the run ended (see :func:`describe_end`)."""
    end = describe_end(config, history, error, _last_step(run_dir.root / "metrics.jsonl"))
    run_dir.owned(run_dir.root / RUN_END).write_text(json.dumps(end.model_dump(), indent=2) + "\n")


def read_run_end(root: Path) -> RunEnd | None:
    """The run's end record; None when there is none. A damaged one raises :class:`unimas.errors.UserError`."""
    path = Path(root) / RUN_END
    if not path.exists():
        return None
    if not path.is_file():
        raise UserError("not a file", where=str(path))
    return load_json(path, RunEnd)
