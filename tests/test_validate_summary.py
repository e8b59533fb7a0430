"""`unimas validate` shows the algorithm that will run, and `--episodes N` the values every reward gives."""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

from tests.conftest import EXAMPLES
from unimas.cli import main

QUICKSTART = EXAMPLES / "quickstart.yaml"

PENALTY_PLUGIN = """
    import unimas

    def listener_penalty(trajectory, task):
        return {"listener": -0.5}

    def per_turn_penalty(trajectory, task):
        return {turn.id: -1.0 for turn in trajectory.turns("speaker")}

    @unimas.hookimpl
    def unimas_rewards():
        return {"listener_penalty": listener_penalty, "per_turn_penalty": per_turn_penalty}
"""


def validate(capsys, *args) -> str:
    code = main(["validate", *map(str, args)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_plain_algorithm_lists_every_extension_point_and_its_default(capsys):
    out = validate(capsys, QUICKSTART)
    algorithm = out[out.index("algorithm:"):]
    for line in ("  estimator: grpo", "  loss: vanilla", "  rollout control: default", "  replay: none",
                 "  update order: default: all groups in parallel", "  credit shaper: none",
                 "  max_staleness: 0 (synchronous", "  forking: no"):
        assert line in algorithm, (line, algorithm)


def test_plugins_in_force_are_named_with_params_and_provider(capsys):
    out = validate(capsys, QUICKSTART, "--set", "algorithm.rollout={name: entropy_branch, params: {roots: 2}}",
                   "--set", "algorithm.update_order={name: reverse_execution}",
                   "--set", "algorithm.credit={name: gdpo, params: {channels: [exact_match], weights: [1.0]}}",
                   "--set", "algorithm.max_staleness=2", "--set", "models.shared.algorithm={loss: gspo}")
    assert "rollout control: entropy_branch {'roots': 2} (from unimas)" in out
    assert "update order: reverse_execution (from unimas)" in out
    assert "credit shaper: gdpo {'channels': ['exact_match'], 'weights': [1.0]} (from unimas)" in out
    assert "max_staleness: 2 (asynchronous: stale turns drop" in out
    assert "forking: algorithm.rollout 'entropy_branch' forks recorded episodes" in out
    assert "models.shared.algorithm: loss gspo" in out


def test_dry_run_prints_sample_values_of_every_reward_per_role(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "penalties.py").write_text(textwrap.dedent(PENALTY_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    tree = yaml.safe_load(QUICKSTART.read_text())
    tree["plugins"] = ["penalties"]
    tree["rewards"] += [{"name": "listener_penalty", "level": "role"}, {"name": "per_turn_penalty", "level": "turn"}]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tree))
    out = validate(capsys, config, "--episodes", 8)
    assert "reward exact_match (level trajectory, weight 1): mean " in out and "; first: " in out
    role_reward = out[out.index("reward listener_penalty"):]
    assert "keys listener\n    listener: mean -0.5 (min -0.5, max -0.5; first: -0.5, -0.5, -0.5, -0.5 ...)" \
        in role_reward
    turn_reward = out[out.index("reward per_turn_penalty"):]
    assert "\n    speaker: mean -1 (min -1, max -1; first: -1, -1, -1, -1 ...)" in turn_reward


def test_an_estimator_with_values_shows_its_critic(capsys):
    assert "  critic: per_group, gamma " in validate(capsys, EXAMPLES / "quickstart_ppo.yaml")
    assert "  critic:" not in validate(capsys, QUICKSTART)
