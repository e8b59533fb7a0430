"""Math team: rewards on known cases, answer extraction, datasets, the bounded loop, and both example configs."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from unimas_plugins.math_rewards import equivalent, math_correct, math_fix_or_break, math_format, verdict_correct
from unimas_workflows.math_team import boxed_answer, gsm8k_answer, math_jsonl, math_parquet, math_synthetic, math_team

from unimas.errors import UserError
from unimas.trajectory import GraphTrajectory, TurnNode

EXAMPLES = {"math_team_cpu.yaml": ("team",), "math_team_real_model.yaml": ("team",),
            "math_team_real_model_ppo.yaml": ("team",), "math_team_real_model_central_critic.yaml": ("team", "central")}
"""Example -> its model groups (each pointed at the tiny chat model; the critic variants train with GAE)."""
LEVELS = {"math_correct#0": "trajectory", "math_correct#1": "trajectory", "verdict_correct": "turn",
          "math_format": "turn", "math_fix_or_break": "role"}


@pytest.mark.parametrize("a, b", [("1/2", "0.5"), ("0.5", "\\frac{1}{2}"), ("1/2", "\\frac{1}{2}"),
                                  ("$\\frac{1}{2}$", "0.5"), ("\\boxed{\\frac{1}{2}}", "1/2"), ("1,234", "1234"),
                                  ("-3", "-3.0"), ("\\frac12", "0.5"), ("x+1", "1+x")])
def test_equivalent_answers(a, b):
    assert equivalent(a, b) and equivalent(b, a)


@pytest.mark.parametrize("a, b", [("2", "3"), ("1/2", "1/3"), ("0.5", "\\frac{1}{3}"), ("", "1"), ("1", "")])
def test_different_answers(a, b):
    assert not equivalent(a, b)


GARBAGE = [None, "", "   ", "garbage", "\\frac{", "}}}{{{", "{" * 300, "1/0", "0/0", "9^9^9^9^9^9", "x" * 10_000,
           "\\boxed{", "$$$", "\x00\xff", "ok", 12, 3.5, ["1"], {"a": 1}, "<|im_end|>", "NaN", "inf"]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_scores_zero_and_never_raises(garbage):
    trajectory = GraphTrajectory("e", "t", task={"answer": "2"}, outcome={"answer": garbage, "proposal": garbage})
    assert math_correct(trajectory, {"answer": "2"}) == 0.0
    assert math_correct(trajectory, {"answer": garbage}) in (0.0, 1.0)
    assert math_fix_or_break(trajectory, {"answer": "2"}) == {"refiner": 0.0}
    assert math_correct(GraphTrajectory("e", "t", outcome=garbage), {}) == 0.0  # a broken outcome too


def test_gsm8k_and_math_extraction():
    assert gsm8k_answer("She pays 617 + 617 = <<617+617=1234>>1234.\n#### 1,234") == "1234"
    assert gsm8k_answer("no marker") is None
    assert boxed_answer("so $x = \\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert boxed_answer("\\boxed{1} then \\boxed{\\sqrt{2}}") == "\\sqrt{2}"
    assert boxed_answer("\\boxed{unbalanced") is None


def _trajectory(*turns, **outcome):
    trajectory = GraphTrajectory("e", "t", task={"answer": "1/2"}, outcome=outcome)
    for turn_id, parsed in turns:
        role = turn_id.split("#")[0]
        trajectory.add_node(TurnNode(id=turn_id, role=role, model_group="g", prompt="", text=str(parsed),
                                     parsed=parsed, parse_error=None if parsed is not None else "no"))
    return trajectory


def test_verdict_format_and_fix_credit():
    trajectory = _trajectory(("solver#0", "3"), ("verifier#0", "wrong"), ("refiner#0", "0.5"), ("verifier#1", "wrong"),
                             answer="0.5", proposal="3",
                             checks=[{"turn": "verifier#0", "proposal": "3", "verdict": "wrong"},
                                     {"turn": "verifier#1", "proposal": "0.5", "verdict": "wrong"},
                                     {"turn": "gone#9", "proposal": "1", "verdict": "ok"}])
    task = {"answer": "\\frac{1}{2}"}
    assert verdict_correct(trajectory, task) == {"verifier#0": 1.0, "verifier#1": 0.0}
    assert math_format(trajectory, task) == {"solver#0": 1.0, "verifier#0": 1.0, "refiner#0": 1.0, "verifier#1": 1.0}
    assert math_correct(trajectory, task) == 1.0
    assert math_fix_or_break(trajectory, task) == {"refiner": 1.0}
    broken = _trajectory(("solver#0", None), answer="7", proposal="1/2")
    assert math_format(broken, task) == {"solver#0": 0.0}
    assert math_fix_or_break(broken, task, role="verifier") == {"verifier": -1.0}


class ScriptedContext:
    """Plays a scripted list of outputs per role; records the order of turns."""

    def __init__(self, outputs):
        self.outputs, self.calls = {r: list(v) for r, v in outputs.items()}, []

    async def act(self, role, after=(), **variables):
        index = sum(1 for r, _ in self.calls if r == role)
        text = self.outputs[role].pop(0)
        self.calls.append((role, variables))
        parsed = text if role != "verifier" else (text.split()[0] if text.split()[0] in ("ok", "wrong") else None)
        return SimpleNamespace(id=f"{role}#{index}", text=text, parsed=parsed)


@pytest.mark.parametrize("max_rounds, verdicts, roles", [
    (2, ["ok"], ["solver", "verifier"]),
    (2, ["wrong: no", "ok"], ["solver", "verifier", "refiner", "verifier"]),
    (2, ["wrong", "garbage"], ["solver", "verifier", "refiner", "verifier", "refiner"]),
    (1, ["wrong"], ["solver", "verifier", "refiner"]),
    (0, [], ["solver"]),
])
def test_the_loop_is_bounded_and_refines_only_on_objection(max_rounds, verdicts, roles):
    ctx = ScriptedContext({"solver": ["3"], "verifier": verdicts, "refiner": ["4", "5"]})
    outcome = asyncio.run(math_team(ctx, {"question": "2+2"}, max_rounds=max_rounds))
    assert [role for role, _ in ctx.calls] == roles
    assert outcome["refinements"] == roles.count("refiner")
    assert outcome["answer"] == {0: "3", 1: "4", 2: "5"}[roles.count("refiner")] and outcome["proposal"] == "3"
    refiners = [v for r, v in ctx.calls if r == "refiner"]
    if refiners:
        assert refiners[0]["objection"] == verdicts[0] and refiners[0]["question"] == "2+2"


def test_datasets(tmp_path):
    rows = [{"question": "q1", "answer": "x\n#### 1,234"}, {"question": "q2", "answer": "no final answer"}]
    path = tmp_path / "gsm.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [t["answer"] for t in math_jsonl("train", 0, str(path), answer_format="gsm8k")] == ["1234"]
    with pytest.raises(UserError):
        math_jsonl("train", 0, str(path), question="problem")

    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_list([{"problem": "p", "solution": "so \\boxed{\\frac{1}{2}}"}])
    table.to_parquet(str(tmp_path / "math.parquet"))
    for params in ({"path": str(tmp_path / "math.parquet")},):
        tasks = math_parquet("train", 0, question="problem", answer="solution", answer_format="math", **params)
        assert tasks[0]["question"] == "p" and tasks[0]["answer"] == "\\frac{1}{2}"
    datasets.DatasetDict({"train": table, "test": table}).save_to_disk(str(tmp_path / "hf"))
    tasks = math_parquet("eval", 0, str(tmp_path / "hf"), question="problem", answer="solution", answer_format="math")
    assert tasks[0]["answer"] == "\\frac{1}{2}"

    train, again, held_out = (math_synthetic("train", 0, size=40), math_synthetic("train", 0, size=40),
                              math_synthetic("eval", 0, size=40))
    assert train == again and train != held_out
    assert all(equivalent(t["answer"], t["answer"]) for t in train)
    assert {"3+4", "3*4"} & {t["question"] for t in math_synthetic("train", 1, size=400, kinds=["add", "mul"])}
    assert any("/" in t["answer"] for t in train)


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_validates_and_trains_two_steps(example, chat_model, repo, tmp_path):
    from unimas.cli import main
    from unimas.trajectory import read_jsonl

    config = str(repo / "examples" / example)
    path = [arg for group in EXAMPLES[example]
            for arg in ("--set", f"models.{group}.options.path={chat_model}", "--set", f"models.{group}.resources.gpus=0")]
    assert main(["validate", config, *path, "--episodes", "4"]) == 0
    small = ["--set", "trainer.steps=2", "--set", "trainer.tasks_per_step=4", "--set", "trainer.eval_size=4",
             "--set", "algorithm.group_size=2", "--set", "logging.report=false",
             "--set", "roles.solver.generation.max_new_tokens=8",
             "--set", "roles.refiner.generation.max_new_tokens=8",
             "--set", "roles.verifier.generation.max_new_tokens=4",
             "--set", "trainer.save_every=0"]
    assert main(["train", config, "--run-dir", str(tmp_path / "run"), *path, *small]) == 0
    trajectories = read_jsonl(tmp_path / "run" / "trajectories" / "train.jsonl")
    assert trajectories and not any(t.failed for t in trajectories)
    assert {"solver", "verifier", "refiner"} <= {turn.role for t in trajectories for turn in t.turns()}
    for trajectory in trajectories:
        assert set(trajectory.rewards) == set(LEVELS)
        for key, level in LEVELS.items():
            value = trajectory.rewards[key]
            if level == "trajectory":
                assert isinstance(value, float)
            else:
                ids = {turn.id for turn in trajectory.turns()} if level == "turn" else {"refiner"}
                assert isinstance(value, dict) and set(value) <= ids
        assert all(turn.reward is not None for turn in trajectory.turns())
