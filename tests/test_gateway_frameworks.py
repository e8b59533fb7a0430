"""Agent frameworks through the gateway: smolagents' CodeAgent (always sends ``stop``) and ToolCallingAgent (always
sends ``tool_choice: required``), each training 2 steps on the tool-calling test model; and the example programs
for LangGraph, litellm and AutoGen (examples/gateway/), each run as the `command` of tool_agent.yaml for 2 steps.
A framework that is not installed skips its test (``pip install 'unimas[frameworks]'``; AutoGen needs an
environment of its own, named by ``$UNIMAS_AUTOGEN_PYTHON``: see docs/gateway.md).

CodeAgent runs the code the model writes: smolagents' own restricted interpreter (LocalPythonExecutor, no
imports authorised here) is what would run it; the tiny model's answers are not code blocks it can parse, and
unimas itself never executes model output.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_gateway_controls import agent_team, tool_model  # noqa: F401 - the fixture
from unimas.cli import main
from unimas.trajectory import read_jsonl


def _smol_agent(kind: str, task: dict, base_url: str) -> dict:
    smolagents = pytest.importorskip("smolagents")

    @smolagents.tool
    def lookup(query: str) -> str:
        """Looks the answer up.

        Args:
            query: what to look up.
        """
        return task["target"]

    model = smolagents.OpenAIServerModel(model_id="agent", api_base=base_url, api_key="unused")
    if kind == "code":
        agent = smolagents.CodeAgent(tools=[lookup], model=model, max_steps=2, additional_authorized_imports=[],
                                     verbosity_level=0)
    else:
        agent = smolagents.ToolCallingAgent(tools=[lookup], model=model, max_steps=2, verbosity_level=0)
    return {"answer": str(agent.run(f"repeat: {task['target']}"))}


async def smol_code_agent(task: dict, base_url: str) -> dict:
    return await asyncio.to_thread(_smol_agent, "code", task, base_url)


async def smol_tool_calling_agent(task: dict, base_url: str) -> dict:
    return await asyncio.to_thread(_smol_agent, "tools", task, base_url)


def train_two_steps(model_dir, function: str, tmp_path) -> list:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(agent_team(model_dir, function)))
    run = tmp_path / "run"
    settings = ["trainer.steps=2", "trainer.tasks_per_step=1", "algorithm.group_size=2", "trainer.eval_every=0",
                "trainer.eval_size=1", "logging.console=false", "logging.report=false"]
    assert main(["train", str(config), "--run-dir", str(run), *[a for s in settings for a in ("--set", s)]]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) >= 2
    trajectories = read_jsonl(run / "trajectories/train.jsonl")
    assert len(trajectories) == 4 and not any(t.failed for t in trajectories), [t.error for t in trajectories]
    return trajectories


@pytest.mark.slow
def test_smolagents_code_agent_trains_two_steps(tool_model, tmp_path):  # noqa: F811
    pytest.importorskip("smolagents")
    trajectories = train_two_steps(tool_model, "tests.test_gateway_frameworks:smol_code_agent", tmp_path)
    turns = [turn for t in trajectories for turn in t.turns()]
    assert turns and all(turn.response_ids and len(turn.logprobs) == len(turn.response_ids) for turn in turns)
    assert all(turn.reward is not None for turn in turns)


@pytest.mark.slow
def test_smolagents_tool_calling_agent_trains_two_steps(tool_model, tmp_path):  # noqa: F811
    pytest.importorskip("smolagents")
    trajectories = train_two_steps(tool_model, "tests.test_gateway_frameworks:smol_tool_calling_agent", tmp_path)
    turns = [turn for t in trajectories for turn in t.turns()]
    with_tools = [turn for turn in turns if turn.tools]
    assert with_tools and all(turn.forced_ids and turn.text.startswith("<tool_call>") for turn in with_tools)
    assert all(turn.prompt_ids[-len(turn.forced_ids):] == turn.forced_ids for turn in with_tools)  # never trained


# -- the example programs of docs/gateway.md, "Frameworks", run as `command` agents of tool_agent.yaml ----------

REPO = Path(__file__).resolve().parents[1]


def python_with(module: str, override: str) -> str:
    """An interpreter that imports ``module``: ``$override`` (a separate environment) or this one; else skip.

    This interpreter is asked with ``find_spec`` (litellm's import alone costs seconds of CPU, and the example
    program imports it again for every episode); another one only answers by importing it."""
    python = os.environ.get(override)
    if python:
        found = subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0
    else:
        python = sys.executable
        parent = module.partition(".")[0]  # find_spec of a submodule imports its (light) parent package
        found = importlib.util.find_spec(parent) is not None and importlib.util.find_spec(module) is not None
    if not found:
        pytest.skip(f"{module} is not installed here (LangGraph and litellm: pip install 'unimas[frameworks]'; "
                    f"AutoGen needs its own environment, see docs/gateway.md) and ${override} names no Python "
                    "that has it")
    return python


def python_and_model(request, module: str, override: str) -> tuple[str, Path]:
    """:func:`python_with`, then the tool model: it is built only where the framework is there (else: skip)."""
    python = python_with(module, override)
    return python, request.getfixturevalue("tool_model")


def train_example(model_dir, example: str, python: str, tmp_path) -> list:
    """2 training steps of examples/gateway/tool_agent.yaml with its command swapped for ``example``."""
    text = (REPO / "examples/gateway/tool_agent.yaml").read_text()
    text = text.replace("options: {path: ../models/tiny-chat-tools}", f"options: {{path: {model_dir}}}")
    text = text.replace("command: [python, examples/gateway/openai_tools.py]",
                        f"command: [{python}, {REPO / 'examples/gateway' / example}]")
    assert example in text
    config = tmp_path / "agent.yaml"
    config.write_text(text)
    run = tmp_path / "run"
    settings = ["trainer.steps=2", "logging.console=false", "logging.report=false"]
    assert main(["train", str(config), "--run-dir", str(run), *[a for s in settings for a in ("--set", s)]]) == 0
    trajectories = read_jsonl(run / "trajectories/train.jsonl")
    assert len(trajectories) == 4 and not any(t.failed for t in trajectories), [t.error for t in trajectories]
    turns = [turn for t in trajectories for turn in t.turns()]
    assert turns and all(turn.response_ids and len(turn.logprobs) == len(turn.response_ids) for turn in turns)
    return trajectories


@pytest.mark.slow
def test_a_langgraph_react_agent_trains_two_steps(request, tmp_path):
    python, tool_model = python_and_model(request, "langgraph.prebuilt", "UNIMAS_LANGGRAPH_PYTHON")
    trajectories = train_example(tool_model, "langgraph_agent.py", python, tmp_path)
    for trajectory in trajectories:  # ChatOpenAI sends the tool; the graph runs the call and sends the result back
        turns = trajectory.turns()
        assert turns[0].tools and turns[0].tools[0]["function"]["name"] == "lookup"
        if '"name": "lookup"' in turns[0].text:
            assert len(turns) == 2 and turns[1].continued and (turns[0].id, turns[1].id) in trajectory.graph.edges


@pytest.mark.slow
def test_litellm_completion_trains_two_steps(request, tmp_path):
    python, tool_model = python_and_model(request, "litellm", "UNIMAS_LITELLM_PYTHON")
    trajectories = train_example(tool_model, "litellm_agent.py", python, tmp_path)
    assert all([turn.role for turn in t.turns()] == ["agent"] for t in trajectories)
    assert all(t.outcome["answer"] == t.turns()[0].text.strip() for t in trajectories)


def test_an_autogen_assistant_agent_trains_two_steps(request, tmp_path):
    python, tool_model = python_and_model(request, "autogen_agentchat", "UNIMAS_AUTOGEN_PYTHON")
    trajectories = train_example(tool_model, "autogen_agent.py", python, tmp_path)
    for trajectory in trajectories:  # a call, then the reflection on its result (sent without the tools)
        turns = trajectory.turns()
        assert turns[0].tools and turns[0].tools[0]["function"]["name"] == "lookup"
        if len(turns) == 2:
            assert (turns[0].id, turns[1].id) in trajectory.graph.edges and not turns[1].tools
            assert turns[1].rerendered == "the tool list differs from the role's previous turn"
