"""`unimas train` on the verl quickstart (two verl groups): the pipeline runs, and a run killed with SIGKILL after
a checkpoint resumes to exactly the uninterrupted run (metrics and the final weights of both groups)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import EXAMPLES, REPO
from unimas.cli import main

SETTINGS = ["trainer.steps=4", "trainer.save_every=2", "trainer.tasks_per_step=8", "trainer.stop_at_accuracy=null",
            "trainer.eval_every=2", "logging.report=false", "logging.console=false"]
VOLATILE = ("time/", "_time_s", "_per_s", "wall_s")
CONFIG = str(EXAMPLES / "quickstart_verl.yaml")


def args(run: Path, resume: bool = False, config: str = CONFIG) -> list[str]:
    return ["train", config, "--run-dir", str(run), *(["--resume"] if resume else []),
            *sum((["--set", s] for s in SETTINGS), [])]


def stable_metrics(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(part in k for part in VOLATILE)} for r in records]


def final_weights(run: Path, group: str, rank: int = 0, ranks: int = 1) -> dict[str, torch.Tensor]:
    """One rank's weight shards in the run's step-4 checkpoint of ``group`` (the whole weights with one rank)."""
    from safetensors.torch import load_file

    actor = run / "checkpoints" / "step_000004" / group / "verl_actor"
    return load_file(actor / f"model_rank_{rank}_of_{ranks}.safetensors")


@pytest.mark.slow  # three runs of two verl groups: ~40 s on two cores
def test_killed_after_a_checkpoint_the_run_resumes_to_the_uninterrupted_one(tmp_path):
    straight = tmp_path / "straight"
    assert main(args(straight)) == 0
    expected = stable_metrics(straight)
    assert [r["step"] for r in expected] == list(range(5))

    run, log = tmp_path / "run", tmp_path / "run.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "unimas.cli", *args(run)], cwd=REPO, stdout=out,
                                   stderr=out, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    marker = run / "checkpoints" / "step_000002" / "COMPLETE"
    deadline = time.monotonic() + 240
    try:
        while not marker.exists():
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "checkpoint 2 never completed"
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    assert main(args(run, resume=True)) == 0
    assert stable_metrics(run) == expected
    for group in ("speaker_model", "listener_model"):
        weights, resumed = final_weights(straight, group), final_weights(run, group)
        assert resumed.keys() == weights.keys() and all(torch.equal(resumed[k], weights[k]) for k in weights)


def test_a_verl_group_trains_beside_a_torch_group(tmp_path):
    import yaml

    tree = yaml.safe_load((EXAMPLES / "quickstart_verl.yaml").read_text())
    tiny = tree["models"]["listener_model"]["options"]["tiny"]
    tree["models"]["listener_model"] = {"backend": "torch", "options": {"tiny": tiny}, "optim": {"lr": 0.001}}
    config = tmp_path / "mixed.yaml"
    config.write_text(yaml.safe_dump(tree))
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run), "--set", "trainer.steps=2", "--set",
                 "trainer.save_every=2", "--set", "logging.report=false", "--set", "logging.console=false"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "reward/mean" in r] == [1, 2]
    for group in ("speaker_model", "listener_model"):
        assert all(f"group/{group}/grad_norm" in r for r in records if "reward/mean" in r)
    checkpoint = run / "checkpoints" / "step_000002"
    assert (checkpoint / "speaker_model" / "verl_actor" / "huggingface" / "config.json").exists()
    assert (checkpoint / "listener_model" / "model" / "config.json").exists()


@pytest.mark.slow
def test_asynchronous_pipeline_with_two_verl_groups(tmp_path):
    """max_staleness 1: generation of step k+1 overlaps the updates of step k; the late turns are reweighted."""
    run = tmp_path / "run"
    assert main(["train", CONFIG, "--run-dir", str(run), "--set", "trainer.steps=3", "--set",
                 "algorithm.max_staleness=1", "--set", "logging.report=false", "--set", "logging.console=false"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "reward/mean" in line]
    for group in ("speaker_model", "listener_model"):
        versions = [r[f"group/{group}/weight_version"] for r in records]
        assert versions == [1.0, 2.0, 3.0]
        assert any(r[f"group/{group}/stale_turns"] > 0 for r in records)
        assert all(0 < r[f"group/{group}/importance_weight"] <= 2.0 for r in records)
