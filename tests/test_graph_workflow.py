"""Declarative graph workflows: runner semantics, trajectories, static checker."""

import asyncio
import builtins
import copy
import sys

import networkx as nx
import pytest
from unimas_plugins.parsers import regex

from unimas.config.schema import GraphConfig, RoleConfig
from unimas.controller.context import EpisodeContext, node_value
from unimas.errors import UserError
from unimas.groups.base import GenResult
from unimas.trajectory import GraphTrajectory
from unimas.workflow.graph import check_graph, make_graph_workflow
from unimas.workflow.safe_expr import ExpressionError

ROLES = {
    "solver": RoleConfig(model="m", template="Q:{question} T:{attempt} F:{feedback}"),
    "verifier": RoleConfig(model="m", template="A:{answer} G:{good}", parser=r"VERDICT:(\w+)"),
}


def script(prompt: str) -> str:
    """The fake model: solver guesses by attempt number, verifier compares with the task's answer."""
    if prompt.startswith("Q:"):
        return "guess" + prompt.split("T:")[1].split(" ")[0]
    answer, good = prompt[2:].split(" G:")
    if good == "garble":
        return "???"
    return "VERDICT:ok" if answer == good else "VERDICT:bad"


class FakeRouter:
    """Stands in for the router: answers each request from ``script``."""

    def __init__(self):
        self.prompts = []

    async def submit(self, group, request, episode=""):
        self.prompts.append(request.prompt)
        text = script(request.prompt)
        return GenResult(text=text, prompt_ids=[1, 2], response_ids=[3, 4], logprobs=[-0.5, -0.5], finished=True)


def grade(answer, target):
    if target == "boom":
        raise RuntimeError("grader crashed")
    return answer == target


LOOP = {
    "start": "solve",
    "nodes": {
        "solve": {"kind": "llm", "role": "solver", "max_visits": 3,
                  "inputs": {"attempt": "visits['solve']", "feedback": "check if check is not None else 'none'"}},
        "check": {"kind": "llm", "role": "verifier", "max_visits": 3, "inputs": {"answer": "solve"}},
    },
    "edges": [
        {"from": "solve", "to": "check"},
        {"from": "check", "to": "solve", "when": "failed['check'] or check != 'ok'"},
    ],
    "outcome": {"answer": "solve", "correct": "check == 'ok'"},
}


def graph(tree=LOOP, **changes):
    tree = copy.deepcopy(tree)
    tree.update(changes)
    return GraphConfig.model_validate(tree)


def run(workflow, task, tools=None):
    traj = GraphTrajectory(episode_id="e0", task_id="t0", task=task)
    parsers = {name: regex(**role.parser.params) for name, role in ROLES.items() if role.parser}
    ctx = EpisodeContext(traj, ROLES, FakeRouter(), tools or {"grade": grade}, parsers=parsers)
    traj.outcome = asyncio.run(workflow(ctx, task))
    return traj


def shape(traj):
    return [(n.id, getattr(n, "role", None), n.prompt if n.kind == "turn" else n.arguments) for n in traj.nodes()]


def test_loop_stops_when_verifier_accepts():
    traj = run(make_graph_workflow(graph()), {"question": "2+2", "good": "guess1"})
    assert [n.id for n in traj.nodes()] == ["solver#0", "verifier#0", "solver#1", "verifier#1"]
    assert traj.outcome == {"answer": "guess1", "correct": True, "last": "ok"}


def test_loop_stops_at_max_visits():
    traj = run(make_graph_workflow(graph()), {"question": "2+2", "good": "nope"})
    ids = [n.id for n in traj.nodes()]
    assert ids == ["solver#0", "verifier#0", "solver#1", "verifier#1", "solver#2", "verifier#2"]
    assert set(traj.graph.edges) == {
        ("solver#0", "verifier#0"), ("verifier#0", "solver#1"), ("solver#1", "verifier#1"),
        ("verifier#1", "solver#2"), ("solver#2", "verifier#2"),
    }
    assert nx.is_directed_acyclic_graph(traj.graph)
    assert traj.node("solver#1").prompt == "Q:2+2 T:1 F:bad"
    assert traj.outcome == {"answer": "guess2", "correct": False, "last": "bad"}


def test_parse_failure_sets_failed_and_loops_on_raw_text():
    traj = run(make_graph_workflow(graph()), {"question": "q", "good": "garble"})
    assert len(traj.turns("verifier")) == 3
    assert all(t.parse_error for t in traj.turns("verifier"))
    assert traj.node("solver#1").prompt.endswith("F:???")
    assert traj.outcome["last"] == "???"


def test_trajectory_json_round_trip():
    traj = run(make_graph_workflow(graph()), {"question": "2+2", "good": "nope"})
    again = GraphTrajectory.from_json(traj.to_json())
    assert again.to_dict() == traj.to_dict()


def test_same_trajectory_as_python_workflow():
    async def python_workflow(ctx, task):
        check = None
        for attempt in range(3):
            solve = await ctx.act("solver", after=[check] if check else [], attempt=attempt,
                                  feedback=node_value(check) if check else "none")
            check = await ctx.act("verifier", answer=solve)
            if check.parse_error is None and check.parsed == "ok":
                break
        return {}

    for good in ("guess1", "nope", "garble"):
        task = {"question": "2+2", "good": good}
        from_graph = run(make_graph_workflow(graph()), task)
        from_python = run(python_workflow, task)
        assert shape(from_graph) == shape(from_python)
        assert set(from_graph.graph.edges) == set(from_python.graph.edges)


def test_tool_node_and_tool_error():
    tree = {
        "start": "solve",
        "nodes": {
            "solve": {"kind": "llm", "role": "solver", "max_visits": 2,
                      "inputs": {"attempt": "visits['solve']", "feedback": "'none' if grade is None else str(grade)"}},
            "grade": {"kind": "tool", "tool": "grade", "max_visits": 2,
                      "inputs": {"answer": "solve", "target": "task['good']"}},
        },
        "edges": [{"from": "solve", "to": "grade"}, {"from": "grade", "to": "solve", "when": "not grade"}],
        "outcome": {"solved": "grade is True", "crashed": "failed['grade']"},
    }
    traj = run(make_graph_workflow(graph(tree)), {"question": "q", "good": "guess1"})
    assert [n.id for n in traj.nodes()] == ["solver#0", "tool:grade#0", "solver#1", "tool:grade#1"]
    assert ("tool:grade#0", "solver#1") in traj.graph.edges
    assert traj.node("tool:grade#0").arguments == {"answer": "guess0", "target": "guess1"}
    assert traj.outcome == {"solved": True, "crashed": False, "last": True}

    traj = run(make_graph_workflow(graph(tree)), {"question": "q", "good": "boom"})
    assert traj.node("tool:grade#0").error == "RuntimeError: grader crashed"
    assert len(traj.tool_calls()) == 2  # a tool error is data: the loop goes on
    assert traj.outcome == {"solved": False, "crashed": True, "last": None}


def test_max_steps_caps_execution():
    traj = run(make_graph_workflow(graph(max_steps=3)), {"question": "q", "good": "nope"})
    assert len(list(traj.nodes())) == 3
    assert traj.outcome["_max_steps_reached"] is True


def test_failing_condition_is_false_and_recorded():
    tree = copy.deepcopy(LOOP)
    tree["edges"][1]["when"] = "int(check) > 0"
    traj = run(make_graph_workflow(graph(tree)), {"question": "q", "good": "nope"})
    assert len(list(traj.nodes())) == 2
    [message] = traj.outcome["_condition_errors"]
    assert message.startswith("workflow.graph.edges[1].when:") and "int()" in message


def test_failing_outcome_gives_none():
    traj = run(make_graph_workflow(graph(outcome={"n": "int(solve)"})), {"question": "q", "good": "guess0"})
    assert traj.outcome["n"] is None and "n" in traj.outcome["_outcome_errors"]


def test_failing_input_fails_the_episode():
    tree = copy.deepcopy(LOOP)
    tree["nodes"]["solve"]["inputs"]["attempt"] = "int(task['question'])"
    with pytest.raises(ExpressionError, match=r"nodes\.solve\.inputs\.attempt"):
        run(make_graph_workflow(graph(tree)), {"question": "q", "good": "x"})


def _guard(original):
    """Wrap eval/exec: fail if unimas code calls it (networkx legitimately uses exec)."""
    def guarded(*args, **kwargs):
        caller = sys._getframe(1).f_code.co_filename
        if "unimas" in caller and "site-packages" not in caller:
            pytest.fail(f"eval/exec called from {caller}")
        return original(*args, **kwargs)
    return guarded


def test_conditions_never_reach_eval(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in ("eval", "exec"):
        monkeypatch.setattr(builtins, name, _guard(getattr(builtins, name)))
    traj = run(make_graph_workflow(graph()), {"question": "q", "good": "nope"})
    assert len(list(traj.nodes())) == 6

    tree = copy.deepcopy(LOOP)
    tree["edges"][1]["when"] = "__import__('os').system('touch pwned')"
    errors = check_graph(graph(tree), ROLES, set(), None)
    assert [path for path, _ in errors] == ["workflow.graph.edges[1].when"]
    with pytest.raises(UserError, match=r"edges\[1\]\.when"):
        make_graph_workflow(graph(tree))
    assert list(tmp_path.iterdir()) == []


def test_checker_accepts_good_graph():
    assert check_graph(graph(), ROLES, {"grade"}, {"question", "good"}) == []


def errors_of(tree, task_keys=None, tools=("grade",)):
    """Checker output as path -> messages joined by ' | ' (a path may have several)."""
    errors = {}
    for path, message in check_graph(GraphConfig.model_validate(tree), ROLES, set(tools), task_keys):
        errors[path] = f"{errors[path]} | {message}" if path in errors else message
    return errors


def test_checker_reports_each_error_with_its_path():
    tree = copy.deepcopy(LOOP)
    tree["start"] = "solv"
    tree["edges"].append({"from": "check", "to": "verfy"})
    errors = errors_of(tree)
    assert errors["workflow.graph.start"] == "unknown node 'solv'; nodes are: solve, check"
    assert errors["workflow.graph.edges[2].to"] == "unknown node 'verfy'; nodes are: solve, check"

    tree = copy.deepcopy(LOOP)
    tree["nodes"]["solve"]["role"] = "solvr"
    tree["nodes"]["check"] = {"kind": "llm", "max_visits": 3, "inputs": {"answer": "solve"}}
    tree["nodes"]["judge"] = {"kind": "tool", "tool": "grader"}
    tree["nodes"]["task"] = {"kind": "tool", "tool": "grade", "inputs": {"name": "1"}}
    errors = errors_of(tree)
    assert "unknown role 'solvr'" in errors["workflow.graph.nodes.solve.role"]
    assert "needs 'role:'" in errors["workflow.graph.nodes.check.role"]
    assert errors["workflow.graph.nodes.judge.tool"] == "unknown tool 'grader'; known: grade"
    assert "reserved" in errors["workflow.graph.nodes.task"]
    assert "clashes" in errors["workflow.graph.nodes.task.inputs.name"]
    assert "cannot be reached" in errors["workflow.graph.nodes.judge"]


def test_checker_expressions():
    tree = copy.deepcopy(LOOP)
    tree["edges"][1]["when"] = "faild['check']"
    tree["nodes"]["check"]["inputs"]["answer"] = "solve.upper()"
    tree["outcome"]["bad"] = "len(solve"
    errors = errors_of(tree)
    assert "unknown name 'faild'" in errors["workflow.graph.edges[1].when"]
    assert "method calls" in errors["workflow.graph.nodes.check.inputs.answer"]
    assert "not a valid expression" in errors["workflow.graph.outcome.bad"]


def test_checker_template_fields_against_task_keys():
    tree = copy.deepcopy(LOOP)
    del tree["nodes"]["solve"]["inputs"]["feedback"]
    assert errors_of(tree, task_keys=None) == {}
    errors = errors_of(tree, task_keys={"question", "good"})
    assert list(errors) == ["workflow.graph.nodes.solve.inputs"]
    assert "{feedback}" in errors["workflow.graph.nodes.solve.inputs"]
    assert "add 'feedback: <expression>'" in errors["workflow.graph.nodes.solve.inputs"]


def test_checker_cycles_and_ending():
    tree = copy.deepcopy(LOOP)
    tree["nodes"]["solve"]["max_visits"] = 1
    tree["nodes"]["check"]["max_visits"] = 1
    errors = errors_of(tree)
    assert list(errors) == ["workflow.graph.nodes.solve.max_visits"]
    assert "solve, check form a cycle" in errors["workflow.graph.nodes.solve.max_visits"]

    tree = copy.deepcopy(LOOP)
    del tree["edges"][1]["when"]
    errors = errors_of(tree)
    assert list(errors) == ["workflow.graph.edges"]
    assert "no reachable node can end the episode" in errors["workflow.graph.edges"]

    tree = copy.deepcopy(LOOP)
    tree["edges"].append({"from": "check", "to": "check"})  # self-loop on a max_visits=1 node
    tree["nodes"]["check"]["max_visits"] = 1
    assert "check form a cycle" not in str(errors_of(tree))  # the solve/check SCC has solve.max_visits=3
    tree["nodes"]["solve"]["max_visits"] = 1
    assert "workflow.graph.nodes.solve.max_visits" in errors_of(tree)
