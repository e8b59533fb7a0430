"""The Responses API through the gateway: request conversion, previous_response_id, streaming events, and the OpenAI
Agents SDK with its default model (``OpenAIResponsesModel``) through a real tool round trip and 2 training steps."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.test_gateway_controls import agent_team, tool_model  # noqa: F401 - the fixture
from tests.test_gateway import run_episodes
from unimas.cli import main
from unimas.gateway.protocol import GatewayError
from unimas.gateway.responses import ResponseHistory, parse_responses
from unimas.trajectory import read_jsonl

ROLES = {"agent"}
LOOKUP = {"type": "function", "name": "lookup", "description": "looks up", "parameters": {"type": "object"}}


def test_responses_requests_become_chat_calls():
    history = ResponseHistory()
    call = parse_responses({"model": "agent", "instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "repeat: q"}]},
        {"type": "function_call", "call_id": "call-agent#0-0", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call-agent#0-0", "output": "7"}],
        "tools": [LOOKUP], "tool_choice": {"type": "function", "name": "lookup"}, "max_output_tokens": 5,
        "include": ["message.output_text.logprobs"], "store": False}, ROLES, sampling=False, history=history)
    assert call.messages == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "repeat: q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call-agent#0-0", "type": "function", "function": {"name": "lookup", "arguments": {}}}]},
        {"role": "tool", "content": "7", "tool_call_id": "call-agent#0-0"}]
    assert call.tools == [{"type": "function", "function": {"name": "lookup", "description": "looks up",
                                                            "parameters": {"type": "object"}}}]
    assert call.tool_choice == "lookup" and call.forced.startswith("<tool_call>") and call.logprobs
    assert call.overrides == {"max_new_tokens": 5} and "store" in call.ignored
    assert parse_responses({"model": "agent", "input": "hi"}, ROLES, False, history).messages == [
        {"role": "user", "content": "hi"}]
    for body, field in (({"previous_response_id": "resp-nope"}, "previous_response_id"),
                        ({"tools": [{"type": "web_search"}]}, "tools[0]"), ({"input": [{"type": "reasoning"}]},
                                                                             "input[0]"),
                        ({"conversation": "c"}, "conversation"), ({"top_logprobs": 2}, "top_logprobs")):
        with pytest.raises(GatewayError) as refused:
            parse_responses({"model": "agent", "input": "hi", **body}, ROLES, False, history)
        assert refused.value.status == 400 and refused.value.param == field


async def responses_agent(task: dict, base_url: str) -> dict:
    """Raw Responses requests: a tool call, its result through previous_response_id, a streamed answer."""
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        first = (await http.post("/responses", json={"model": "agent", "input": "repeat: q",
                                                     "tools": [LOOKUP]})).json()
        [call] = [item for item in first["output"] if item["type"] == "function_call"]
        second = (await http.post("/responses", json={
            "model": "agent", "previous_response_id": first["id"], "tools": [LOOKUP],
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": task["target"]}]})).json()
        async with http.stream("POST", "/responses", json={"model": "agent", "input": "repeat: z",
                                                           "stream": True}) as streamed:
            events = [json.loads(line[6:]) async for line in streamed.aiter_lines() if line.startswith("data: ")]
    return {"answer": second["output_text"], "first": first, "events": events}


def test_previous_response_id_continues_the_turns_and_streaming_sends_the_events(tool_model):  # noqa: F811
    [trajectory], _ = run_episodes(agent_team(tool_model, "tests.test_gateway_responses:responses_agent"),
                                   [{"target": "7", "answer": "7"}], greedy=True)
    assert trajectory.error is None, trajectory.error
    first, second, _ = trajectory.turns()
    assert trajectory.outcome["answer"] == "7" and trajectory.outcome["first"]["status"] == "completed"
    assert second.continued and (first.id, second.id) in trajectory.graph.edges
    kinds = [event["type"] for event in trajectory.outcome["events"]]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert {"response.output_item.added", "response.output_text.delta", "response.output_text.done",
            "response.output_item.done"} <= set(kinds)
    assert [e["sequence_number"] for e in trajectory.outcome["events"]] == list(range(len(kinds)))


async def sdk_agent(task: dict, base_url: str) -> dict:
    """An OpenAI Agents SDK agent with its default model (the Responses API) and one function tool."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def lookup() -> str:
        """Looks the answer up."""
        return task["target"]

    model = agents.OpenAIResponsesModel(model="agent", openai_client=AsyncOpenAI(base_url=base_url, api_key="x"))
    agent = agents.Agent(name="agent", instructions="repeat: q", tools=[lookup], model=model)
    try:
        result = await agents.Runner.run(agent, "repeat: q", max_turns=3)
    except (agents.ModelBehaviorError, agents.MaxTurnsExceeded) as exc:  # a sampled call of no tool: no answer
        return {"answer": "", "agent_error": str(exc)}
    return {"answer": str(result.final_output).strip()}


def test_an_agents_sdk_agent_runs_a_real_tool_round_trip(tool_model):  # noqa: F811
    pytest.importorskip("agents")
    [trajectory], _ = run_episodes(agent_team(tool_model, "tests.test_gateway_responses:sdk_agent"),
                                   [{"target": "7", "answer": "7"}], greedy=True)
    assert trajectory.error is None, trajectory.error
    first, second = trajectory.turns()
    assert '"name": "lookup"' in first.text  # the model called the tool; the SDK ran it and sent the result
    assert "<|im_start|>tool\n7<|im_end|>" in second.prompt and second.continued
    assert trajectory.outcome["answer"] == "7"


def test_an_agents_sdk_agent_trains_two_steps(tool_model, tmp_path):  # noqa: F811
    pytest.importorskip("agents")
    import yaml

    config = tmp_path / "sdk.yaml"
    config.write_text(yaml.safe_dump(agent_team(tool_model, "tests.test_gateway_responses:sdk_agent")))
    run = tmp_path / "run"
    settings = ["trainer.steps=2", "trainer.tasks_per_step=1", "algorithm.group_size=2", "trainer.eval_every=0",
                "trainer.eval_size=1", "logging.console=false", "logging.report=false"]
    assert main(["train", str(config), "--run-dir", str(run), *[a for s in settings for a in ("--set", s)]]) == 0
    trajectories = read_jsonl(run / "trajectories/train.jsonl")
    assert len(trajectories) == 4 and not any(t.failed for t in trajectories)
    assert all(t.turns() and t.turns()[0].response_ids for t in trajectories)
    assert len((run / "metrics.jsonl").read_text().splitlines()) >= 2
