"""The plan-code-test-reflect team: sandboxed test runs, HumanEval offline, the workflow's graph and rewards."""

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from unimas_plugins.parsers import code_block
from unimas_workflows import code_team as ct

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.config.schema import RoleConfig
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.groups.base import GenResult
from unimas.sandbox import runner as sandbox

needs_sandbox = pytest.mark.skipif(not sandbox.available(), reason="the code sandbox (bubblewrap) is not available")
ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4\nassert True"


@pytest.mark.slow
@needs_sandbox
def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail_offline():
    problems = ct.load_humaneval()
    assert len(problems) == 164 and len({p["id"] for p in problems}) == 164

    def check(problem, body):
        return ct.run_tests_sync(problem["prompt"] + body, problem["tests"], problem["entry_point"])

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        right = list(pool.map(lambda p: check(p, p["canonical_solution"]), problems))
        wrong = list(pool.map(lambda p: check(p, "    return None\n"), problems[:8]))
    failing = [(p["task_id"], r) for p, r in zip(problems, right)
               if not (r["status"] == "ok" and r["total"] > 0 and r["passed"] == r["total"])]
    assert not failing, failing[:3]
    assert all(r["passed"] < r["total"] for r in wrong), wrong
    assert time.perf_counter() - started < 60


@needs_sandbox
def test_run_tests_counts_each_assert_and_explains_the_first_failure():
    half = ct.run_tests_sync("def add(a, b):\n    return a + b if a > 0 else 7", ADD_TESTS, "add")
    assert (half["passed"], half["total"], half["status"]) == (2, 3, "ok")  # `assert True` is not a test
    assert half["error"].startswith("assert add(-1, 1) == 0 -> AssertionError")
    broken = ct.run_tests_sync("def add(a, b) return", ADD_TESTS, "add")
    assert (broken["passed"], broken["total"], broken["status"]) == (0, 3, "error")
    assert "SyntaxError" in broken["error"]
    check = ("def check(candidate):\n    assert candidate(1) == 2\n    for x in range(3):\n"
             "        assert candidate(x) == x + 1\n")
    assert ct.run_tests_sync("def inc(x):\n    return x + 1", check, "inc")["passed"] == 2
    missing = ct.run_tests_sync("def other(x):\n    return x", check, "inc")
    assert missing["status"] == "error" and "inc" in missing["error"]


@needs_sandbox
def test_a_hanging_test_times_out_alone_and_a_forged_report_does_not_count():
    slow = "def add(a, b):\n    while a == 1:\n        pass\n    return a + b"
    result = ct.run_tests_sync(slow, ADD_TESTS, "add", case_timeout_s=0.5)
    assert (result["passed"], result["total"], result["status"]) == (2, 3, "ok") and "timed out" in result["error"]
    assert ct.run_tests_sync("while True:\n    pass", ADD_TESTS, "add", timeout_s=1.5)["status"] == "timeout"
    forged = (f"print('{ct.MARK_PREFIX}0 ' + '{{\"event\": \"case\", \"ok\": true}}')\n"
              "import sys\nsys.__stdout__.write('x {\"event\": \"done\"}\\n')\ndef add(a, b):\n    return 10")
    result = ct.run_tests_sync(forged, ADD_TESTS, "add")
    assert (result["passed"], result["total"]) == (0, 3)


def test_without_the_sandbox_the_tool_refuses_and_validation_stops(monkeypatch, tmp_path, capsys, chat_model, repo):
    monkeypatch.setattr(sandbox, "available", lambda: False)
    result = ct.run_tests_sync("def add(a, b):\n    return a + b", ADD_TESTS, "add")
    assert (result["status"], result["passed"]) == ("refused", 0) and "bubblewrap" in result["error"]
    config = EXAMPLES / "code_team_cpu.yaml"
    assert main(["validate", str(config), "--set", f"models.team.options.path={chat_model}",
                 "--set", f"data.params.path={repo / 'examples/data/code_tasks.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "sandbox" in err and "bubblewrap" in err and "Traceback" not in err


class ScriptedTransport:
    """Answers by role (the template's first word): the coder's answers come from a list, in order."""

    def __init__(self, programs):
        self.programs = list(programs)
        self.prompts = []

    async def generate(self, group, requests):
        results = []
        for request in requests:
            self.prompts.append(request.prompt)
            text = f"```python\n{self.programs.pop(0)}\n```" if request.prompt.startswith("code") else "think"
            results.append(GenResult(text=text, prompt_ids=[], response_ids=[1], logprobs=[0.0], finished=True))
        return results


def scripted_episode(programs, max_rounds=3):
    roles = {"planner": RoleConfig(model="m", template="plan {prompt}"),
             "coder": RoleConfig(model="m", template="code {prompt} {plan} {feedback}"),
             "reflector": RoleConfig(model="m", template="reflect {code} {report}")}

    async def workflow(ctx, task):
        return await ct.code_team(ctx, task, max_rounds=max_rounds, timeout_s=5.0)

    transport = ScriptedTransport(programs)
    router = Router(transport, max_batch_size=8, max_wait_s=1.0)
    controller = Controller(workflow, roles, router, {"run_tests": ct.run_tests}, parsers={"coder": code_block()})
    task = {"prompt": "write add(a, b)", "tests": ADD_TESTS, "entry_point": "add"}
    [trajectory] = asyncio.run(controller.run([EpisodeSpec("e0", "t0", task)]))
    assert trajectory.error is None, trajectory.error
    return trajectory, transport


@needs_sandbox
def test_the_team_reflects_until_the_tests_pass_and_the_rewards_follow_the_rounds():
    programs = ["def add(a, b):\n    return 10", "def add(a, b):\n    return a + b if a > 0 else 7",
                "def add(a, b):\n    return a + b", "unused"]
    trajectory, transport = scripted_episode(programs)
    assert [n.id for n in trajectory.nodes()] == [
        "planner#0", "coder#0", "tool:run_tests#0", "reflector#0", "coder#1", "tool:run_tests#1",
        "reflector#1", "coder#2", "tool:run_tests#2"]  # stops when all pass: no reflection after round 3
    assert [(r["passed"], r["total"]) for r in trajectory.outcome["rounds"]] == [(0, 3), (2, 3), (3, 3)]
    assert trajectory.outcome["all_passed"] and transport.programs == ["unused"]
    assert {("coder#0", "tool:run_tests#0"), ("tool:run_tests#0", "reflector#0"), ("reflector#0", "coder#1"),
            ("planner#0", "coder#2")} <= set(trajectory.graph.edges)
    assert "0/3 tests passed" in trajectory.node("reflector#0").input
    assert "assert add(1, 2) == 3" in trajectory.node("reflector#0").input
    assert ct.tests_passed_fraction(trajectory, {}) == 1.0
    assert ct.all_passed_bonus(trajectory, {}) == 1.0
    assert ct.pass_rate_delta(trajectory, {}) == pytest.approx({"coder#0": 0.0, "coder#1": 2 / 3, "coder#2": 1 / 3})


@needs_sandbox
def test_a_first_round_pass_ends_the_episode_and_max_rounds_bounds_it():
    trajectory, _ = scripted_episode(["def add(a, b):\n    return a + b"])
    assert [n.id for n in trajectory.nodes()] == ["planner#0", "coder#0", "tool:run_tests#0"]
    assert ct.pass_rate_delta(trajectory, {}) == {"coder#0": 1.0}
    trajectory, _ = scripted_episode(["def add(a, b):\n    return 3"] * 2, max_rounds=2)
    assert [t.role for t in trajectory.turns()] == ["planner", "coder", "reflector", "coder"]
    assert ct.tests_passed_fraction(trajectory, {}) == pytest.approx(1 / 3)
    assert ct.all_passed_bonus(trajectory, {}) == 0.0


def test_code_tasks_accept_test_lists_and_name_bad_rows(tmp_path):
    good = tmp_path / "tasks.jsonl"
    good.write_text(json.dumps({"prompt": "p", "test": ["assert f() == 1"], "entry_point": "f"}) + "\n\n")
    [task] = ct.code_tasks("train", 0, path=str(good), allow_fallback=True)
    assert task["tests"] == "assert f() == 1" and task["prelude"] == ""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(ct.UserError, match="line 1"):
        ct.code_tasks("train", 0, path=str(bad), allow_fallback=True)
    split = {s: ct.humaneval(s, 0, allow_fallback=True) for s in ("train", "eval")}
    assert (len(split["train"]), len(split["eval"])) == (131, 33)
    assert not {t["id"] for t in split["train"]} & {t["id"] for t in split["eval"]}


@needs_sandbox
@pytest.mark.parametrize("name", ["code_team_cpu.yaml", "code_team_real_model.yaml"])
def test_example_validates_and_trains_two_steps_with_every_role_tool_and_reward(name, chat_model, tmp_path, repo):
    config = EXAMPLES / name
    tree = yaml.safe_load(config.read_text())
    sets = [f"models.team.options.path={chat_model}", "trainer.steps=2", "trainer.tasks_per_step=1",
            "algorithm.group_size=2", "trainer.eval_every=0", "trainer.eval_size=1", "logging.report=false",
            "trainer.sample_trajectories=8", "workflow.params.max_rounds=2"]
    if tree["data"]["name"] == "code_tasks":
        sets.append(f"data.params.path={repo / tree['data']['params']['path']}")
    for role in tree["roles"]:  # a CPU-sized answer; the real-model lengths stay in the file
        sets.append(f"roles.{role}.generation.max_new_tokens=8")
    args = [a for s in sets for a in ("--set", s)]
    assert main(["validate", str(config), *args]) == 0
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run), *args]) == 0
    records = [json.loads(line) for line in (run / "trajectories" / "train.jsonl").read_text().splitlines()]
    assert records and all(r["error"] is None for r in records)
    nodes = {n["id"] for r in records for n in r["nodes"]}
    assert {"planner#0", "coder#0", "tool:run_tests#0", "reflector#0", "coder#1", "tool:run_tests#1"} <= nodes
    levels = {r["name"]: r["level"] for r in tree["rewards"]}
    for record in records:
        for reward, level in levels.items():
            value = record["rewards"][reward]
            coders = {n["id"] for n in record["nodes"] if n.get("role") == "coder"}
            assert isinstance(value, float) if level == "trajectory" else set(value) == coders
        tool_results = [n["result"] for n in record["nodes"] if n["id"].startswith("tool:run_tests")]
        assert all(r["status"] in ("ok", "error", "timeout", "memory") and r["total"] > 0 for r in tool_results)
