"""A replay buffer survives checkpoints: a resumed run replays exactly what an unbroken one would."""

import json

from unimas_plugins.methods.replay import VerifiedSuccesses

from tests.conftest import EXAMPLES
from tests.test_kill_resume import VOLATILE
from unimas.cli import main
from unimas.training.rollout import REPLAY_STATE
from unimas.trajectory import GraphTrajectory, TurnNode

REPLAY = ["trainer.tasks_per_step=4", "algorithm.group_size=2", "trainer.eval_every=2", "trainer.save_every=2",
          "trainer.eval_size=4", "logging.report=false", "logging.console=false",
          "algorithm.replay={name: verified_successes, params: {revisit: 0.5, threshold: 1.0}}"]


def _episode(task_id: str, reward: float) -> GraphTrajectory:
    traj = GraphTrajectory(episode_id=f"{task_id}-e", task_id=task_id, task={"id": task_id, "target": "a"})
    traj.add_node(TurnNode(id="speaker#0", role="speaker", model_group="g", prompt="p", text="a",
                           prompt_ids=[1, 2], response_ids=[3], logprobs=[-0.5], reward=reward), [])
    traj.rewards = {"exact_match": reward}
    return traj


def test_verified_successes_state_round_trips_through_json():
    buffer = VerifiedSuccesses(threshold=1.0, per_task=2)
    buffer.observe([_episode("t1", 1.0), _episode("t2", 0.0), _episode("t3", 1.0)], step=3)
    buffer.observe([_episode("t1", 1.0)], step=4)
    restored = VerifiedSuccesses(threshold=1.0, per_task=2)
    restored.load_state(json.loads(json.dumps(buffer.state())))
    assert list(restored.kept) == list(buffer.kept) == ["t3", "t1"]  # keeping order: t1 was refreshed last
    for key in buffer.kept:
        assert [(t.to_dict(), s) for t, s in restored.kept[key]] == [(t.to_dict(), s) for t, s in buffer.kept[key]]


def _metrics(run) -> list[dict]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if not any(part in k for part in VOLATILE)} for m in lines]


def test_a_resumed_run_replays_like_an_unbroken_one(tmp_path):
    config = str(EXAMPLES / "quickstart.yaml")
    settings = lambda steps: [part for s in [*REPLAY, f"trainer.steps={steps}"] for part in ("--set", s)]  # noqa: E731
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main(["train", config, "--run-dir", str(whole), *settings(6)]) == 0
    assert main(["train", config, "--run-dir", str(resumed), *settings(4)]) == 0
    saved = json.loads((resumed / "checkpoints" / "step_000004" / REPLAY_STATE).read_text())
    assert saved["previous_step"] == 3 and saved["previous"] and saved["buffer"]  # something to replay
    assert main(["train", config, "--run-dir", str(resumed), "--resume", *settings(6)]) == 0
    assert _metrics(resumed) == _metrics(whole)
