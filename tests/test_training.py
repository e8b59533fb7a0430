"""End-to-end training on the CPU: it learns, it is deterministic, it resumes exactly."""

import json

import pytest

from tests.conftest import EXAMPLES
from unimas.cli import main


def train(config, run_dir, *overrides):
    args = ["train", str(EXAMPLES / config), "--run-dir", str(run_dir), "--set", "logging.report=false"]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 0
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def evals(records):
    return [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["quickstart.yaml", "quickstart_separate.yaml", "quickstart_lora.yaml"])
def test_signalling_game_learns_from_chance_to_perfect(tmp_path, config):
    records = train(config, tmp_path)
    history = evals(records)
    assert history[0] == (0, pytest.approx(history[0][1])) and history[0][1] <= 0.3  # chance level at step 0
    assert history[-1][1] >= 0.9, history
    for record in records[1:]:
        assert {"step", "reward/mean", "role/speaker/reward_mean", "role/listener/reward_mean"} <= record.keys()


def test_same_seed_same_metrics_and_resume_is_exact(tmp_path):
    settings = ["trainer.steps=6", "trainer.eval_every=3", "trainer.tasks_per_step=8", "trainer.stop_at_accuracy=null"]
    straight = train("quickstart.yaml", tmp_path / "a", *settings)
    again = train("quickstart.yaml", tmp_path / "b", *settings)
    assert [r["reward/mean"] for r in straight[1:]] == [r["reward/mean"] for r in again[1:]]

    first_half = train("quickstart.yaml", tmp_path / "c", *settings, "trainer.steps=3", "trainer.save_every=3")
    assert (tmp_path / "c" / "checkpoints" / "step_000003" / "COMPLETE").exists()
    assert main(["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(tmp_path / "c"), "--resume",
                 "--set", "logging.report=false", *sum((["--set", s] for s in settings), [])]) == 0
    resumed = [json.loads(line) for line in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    assert len(first_half) == 4 and len(resumed) == 7
    assert [r["reward/mean"] for r in resumed[1:]] == [r["reward/mean"] for r in straight[1:]]
    assert resumed[-1]["eval/accuracy"] == straight[-1]["eval/accuracy"]


def test_run_directory_layout(tmp_path):
    train("quickstart.yaml", tmp_path, "trainer.steps=2", "trainer.tasks_per_step=4")
    assert (tmp_path / "config.yaml").exists()
    assert (tmp_path / "trajectories" / "train.jsonl").stat().st_size > 0
    assert (tmp_path / "trajectories" / "eval.jsonl").stat().st_size > 0
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    assert (checkpoint / "COMPLETE").exists() and (checkpoint / "trainer_state.json").exists()
    assert list((checkpoint / "shared").rglob("*.safetensors"))


def test_lora_checkpoint_has_one_peft_adapter_per_role(tmp_path):
    train("quickstart_lora.yaml", tmp_path, "trainer.steps=1", "trainer.tasks_per_step=4")
    adapters = tmp_path / "checkpoints" / "step_000001" / "base" / "adapters"
    assert sorted(p.name for p in adapters.iterdir()) == ["listener", "speaker"]
    assert all((adapters / name / "adapter_config.json").exists() for name in ("listener", "speaker"))


def test_frozen_role_generates_but_its_group_never_updates(tmp_path):
    records = train("quickstart_separate.yaml", tmp_path, "trainer.steps=2", "trainer.tasks_per_step=4",
                    "models.listener_model.trainable=false", "roles.listener.trainable=false")
    step = records[-1]
    assert "group/speaker_model/policy_loss" in step
    assert not any(key.startswith("group/listener_model/") and key.endswith("policy_loss") for key in step)
    assert step["role/listener/turns"] > 0


def test_eval_command_scores_a_checkpoint(tmp_path, capsys):
    train("quickstart.yaml", tmp_path / "run", "trainer.steps=2", "trainer.tasks_per_step=4")
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert main(["eval", str(EXAMPLES / "quickstart.yaml"), "--checkpoint", str(checkpoint),
                 "--run-dir", str(tmp_path / "eval")]) == 0
    assert "eval/accuracy" in capsys.readouterr().out
    record = json.loads((tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 2


def test_arith_warm_start_checkpoint_loads_and_trains(tmp_path):
    records = train("arith_team_fix_credit.yaml", tmp_path, "trainer.steps=1", "trainer.tasks_per_step=4",
                    "trainer.eval_size=50")
    assert records[0]["eval/accuracy"] >= 0.2  # warm start, not a random model
    assert "role/verifier/reward_mean" in records[1]


def _local_trainer(tmp_path, *overrides):
    from unimas.config.loading import load_config
    from unimas.output.rundir import RunDir
    from unimas.preflight.validate import validate
    from unimas.runtime.local import LocalTransport
    from unimas.training.trainer import Trainer

    config = load_config(EXAMPLES / "quickstart.yaml", ["trainer.steps=3", "trainer.tasks_per_step=4",
                                                       "trainer.stop_at_accuracy=null", *overrides])
    experiment = validate(config)
    transport = LocalTransport.start(config, experiment.registry)
    return Trainer(experiment, RunDir(tmp_path).create(), transport), transport


def _break_once(transport, group, after_calls):
    calls = {"n": 0}
    real = transport.groups[group].generate

    def flaky(requests):
        calls["n"] += 1
        if calls["n"] == after_calls:
            raise RuntimeError("simulated crash")
        return real(requests)

    transport.groups[group].generate = flaky


def test_local_group_failure_names_group_and_step(tmp_path):
    import asyncio

    from unimas.errors import ModelGroupError

    trainer, transport = _local_trainer(tmp_path)
    _break_once(transport, "shared", after_calls=5)  # step-0 eval and step 1 take 2 calls each; step 2 fails
    failure = r"model group 'shared' failed during step 2 \(generate\).*simulated crash"
    with pytest.raises(ModelGroupError, match=failure):
        asyncio.run(trainer.run())


def test_local_group_is_rebuilt_and_the_step_retried(tmp_path):
    import asyncio

    trainer, transport = _local_trainer(tmp_path, "runtime.restart_failed_groups=true", "trainer.save_every=1")
    _break_once(transport, "shared", after_calls=6)  # fails in step 2, after the step-1 checkpoint
    history = asyncio.run(trainer.run())
    assert [r["step"] for r in history] == [0, 1, 2, 3]


def test_graph_workflow_trains_exactly_like_the_python_one(tmp_path):
    settings = ["trainer.steps=4", "trainer.eval_every=2", "trainer.tasks_per_step=8", "trainer.stop_at_accuracy=null"]
    python = train("quickstart.yaml", tmp_path / "python", *settings)
    graph = train("quickstart_graph.yaml", tmp_path / "graph", *settings)
    assert [r["reward/mean"] for r in graph[1:]] == [r["reward/mean"] for r in python[1:]]
    assert evals(graph) == evals(python)
