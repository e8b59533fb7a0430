"""Self-play against a pool of frozen snapshots (debate): what is played, what is kept, resume, validation."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import EXAMPLES
from tests.test_debate import _plugin_args
from unimas.cli import main
from unimas.trajectory import read_jsonl

CONFIG = str(EXAMPLES / "debate_selfplay_cpu.yaml")


def _args(chat_model, *extra: str) -> list[str]:
    settings = [*(f"models.{g}.options.path={chat_model}" for g in ("policy", "opponent", "judge_model")),
                "trainer.tasks_per_step=2", "algorithm.group_size=2", "trainer.eval_size=2", "trainer.eval_every=0",
                "models.opponent.snapshot.every=2", "models.opponent.snapshot.pool=2", "trainer.save_every=2",
                "logging.report=false", "logging.console=false", *extra]
    return [*_plugin_args(), *[part for s in settings for part in ("--set", s)]]


def _weights(directory: Path) -> dict:
    return {k: v for f in sorted((directory / "model").glob("*.safetensors")) for k, v in load_file(f).items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def _snapshot_metrics(run: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if k.startswith("snapshot/")} for m in lines if m["step"] > 0]


def test_the_opponent_plays_a_pooled_snapshot_of_the_learner(chat_model, tmp_path):
    run = tmp_path / "run"
    assert main(["train", CONFIG, "--run-dir", str(run), *_args(chat_model, "trainer.steps=4")]) == 0

    played = [m["snapshot/opponent/playing_step"] for m in _snapshot_metrics(run)]
    assert played[0] == 0.0 and played[1] in (0.0, 2.0) and played[1] == played[2] and played[3] in (2.0, 4.0)
    assert [m["snapshot/opponent/pool_size"] for m in _snapshot_metrics(run)] == [1.0, 2.0, 2.0, 2.0]

    snapshots = run / "snapshots" / "opponent"
    assert sorted(p.name for p in snapshots.iterdir()) == ["step_000002", "step_000004"]  # step 0 left the pool
    assert sorted(p.name for p in (snapshots / "step_000004").iterdir()) == ["model"]  # weights only
    final = run / "checkpoints" / "step_000004"
    opponent, policy = _weights(final / "opponent"), _weights(final / "policy")
    assert _same(opponent, _weights(snapshots / f"step_{int(played[3]):06d}"))
    assert _same(_weights(snapshots / "step_000004"), policy)
    assert not _same(_weights(snapshots / "step_000002"), policy)  # the learner moved on since

    for traj in read_jsonl(run / "trajectories" / "train.jsonl"):
        assert all(t.advantage is not None for t in traj.turns("debater_a"))
        assert all(t.advantage is None for t in traj.turns("debater_b"))  # an earlier self never learns


@pytest.mark.slow
def test_a_resumed_run_plays_the_same_opponents(chat_model, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main(["train", CONFIG, "--run-dir", str(whole), *_args(chat_model, "trainer.steps=6")]) == 0
    assert main(["train", CONFIG, "--run-dir", str(resumed), *_args(chat_model, "trainer.steps=2")]) == 0
    (resumed / "snapshots" / "opponent" / "step_000009").mkdir()  # taken after the checkpoint: must go
    assert main(["train", CONFIG, "--run-dir", str(resumed), "--resume", *_args(chat_model, "trainer.steps=6")]) == 0

    assert _snapshot_metrics(resumed) == _snapshot_metrics(whole)
    for group in ("policy", "opponent"):
        assert _same(_weights(whole / "checkpoints" / "step_000006" / group),
                     _weights(resumed / "checkpoints" / "step_000006" / group))
    assert not (resumed / "snapshots" / "opponent" / "step_000009").exists()


def test_bad_snapshot_settings_name_their_fields(chat_model, capsys):
    bad = ["models.opponent.trainable=true", "roles.debater_b.trainable=true",
           "models.opponent.snapshot.of=judge_model", "models.opponent.options.dtype=bfloat16"]
    assert main(["validate", CONFIG, *_args(chat_model, *bad)]) == 2
    err = capsys.readouterr().err
    for field in ("models.opponent.trainable", "models.opponent.snapshot.of", "models.opponent.options"):
        assert field in err
    assert main(["validate", CONFIG, *_args(chat_model, "models.opponent.snapshot.of=nowhere")]) == 2
    assert "'nowhere' is not declared" in capsys.readouterr().err
