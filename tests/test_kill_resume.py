"""A training process killed with SIGKILL, again and again, resumes to exactly the uninterrupted run.

One run is killed as a real ``python -m unimas.cli train`` process in the
middle of a checkpoint write, during a resume, and after logging a step past
its last checkpoint, then resumed to the end. Monkeypatching cannot reach
another process, so the checkpoint write is made to stall deterministically:
``rng.pt`` of step 6 is a FIFO, whose open blocks until a reader comes (none
does). The uninterrupted reference runs in this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import EXAMPLES, REPO
from unimas.cli import main

SETTINGS = ["trainer.steps=6", "trainer.save_every=2", "trainer.tasks_per_step=8", "trainer.stop_at_accuracy=null",
            "trainer.eval_every=2", "logging.report=false", "logging.console=false"]
VOLATILE = ("time/", "_time_s", "_per_s", "wall_s")
"""Timing and throughput metrics differ between any two runs."""


def start(run: Path, resume: bool) -> subprocess.Popen:
    args = [sys.executable, "-m", "unimas.cli", "train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(run),
            *(["--resume"] if resume else []), *sum((["--set", s] for s in SETTINGS), [])]
    with open(run.parent / f"{run.name}.log", "a") as log:
        return subprocess.Popen(args, cwd=REPO, stdout=log, stderr=log,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})


def kill_when(process: subprocess.Popen, ready: Callable[[], bool], timeout: float = 60) -> None:
    """SIGKILL ``process`` as soon as ``ready()``; it must still be running then."""
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            assert process.poll() is None, "the run ended before the kill point"
            assert time.monotonic() < deadline, "kill point not reached"
            time.sleep(0.005)
    finally:  # a failed wait must not leave a run stalled on the FIFO behind
        process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def stable_metrics(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(part in k for part in VOLATILE)} for r in records]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "step_000006" / "shared" / "model" / "model.safetensors")


@pytest.mark.slow  # four process starts: ~35 s on two cores
def test_a_run_killed_again_and_again_ends_like_the_uninterrupted_one(tmp_path):
    straight = tmp_path / "straight"
    assert main(["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(straight),
                 *sum((["--set", s] for s in SETTINGS), [])]) == 0
    run, log = tmp_path / "run", tmp_path / "run.log"

    # 1. killed inside the step-6 checkpoint write (stalled on a FIFO), steps 5 and 6 logged after checkpoint 4
    stalled = run / "checkpoints" / "step_000006" / "shared"
    stalled.mkdir(parents=True)
    os.mkfifo(stalled / "rng.pt")
    kill_when(start(run, resume=False), lambda: (stalled / "scheduler.pt").exists())
    assert not (stalled.parent / "COMPLETE").exists() and lines(run / "metrics.jsonl") == 7
    # 2. killed during the resume, once it has loaded checkpoint 4 and cut the logs
    kill_when(start(run, resume=True), lambda: "notice: resuming from" in log.read_text())
    # 3. killed once this resume has logged step 5 again
    kill_when(start(run, resume=True),
              lambda: log.read_text().count("notice: resuming from") == 2 and lines(run / "metrics.jsonl") >= 6)
    # 4. resumed to the end
    assert start(run, resume=True).wait(timeout=120) == 0, log.read_text()

    output = log.read_text()
    assert "Traceback" not in output and "unfinished checkpoint write" in output
    assert output.count("notice: resuming from") == 3
    expected = stable_metrics(straight)
    assert [r["step"] for r in expected] == list(range(7))
    assert stable_metrics(run) == expected
    weights, resumed = final_weights(straight), final_weights(run)
    assert resumed.keys() == weights.keys() and all(torch.equal(resumed[k], weights[k]) for k in weights)
