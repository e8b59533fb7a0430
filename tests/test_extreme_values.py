"""Huge but finite numbers, and NaN/inf, cannot break the end of a run.

The policy (``unimas/algorithms/credit.py``): a reward value must be a finite number. NaN and ±inf fail their episode,
and when every evaluation episode fails the run stops with exit 2 naming the reward. A finite value beyond
±1e6 (``REWARD_BOUND``) is clipped to it, and so is a weighted term or a turn's sum; the step counts them in
``reward/clipped`` and the trajectory keeps the original in ``unclipped_rewards``. Whether a reward plugin
or an agent (``POST /rewards`` through the gateway) sends the number makes no difference. ``unimas report``
renders any metrics.jsonl whose values are extreme or not numbers, leaving out (and counting) what a plot
cannot draw.
"""

from __future__ import annotations

import json
import math
import shutil
import types
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES
from unimas.algorithms.credit import REWARD_BOUND
from unimas.cli import main
from unimas.gateway.errors import GatewayError
from unimas.gateway.protocol import parse_json
from unimas.gateway.rewards import agent_reward
from unimas.gateway.sessions import Episode
from unimas.report.plots import series
from unimas.trajectory import GraphTrajectory, TurnNode

HUGE_INT = 10 ** 400
"""Beyond any float: ``float()`` of it raises, JSON and ``str`` still take it (400 digits < 4300)."""

PLUGIN = '''
import math
import unimas

VALUES = {"1e308": 1e308, "-1e308": -1e308, "huge-int": 10 ** 400, "1e6": 1e6,
          "inf": math.inf, "-inf": -math.inf, "nan": math.nan}

def extreme(trajectory, task, value, level="trajectory"):
    number = VALUES[value]
    if level == "role":
        return {"speaker": number, "listener": -number}
    if level == "turn":
        return {turn.id: number for turn in trajectory.turns()}
    return number

@unimas.hookimpl
def unimas_rewards():
    return {"extreme": extreme}
'''

RUNS = {
    # name: (level, value name, weight, what the first training trajectory's "extreme" reward becomes)
    "trajectory 1e308": ("trajectory", "1e308", 1.0, REWARD_BOUND),
    "trajectory -1e308": ("trajectory", "-1e308", 1.0, -REWARD_BOUND),
    "trajectory integer beyond any float": ("trajectory", "huge-int", 1.0, REWARD_BOUND),
    "role 1e308 and -1e308": ("role", "1e308", 1.0, {"speaker": REWARD_BOUND, "listener": -REWARD_BOUND}),
    "turn -1e308": ("turn", "-1e308", 1.0, {"speaker#0": -REWARD_BOUND, "listener#0": -REWARD_BOUND}),
    "weight 1e300 overflows the term": ("trajectory", "1e6", 1e300, REWARD_BOUND),
}
REFUSED = ["inf", "-inf", "nan"]


@pytest.fixture
def train(tmp_path, monkeypatch):
    """Train the quickstart for 2 tiny steps with an ``extreme`` reward entry next to exact_match."""
    module = f"extreme_plugin_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))

    def run(level: str, value: str, weight: float) -> tuple[int, Path]:
        tree = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
        tree["plugins"] = [module]
        tree["rewards"].append({"name": "extreme", "level": level, "weight": weight,
                                "params": {"value": value, "level": level}})
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(tree))
        run_dir = tmp_path / "run"
        settings = ["trainer.steps=2", "trainer.tasks_per_step=2", "trainer.eval_size=4",
                    "trainer.stop_at_accuracy=null", "logging.report=false"]
        code = main(["train", str(config), "--run-dir", str(run_dir), *[a for s in settings for a in ("--set", s)]])
        return code, run_dir

    return run


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _all_finite(records: list[dict]) -> bool:
    return all(math.isfinite(v) for r in records for v in r.values() if isinstance(v, float))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RUNS))
def test_an_extreme_reward_is_clipped_counted_and_recorded(case, train, capsys):
    level, value, weight, expected = RUNS[case]
    code, run_dir = train(level, value, weight)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err
    records = _records(run_dir)
    training = [r for r in records if "reward/clipped" in r]
    assert [r["step"] for r in training] == [1, 2] and _all_finite(records)
    assert all(r["reward/clipped"] > 0 for r in training)
    assert all(r["credit/nonfinite_advantages"] == 0 for r in training)
    assert all(r["group/shared/nonfinite_skipped"] == 0 for r in training)  # a real update, not a skipped one
    first = json.loads((run_dir / "trajectories" / "train.jsonl").read_text().splitlines()[0])
    assert first["error"] is None and first["rewards"]["extreme"] == expected
    assert all(abs(node["reward"]) <= REWARD_BOUND for node in first["nodes"] if node["kind"] == "turn")
    original = first["unclipped_rewards"].get("extreme")
    if value == "huge-int":
        assert original == f"an integer of {HUGE_INT.bit_length()} bits"
    elif value == "1e6":  # only the weighted term was clipped: the reward itself was in range
        assert original is None
    else:
        numbers = original.values() if isinstance(original, dict) else [original]
        assert {abs(n) for n in numbers} == {1e308}
    assert main(["report", str(run_dir)]) == 0  # and the run's report renders
    assert "Traceback" not in capsys.readouterr().err and (run_dir / "report.html").is_file()


@pytest.mark.parametrize("value", REFUSED)
def test_a_non_finite_reward_is_refused_naming_the_reward(value, train, capsys):
    """Every episode gets it, so every evaluation episode fails: exit 2 with the documented message."""
    code, run_dir = train("trajectory", value, 1.0)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "reward 'extreme' (rewards.extreme)" in err and "rewards must be finite" in err
    records = _records(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    assert not any("reward/clipped" in r for r in records)  # stopped before training on anything


# -- the gateway: what an agent posts --------------------------------------------------------------------------

def _episode() -> Episode:
    trajectory = GraphTrajectory(episode_id="e0", task_id="t0")
    trajectory.add_node(TurnNode(id="speaker#0", role="speaker", model_group="m", prompt="", response_ids=[1]))
    return Episode(types.SimpleNamespace(trajectory=trajectory), roles={}, loop=None)


@pytest.mark.parametrize(("raw", "counted", "clipped"), [
    (b"0.5", 0.5, False),
    (b"1e308", REWARD_BOUND, True),
    (b"-1e308", -REWARD_BOUND, True),
    (b"1" + b"0" * 400, REWARD_BOUND, True),
])
def test_an_agent_reward_in_any_finite_range_is_accepted_and_says_if_it_is_clipped(raw, counted, clipped):
    episode = _episode()
    answer = episode.post_reward(parse_json(b'{"turn": "speaker#0", "reward": ' + raw + b"}"))
    assert answer == {"turn": "speaker#0", "reward": counted, "clipped": clipped}
    assert episode.rewards["speaker#0"] == json.loads(raw)  # kept as posted; credit clips and records it


@pytest.mark.parametrize("raw", [b"1e400", b"-1e400", b"NaN", b"Infinity", b"-Infinity", b'"1e308"', b"true",
                                 b"null"])
def test_an_agent_reward_that_is_not_a_finite_number_is_a_400(raw):
    """JSON's 1e400 parses as inf: it is refused like NaN, text and booleans, and nothing is recorded."""
    episode = _episode()
    with pytest.raises(GatewayError) as refused:
        episode.post_reward(parse_json(b'{"turn": "speaker#0", "reward": ' + raw + b"}"))
    assert refused.value.status == 400 and "'reward' must be a finite number" in str(refused.value)
    assert episode.rewards == {}


def test_a_posted_1e308_is_clipped_and_counted_by_credit():
    from tests.test_credit import assigner

    trajectory = GraphTrajectory(episode_id="e0", task_id="t0")
    for node in ("solver#0", "verifier#0"):
        trajectory.add_node(TurnNode(id=node, role=node[:-2], model_group="m", prompt="", response_ids=[1]))
    trajectory.outcome = {"agent_rewards": {"solver#0": 1e308, "verifier#0": HUGE_INT}}
    credit = assigner([{"name": "agent_reward", "level": "turn", "weight": 2.0}],
                      functions={"agent_reward": agent_reward})
    metrics = credit.allocate([trajectory])
    assert not trajectory.failed, trajectory.error
    assert trajectory.rewards["agent_reward"] == {"solver#0": REWARD_BOUND, "verifier#0": REWARD_BOUND}
    assert [turn.reward for turn in trajectory.turns()] == [REWARD_BOUND, REWARD_BOUND]  # 2 * 1e6, clipped again
    assert metrics["reward/clipped"] == 4.0  # two posted values, two turn sums
    assert trajectory.unclipped_rewards == {"agent_reward": {"solver#0": 1e308, "verifier#0":
                                                             f"an integer of {HUGE_INT.bit_length()} bits"}}
    assert json.loads(trajectory.to_json())["unclipped_rewards"] == trajectory.unclipped_rewards


# -- the report -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("plain-run") / "run"
    short = ["--set", "trainer.steps=2", "--set", "trainer.tasks_per_step=2", "--set", "trainer.eval_size=4",
             "--set", "logging.report=false"]
    assert main(["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(run), *short]) == 0
    return run


PLOTTED = ["reward/mean", "reward/std", "role/speaker/reward_mean", "eval/accuracy", "group/shared/policy_loss",
           "episode/turns", "role/listener/advantage_std"]


def _metric_lines(values: list[str], step: str = "{step}") -> bytes:
    """Training-like records for steps 3, 4, ...: every plotted metric carries the next of ``values``."""
    lines = []
    for index, value in enumerate(values):
        fields = ", ".join(f'"{key}": {value}' for key in PLOTTED)
        lines.append("{" + f'"step": {step.format(step=3 + index)}, ' + fields + "}")
    return ("\n".join(lines) + "\n").encode()


def _turn_rewards(value: float):
    def damage(run: Path) -> None:
        path = run / "trajectories" / "train.jsonl"
        episodes = [json.loads(line) for line in path.read_text().splitlines()]
        for index, episode in enumerate(episodes):
            for node in episode["nodes"]:
                node["reward"] = value if index % 2 else -value
        path.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return damage


def _append(data: bytes):
    def damage(run: Path) -> None:
        with open(run / "metrics.jsonl", "ab") as handle:
            handle.write(data)
    return damage


REPORT_CASES = {
    "1e308": (_append(_metric_lines(["0.5", "1e308"])), "1e+308"),
    "-1e308": (_append(_metric_lines(["0.5", "-1e308"])), "-1e+308"),
    "1e308 and -1e308 in one series": (_append(_metric_lines(["1e308", "-1e308", "1e308"])), "1e+308"),
    "Infinity": (_append(_metric_lines(["0.5", "Infinity"])), "inf"),
    "-Infinity": (_append(_metric_lines(["0.5", "-Infinity"])), "-inf"),
    "NaN": (_append(_metric_lines(["0.5", "NaN"])), "nan"),
    "integer beyond any float": (_append(_metric_lines(["0.5", "1" + "0" * 400])),
                                 f"an integer of {HUGE_INT.bit_length()} bits"),
    "long integer": (_append(_metric_lines(["0.5", "12345678901234567890"])), "1.235e+19"),
    "text where a number belongs": (_append(_metric_lines(["0.5", '"high"'])), "high"),
    "object where a number belongs": (_append(_metric_lines(["0.5", '{"a": 1}'])), "{&#x27;a&#x27;: 1}"),
    "step beyond any float": (_append(_metric_lines(["0.5"], step="1" + "0" * 400)), None),
    "turn rewards of 1e308 and -1e308": (_turn_rewards(1e308), None),
}


@pytest.mark.parametrize("case", list(REPORT_CASES))
def test_report_renders_extreme_and_non_numeric_metric_values(case, plain_run, tmp_path, capsys):
    damage, shown = REPORT_CASES[case]
    run = tmp_path / "run"
    shutil.copytree(plain_run, run)
    damage(run)
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "warning:" not in err, err  # valid JSON: nothing is damage here
    page = (run / "report.html").read_text(encoding="utf-8")
    assert 'id="report-data"' in page and 'id="plot-rewards"' in page
    assert all((run / "plots" / f"{stem}.png").stat().st_size > 1000 for stem in ("rewards", "reward_distribution"))
    if shown is not None:  # the latest value of each metric is in the table, as text
        assert f"<td class=num>{shown}</td>" in page, shown


def test_points_a_plot_cannot_take_are_left_out_and_counted():
    records = [{"step": 0, "x": 0.5}, {"step": 1, "x": 1e308}, {"step": 2, "x": math.nan}, {"step": 3, "x": "high"},
               {"step": 4, "x": HUGE_INT}, {"step": HUGE_INT, "x": 1.0}, {"step": 6, "x": None}, {"step": 7}]
    assert series(records, "x") == ([0], [0.5], 5)  # absent and null values are not counted
