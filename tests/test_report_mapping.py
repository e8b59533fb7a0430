"""Report and console wording: the role-to-model mapping in the report header, dataset ids in the viewer,
and eval results labelled as rewards (they may be graded), not as accuracy."""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from unimas.config.loading import load_config
from unimas.output.console import ConsoleLogger
from unimas.output.rundir import RunDir
from unimas.report.data import load_run, model_mapping, slim_episode
from unimas.report.html import header
from unimas.trajectory import GraphTrajectory, TurnNode

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.yaml"

CONFIG = {
    "models": {
        "shared": {"backend": "torch", "trainable": True, "lora": None},
        "solo": {"backend": "torch", "trainable": True, "lora": None},
        "base": {"backend": "torch", "trainable": True, "lora": {"r": 8}},
        "judge": {"backend": "openai", "trainable": False, "lora": None},
    },
    "roles": {
        "speaker": {"model": "shared", "adapter": None, "trainable": True},
        "listener": {"model": "shared", "adapter": None, "trainable": False},
        "planner": {"model": "solo", "adapter": None, "trainable": True},
        "solver": {"model": "base", "adapter": "sol", "trainable": True},
        "verifier": {"model": "base", "adapter": "ver", "trainable": True},
        "critic": {"model": "judge", "adapter": None, "trainable": False},
    },
    "rewards": [{"name": "exact_match", "level": "trajectory"}],
}


def test_mapping_rows_name_the_scheme_of_every_group():
    rows = {row.group: row for row in model_mapping(CONFIG)}
    assert rows["shared"].scheme == "shared by 2 roles"
    assert rows["shared"].roles == ["speaker", "listener"] and rows["shared"].frozen_roles == ["listener"]
    assert rows["solo"].scheme == "one role (separate)" and rows["solo"].roles == ["planner"]
    assert rows["base"].scheme == "LoRA adapter per role on one base (adapters sol, ver)"
    assert rows["judge"].scheme == "frozen" and rows["judge"].backend == "openai"
    assert rows["judge"].frozen_roles == ["critic"]


def test_mapping_is_empty_without_a_config():
    assert model_mapping({}) == []


def test_report_header_shows_the_mapping_and_eval_reward(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"name": "mapped", **CONFIG}))
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
    page = header(load_run(tmp_path))
    assert "<b>base</b> [torch]: LoRA adapter per role on one base (adapters sol, ver)" in page
    assert "listener (frozen)" in page and "speaker (frozen)" not in page
    assert "eval reward (exact_match) @ step 0" in page and "accuracy" not in page


def test_report_without_config_has_no_mapping(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
    assert 'id="model-mapping"' not in header(load_run(tmp_path))


def _trajectory(task: dict) -> dict:
    traj = GraphTrajectory("s3-t1-0", "s3-t1", task=task, outcome={"_step": 3}, rewards={"exact_match": 1.0})
    traj.add_node(TurnNode("solver#0", "solver", "m", "p", text="1", reward=1.0))
    return traj.to_dict()


def test_viewer_labels_a_task_with_the_dataset_id():
    episode = slim_episode(_trajectory({"id": "gsm8k-0042", "question": "1+0?"}), "exact_match")
    assert episode["task_label"] == "gsm8k-0042" and episode["task_id"] == "s3-t1"
    assert slim_episode(_trajectory({"question": "1+0?"}), "exact_match")["task_label"] == "s3-t1"
    viewer = (Path(__file__).resolve().parents[1] / "unimas" / "report" / "viewer.js").read_text()
    assert "task ${episode.task_label}" in viewer


def _console_lines(overrides: list[str], records: list[dict], mode: str = "train") -> list[str]:
    stream = io.StringIO()
    logger = ConsoleLogger(load_config(QUICKSTART, overrides), RunDir(Path("unused")), stream=stream, mode=mode)
    for record in records:
        logger.log(record)
    logger.close()
    return stream.getvalue().splitlines()


def test_console_labels_eval_results_as_rewards():
    record = {"step": 0, "eval/accuracy": 0.875, "eval/role/speaker/reward_mean": 0.95}
    eval_line, final = _console_lines([], [record])
    assert "eval reward (exact_match) 0.875" in eval_line and "eval credit per turn (sum of rewards): speaker 0.95" in eval_line
    assert "eval reward (exact_match) 0.875 (step 0)" in final
    assert "accuracy" not in eval_line + final


def test_console_names_a_repeated_reward_by_its_place_in_rewards():
    rewards = "rewards=[{name: exact_match, level: turn}, {name: exact_match, level: trajectory}]"
    eval_line, _ = _console_lines([rewards], [{"step": 0, "eval/accuracy": 0.5}], mode="eval")
    assert "eval reward (exact_match, rewards[1]) 0.500" in eval_line and "#" not in eval_line
