"""`unimas train` with a verl group on a Ray worker group of two ranks (examples/quickstart_verl_ranks.yaml).

The run trains, saves each rank's shard and its two servers' sampling states,
and a run cut after its step-2 checkpoint (the later checkpoint and log lines
removed, as a kill would leave it) resumes to exactly the uninterrupted run:
metrics and both ranks' final weight shards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import EXAMPLES
from tests.test_verl_train import args, final_weights, stable_metrics
from unimas.cli import main

CONFIG = str(EXAMPLES / "quickstart_verl_ranks.yaml")


def shards(run: Path) -> list[dict[str, torch.Tensor]]:
    return [final_weights(run, "shared", rank, ranks=2) for rank in (0, 1)]


@pytest.mark.slow  # two runs of a two-rank group: ~2 min on two cores
def test_two_ranks_train_and_resume_to_the_uninterrupted_run(tmp_path):
    straight = tmp_path / "straight"
    assert main(args(straight, config=CONFIG)) == 0
    expected = stable_metrics(straight)
    assert [r["step"] for r in expected] == list(range(5))
    assert json.loads((straight / "checkpoints" / "step_000004" / "shared" / "unimas_group.json").read_text())[
        "world_size"] == 2

    cut = tmp_path / "cut"
    shutil.copytree(straight, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    assert main(args(cut, resume=True, config=CONFIG)) == 0
    assert stable_metrics(cut) == expected
    for mine, theirs in zip(shards(cut), shards(straight)):
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs)
