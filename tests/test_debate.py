"""Debate with a frozen judge: dataset, verdict parsing, rewards, and every debate example config for 2 steps."""

import importlib.metadata
import json
import re

import pytest
import tomllib
from unimas_workflows.debate import (
    _is_prime,
    debate_claims,
    debate_on_side,
    debate_winner,
    judge_correct,
    verdict_label,
)

from tests.conftest import EXAMPLES, REPO
from tests.loopback import completions_server
from unimas.cli import main
from unimas.trajectory import GraphTrajectory, TurnNode, read_jsonl

DEBATERS = ("debater_a", "debater_b")
ROLES = (*DEBATERS, "judge")


def _plugin_args() -> list[str]:
    """The debate module registers through the `builtin_debate` entry point; an install made before that entry
    point existed does not list it yet, so name the module for the run instead (same plugin either way)."""
    installed = {ep.value for ep in importlib.metadata.entry_points(group="unimas")}
    return [] if "unimas_workflows.debate" in installed else ["--set", "plugins=[unimas_workflows.debate]"]


def test_entry_point_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["unimas"]["builtin_debate"] == "unimas_workflows.debate"


# -- dataset --------------------------------------------------------------------------------------------

def test_claims_are_deterministic_true_and_balanced():
    tasks = debate_claims("train", seed=3, size=300)
    assert tasks == debate_claims("train", seed=3, size=300)
    assert tasks != debate_claims("eval", seed=3, size=300)
    for task in tasks:
        assert task["truth"] in (task["side_a"], task["side_b"])
        assert task["side_a"] != task["side_b"]
        assert task["truth"] == (task["side_a"] if task["answer"] == "A" else task["side_b"])
        numbers = [int(n) for n in re.findall(r"\d+", task["question"])]
        if task["kind"] == "prime":
            assert task["truth"] == ("yes" if _is_prime(numbers[0]) else "no")
        elif task["kind"] == "sum":
            assert task["truth"] == ("yes" if numbers[0] + numbers[1] == numbers[2] else "no")
        else:
            assert task["truth"] == str(max(numbers))
    labels = [t["answer"] for t in tasks]
    assert 0.35 < labels.count("A") / len(labels) < 0.65
    kinds = [t for t in tasks if t["kind"] in ("prime", "sum")]
    assert 0.3 < sum(t["truth"] == "yes" for t in kinds) / len(kinds) < 0.7
    assert {t["kind"] for t in debate_claims("eval", 0, size=10, kinds=["prime"])} == {"prime"}


# -- verdict and rewards on a hand-made episode ------------------------------------------------------------

TASK = {"question": "Is 9 a prime number?", "side_a": "yes", "side_b": "no", "truth": "no", "answer": "B"}


@pytest.mark.parametrize("parsed, label", [("A", "A"), (" b ", "B"), ("Debater A", "A"), ("no", "B"),
                                           ("YES", "A"), (None, None), ("A or B", None), ("maybe", None)])
def test_verdict_label(parsed, label):
    assert verdict_label(parsed, TASK) == label


def _episode(verdict, texts=("yes it is", "no: 9 = 3*3")):
    traj = GraphTrajectory(episode_id="e", task_id="t", task=TASK)
    for role, text in zip(DEBATERS, texts):
        traj.add_node(TurnNode(id=f"{role}#0", role=role, model_group="g", prompt="", text=text))
    traj.add_node(TurnNode(id="judge#0", role="judge", model_group="j", prompt="", text=str(verdict)))
    traj.outcome = {"verdict": verdict, "debaters": list(DEBATERS)}
    return traj


def test_rewards_follow_the_verdict():
    right, wrong, none = _episode("B"), _episode("A"), _episode(None)
    assert (judge_correct(right, TASK), judge_correct(wrong, TASK), judge_correct(none, TASK)) == (1.0, 0.0, 0.0)
    assert debate_winner(right, TASK) == {"debater_a": -1.0, "debater_b": 1.0}
    assert debate_winner(wrong, TASK, lose=0.0) == {"debater_a": 1.0, "debater_b": 0.0}
    assert debate_winner(none, TASK) == {"debater_a": 0.0, "debater_b": 0.0}
    assert debate_on_side(right, TASK) == {"debater_a#0": 1.0, "debater_b#0": 1.0}
    assert debate_on_side(_episode("B", ("nope", "not prime")), TASK) == {"debater_a#0": 0.0, "debater_b#0": 0.0}


# -- the example configs, 2 training steps each -------------------------------------------------------------

class Judge:
    """Stand-in for a served judge (a test fixture): a fixed verdict derived from the prompt's length."""

    prompts: list[str] = []

    @classmethod
    def answer(cls, path, body):
        assert path == "/v1/completions" and body["model"] == "judge"
        cls.prompts.append(body["prompt"])
        return {"text": f"<verdict>{'AB'[len(body['prompt']) % 2]}</verdict>", "finish_reason": "stop"}


@pytest.fixture
def judge_endpoint():
    with completions_server(Judge.answer) as url:
        yield url


TORCH_GROUPS = {
    "debate_cpu": ("policy", "judge_model"),
    "debate_lora_cpu": ("base", "judge_model"),
    "debate_api_judge": ("debater_a_model", "debater_b_model"),
    "debate_real_model": ("policy", "judge_model"),
}


def _short(config: str, chat_model, extra=()) -> list[str]:
    args = [f"models.{group}.options.path={chat_model}" for group in TORCH_GROUPS[config]]
    args += ["trainer.steps=2", "trainer.tasks_per_step=2", "algorithm.group_size=2", "trainer.eval_size=2",
             "logging.report=false", "logging.console=false", *extra]
    return [*_plugin_args(), *[part for arg in args for part in ("--set", arg)]]


@pytest.mark.parametrize("config", sorted(TORCH_GROUPS))
def test_example_validates_and_trains_two_steps(config, chat_model, tmp_path, request):
    extra = []
    if config == "debate_api_judge":
        extra = [f"models.judge_model.options.endpoint={request.getfixturevalue('judge_endpoint')}"]
        Judge.prompts.clear()
    path = str(EXAMPLES / f"{config}.yaml")
    overrides = _short(config, chat_model, extra)
    assert main(["validate", path, *overrides, "--episodes", "2"]) == 0
    assert main(["train", path, "--run-dir", str(tmp_path / "run"), *overrides]) == 0

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "eval/accuracy" in m] == [0, 2]
    assert all(m.get("episode/failures", 0.0) == 0.0 for m in metrics)
    assert not any(key.startswith("group/judge_model/") and "loss" in key for m in metrics for key in m)
    for split in ("train", "eval"):
        trajectories = read_jsonl(tmp_path / "run" / "trajectories" / f"{split}.jsonl")
        assert trajectories
        for traj in trajectories:
            assert traj.error is None
            rounds = traj.outcome["rounds"]
            assert {role: len(traj.turns(role)) for role in ROLES} == {"debater_a": rounds, "debater_b": rounds,
                                                                       "judge": 1}
            assert traj.outcome["verdict"] in ("A", "B", None)
            rewards = traj.rewards
            assert rewards["judge_correct"] == float(traj.outcome["verdict"] == traj.task["answer"])
            assert set(rewards["debate_winner"]) == set(DEBATERS)
            assert set(rewards["debate_on_side"]) == {t.id for role in DEBATERS for t in traj.turns(role)}
            judge_turn = traj.turns("judge")[0]
            assert {a for a, _ in traj.graph.in_edges(judge_turn.id)} == {t.id for role in DEBATERS
                                                                          for t in traj.turns(role)}
            assert all(turn.reward is not None for turn in traj.turns())
            if split == "train":
                assert judge_turn.advantage is None  # frozen: never credited
                assert all(t.advantage is not None for role in DEBATERS for t in traj.turns(role))
    if config == "debate_api_judge":
        assert Judge.prompts and all("Who is right?" in prompt for prompt in Judge.prompts)
        verdicts = [t.outcome["verdict"] for t in read_jsonl(tmp_path / "run" / "trajectories" / "train.jsonl")]
        assert all(v in ("A", "B") for v in verdicts)
        winners = [t.rewards["debate_winner"] for t in read_jsonl(tmp_path / "run" / "trajectories" / "train.jsonl")]
        assert all(sorted(w.values()) == [-1.0, 1.0] for w in winners)


def test_simultaneous_rounds_do_not_see_the_same_round(chat_model, tmp_path):
    path = str(EXAMPLES / "debate_cpu.yaml")
    overrides = _short("debate_cpu", chat_model, ["workflow.params.order=simultaneous", "workflow.params.rounds=3",
                                                  "trainer.steps=1"])
    assert main(["train", path, "--run-dir", str(tmp_path / "run"), *overrides]) == 0
    traj = read_jsonl(tmp_path / "run" / "trajectories" / "eval.jsonl")[0]
    sources = {node.id: {a for a, _ in traj.graph.in_edges(node.id)} for node in traj.turns()}
    assert sources["debater_a#0"] == sources["debater_b#0"] == set()
    assert sources["debater_b#1"] == {"debater_a#0", "debater_b#0"}
    assert sources["debater_a#2"] == {"debater_a#0", "debater_b#0", "debater_a#1", "debater_b#1"}


def test_bad_rounds_is_a_config_error(chat_model, tmp_path, capsys):
    overrides = _short("debate_cpu", chat_model, ["workflow.params.rounds=0"])
    assert main(["train", str(EXAMPLES / "debate_cpu.yaml"), "--run-dir", str(tmp_path / "run"), *overrides]) != 0
    assert "rounds" in capsys.readouterr().err
