"""Generation controls through the gateway, on the real torch group: stop strings, forced tool calls, log-probs,
response_format, refused and ignored fields, and token-exact continuation with tools.

The tool-calling test model (``python -m unimas.testing.tiny_chat DIR --tool-calls``) answers a request with tools by
calling the first listed function and a tool result by repeating it; ``tiny-chat`` answers ``repeat: x`` with x.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError

from tests.conftest import shared_chat_model
from tests.test_gateway import run_episodes
from unimas.gateway.protocol import GatewayError, format_error, parse_chat
from unimas.output.metrics import rollout_metrics
from unimas.trajectory import TurnNode

ROLES = {"agent"}


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                             "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="session")
def tool_model(request, tmp_path_factory):
    """The --tool-calls test model (about 10 s to fit on 2 cores), built once per test run."""
    return shared_chat_model(request.config, tmp_path_factory, name="tiny-chat-tools", tool_calls=True,
                             max_positions=4096)


def agent_team(model_dir, function: str, max_new_tokens: int = 24, rewards: list | None = None) -> dict:
    return {
        "models": {"shared": {"options": {"path": str(model_dir)}}},
        "roles": {"agent": {"model": "shared", "generation": {"max_new_tokens": max_new_tokens,
                                                              "temperature": 1.0, "require_eos": False}}},
        "workflow": {"agent": {"function": function, "timeout_s": 120}},
        "data": {"name": "signalling"},
        "rewards": rewards or [{"name": "exact_match"}],
    }


def refused(body: dict) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_chat({"model": "agent", "messages": [{"role": "user", "content": "hi"}], **body}, ROLES, sampling=False)
    return caught.value


def test_fields_that_cannot_be_honoured_are_refused_naming_the_field():
    for body, field in (({"top_logprobs": 3, "logprobs": True}, "top_logprobs"), ({"presence_penalty": 0.5},
                        "presence_penalty"), ({"frequency_penalty": 1}, "frequency_penalty"),
                        ({"logit_bias": {"12": 5}}, "logit_bias"), ({"n": 2}, "n"), ({"functions": [{}]}, "functions"),
                        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": [""]}, "stop"),
                        ({"response_format": {"type": "xml"}}, "response_format"),
                        ({"tool_choice": "required"}, "tool_choice"), ({"modalities": ["audio"]}, "modalities")):
        error = refused(body)
        assert error.status == 400 and error.param == field, (body, error.message)
        assert field in error.message


def test_neutral_and_ignored_fields_are_accepted_and_reported():
    call = parse_chat({"model": "agent", "messages": [{"role": "user", "content": "hi"}], "seed": 3,
                       "presence_penalty": 0, "logit_bias": {}, "temperature": 0.2, "frobnicate": 1, "stop": "x",
                       "tools": [tool("add")], "tool_choice": "required"}, ROLES, sampling=False)
    assert set(call.ignored) == {"seed", "frobnicate"} and "seed" in call.ignored["seed"]
    assert call.sampling == {"temperature": 0.2}  # honoured or refused per role: tests/test_gateway_in_practice.py
    assert call.stop == ["x"] and call.tool_choice == "required" and call.forced == '<tool_call>\n{"name": "'
    named = parse_chat({"model": "agent", "messages": [{"role": "user", "content": "hi"}], "tools": [tool("add")],
                        "tool_choice": {"type": "function", "function": {"name": "add"}}}, ROLES, sampling=False)
    assert named.forced == '<tool_call>\n{"name": "add", "arguments":'
    assert parse_chat({"model": "agent", "messages": [{"role": "user", "content": "hi"}], "tools": [tool("add")],
                       "tool_choice": "none"}, ROLES, sampling=False).tools is None  # not rendered, not parsed


def test_response_format_misses_are_named():
    assert format_error('{"a": 1}', {"type": "json_object"}) is None
    assert "not JSON" in format_error("k", {"type": "json_object"})
    assert "not an object" in format_error("[1]", {"type": "json_object"})
    schema = {"type": "json_schema", "schema": {"type": "object", "required": ["answer"]}}
    assert "'answer' is a required property" in format_error('{"a": 1}', schema)
    assert format_error('{"answer": 2}', schema) is None and format_error("k", None) is None


async def controls_agent(task: dict, base_url: str) -> dict:
    """Stop strings, log-probs, response_format, a refused and an ignored field, on `repeat: <target>`."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    ask = [{"role": "user", "content": f"repeat: {task['target']}"}]
    plain = await client.chat.completions.create(model="agent", messages=ask, logprobs=True, seed=7,
                                                 response_format={"type": "json_object"})
    stopped = await client.chat.completions.create(model="agent", messages=ask, stop=[task["target"]])
    try:
        await client.chat.completions.create(model="agent", messages=ask, presence_penalty=1.0)
        refusal = None
    except BadRequestError as exc:
        refusal = str(exc)
    return {"answer": task["target"], "plain": plain.model_dump(), "stopped": stopped.model_dump(),
            "refusal": refusal}


def test_stop_logprobs_and_response_format_on_real_turns(chat_model):
    [trajectory], _ = run_episodes(agent_team(chat_model, "tests.test_gateway_controls:controls_agent"),
                                   [{"target": "k", "answer": "k"}], greedy=True)
    assert trajectory.error is None, trajectory.error
    plain_turn, stop_turn = trajectory.turns()  # the refused request recorded no turn
    outcome = trajectory.outcome
    assert "presence_penalty" in outcome["refusal"]
    plain = outcome["plain"]
    assert plain["choices"][0]["message"]["content"] == "k" == plain_turn.text
    content = plain["choices"][0]["logprobs"]["content"]
    assert [c["logprob"] for c in content] == plain_turn.logprobs and len(content) == len(plain_turn.response_ids)
    assert "".join(c["token"] for c in content).startswith("k") and content[0]["bytes"] == list(b"k")
    assert "seed" in plain["unimas"]["ignored"] and "not JSON" in plain["unimas"]["format_error"]
    assert plain_turn.format_error == plain["unimas"]["format_error"]
    # stop: the text excludes it; the trained ids are the sampled prefix up to the token that completed it
    stopped = outcome["stopped"]
    assert stopped["choices"][0]["message"]["content"] == "" and stopped["choices"][0]["finish_reason"] == "stop"
    assert stop_turn.stop == "k" and stop_turn.text == "" and stopped["unimas"]["stop"] == "k"
    assert stop_turn.response_ids == plain_turn.response_ids[: len(stop_turn.response_ids)]
    assert len(stop_turn.response_ids) < len(plain_turn.response_ids) == len(stop_turn.response_ids) + 1
    assert len(stop_turn.logprobs) == len(stop_turn.response_ids)


async def streaming_agent(task: dict, base_url: str) -> dict:
    """The same answer asked for plainly and streamed (chat completions and the Responses API), then streamed
    with a stop string taken from inside it."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    ask = [{"role": "user", "content": task["target"]}]
    plain = await client.chat.completions.create(model="agent", messages=ask)

    async def streamed(**options) -> list:
        chunks = [chunk async for chunk in await client.chat.completions.create(
            model="agent", messages=ask, stream=True, **options)]
        return [chunk.model_dump() for chunk in chunks]

    whole = await streamed()
    text = plain.choices[0].message.content
    # a two-character stop string that first occurs well inside the answer
    stop = next(text[i:i + 2] for i in range(4, len(text) - 1) if text.index(text[i:i + 2]) == i)
    stopped = await streamed(stop=[stop])
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        async with http.stream("POST", "/responses", json={"model": "agent", "input": task["target"],
                                                           "stream": True}) as answer:
            events = [json.loads(line[6:]) async for line in answer.aiter_lines() if line.startswith("data: ")]
    return {"answer": task["target"], "plain": text, "whole": whole, "stop": stop, "stopped": stopped,
            "events": events}


def contents(chunks: list) -> list[str]:
    return [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get(
        "content")]


def check_streamed_episode(trajectory: Any, logprob_tolerance: float = 0.0) -> tuple[Any, ...]:
    """What streaming must hold whatever samples the answers (``streaming_agent``'s greedy episode): the chat
    stream, the stream cut by a stop string and the Responses stream each join to the recorded turn's text, and
    the streamed turn's ids and log-probs are the non-streamed one's (within ``logprob_tolerance``).
    Returns the outcome and the four turns (plain, whole, stopped, responded) for a test's own checks."""
    assert trajectory.error is None, trajectory.error
    outcome = trajectory.outcome
    plain, whole, stopped, responded = trajectory.turns()
    assert len(plain.response_ids) >= 8 and len(plain.text) >= 6, plain.text
    pieces = contents(outcome["whole"])
    assert len(pieces) > 1 and "".join(pieces) == whole.text == plain.text
    assert whole.response_ids == plain.response_ids
    assert whole.logprobs == pytest.approx(plain.logprobs, rel=0, abs=logprob_tolerance)  # greedy: the same turn
    stop, pieces = outcome["stop"], contents(outcome["stopped"])
    assert stopped.stop == stop and "".join(pieces) == stopped.text == plain.text[: plain.text.index(stop)]
    deltas = [e["delta"] for e in outcome["events"] if e["type"] == "response.output_text.delta" and e["delta"]]
    assert len(deltas) > 1 and "".join(deltas) == responded.text
    return outcome, plain, whole, stopped, responded


def test_streamed_answers_arrive_as_they_are_sampled_and_equal_the_recorded_turn():
    """On a tiny random-init model (long answers, no chat template): greedy, so every request of the episode
    samples the same answer, streamed or not."""
    tree = agent_team("unused", "tests.test_gateway_controls:streaming_agent", max_new_tokens=16)
    tree["models"]["shared"]["options"] = {"tiny": {"alphabet": "abcdefgh: ", "hidden_size": 32, "num_layers": 2,
                                                    "num_heads": 4, "max_positions": 128}}
    [trajectory], _ = run_episodes(tree, [{"target": "e: f g", "answer": "x"}], greedy=True)
    outcome, plain, whole, stopped, responded = check_streamed_episode(trajectory)
    assert outcome["plain"] == plain.text
    assert outcome["whole"][0]["choices"][0]["delta"]["role"] == "assistant"
    assert outcome["whole"][-1]["usage"]["completion_tokens"] == len(whole.response_ids)
    [chunk_id] = {c["id"] for c in outcome["whole"]}
    assert chunk_id.startswith("chatcmpl-") and chunk_id.endswith(f":{whole.id}")
    # a stop string is never streamed, not even its first character before it is complete
    stop, pieces = outcome["stop"], contents(outcome["stopped"])
    shown = ["".join(pieces[:n]) for n in range(1, len(pieces))]  # what the client had seen before the end
    assert pieces and not any(text.endswith(stop[0]) or stop in text for text in shown)
    assert outcome["stopped"][-1]["choices"][0]["finish_reason"] == "stop"
    # the Responses API streams its text deltas the same way
    assert responded.text == outcome["events"][-1]["response"]["output_text"]
    assert [e["sequence_number"] for e in outcome["events"]] == list(range(len(outcome["events"])))


class StreamingSession:
    """A stand-in session: its turn reports its text from another thread (as the generating thread does), or is
    refused before sampling."""

    responses = None

    async def chat(self, call, progress=None):
        import asyncio
        import threading

        if call.messages[-1]["content"] == "refuse":
            raise GatewayError(400, "the request's messages cannot be rendered: boom", param="messages",
                               code="invalid_messages")

        def sample():
            for text in ("", "Hel", "Hello", "Hello, wor", "Hello, world"):
                progress("agent#0", text)

        worker = threading.Thread(target=sample)
        worker.start()
        await asyncio.get_running_loop().run_in_executor(None, worker.join)
        return TurnNode(id="agent#0", role="agent", model_group="g", prompt="", text="Hello, world",
                        prompt_ids=[1], response_ids=[5, 6, 7], logprobs=[-1.0] * 3, finished=True)


def test_the_stream_sends_each_update_and_a_refusal_keeps_its_status():
    from fastapi.testclient import TestClient

    from unimas.gateway.app import build_app

    client = TestClient(build_app(lambda key: StreamingSession(), ["agent"], token=None))
    body = {"model": "agent", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with client.stream("POST", "/v1/chat/completions", json=body) as answer:
        chunks = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")]
    assert answer.status_code == 200
    assert contents(chunks) == ["Hel", "lo", ", wor", "ld"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"]["completion_tokens"] == 3
    refused = client.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "refuse"}]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_messages"


async def forced_agent(task: dict, base_url: str) -> dict:
    """tool_choice named and required on the tool model, then a changed tool list (re-rendered, and why)."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    tools = [tool("lookup"), tool("add")]
    ask = [{"role": "user", "content": "repeat: k"}]
    named = await client.chat.completions.create(model="agent", messages=ask, tools=tools, tool_choice={
        "type": "function", "function": {"name": "add"}})
    required = await client.chat.completions.create(model="agent", messages=ask, tools=tools,
                                                    tool_choice="required")
    return {"answer": "k", "named": named.model_dump(), "required": required.model_dump()}


@pytest.mark.slow
def test_tool_choice_forces_a_call_whose_opening_is_never_trained(tool_model):
    [trajectory], _ = run_episodes(agent_team(tool_model, "tests.test_gateway_controls:forced_agent"),
                                   [{"target": "k", "answer": "k"}], greedy=True)
    assert trajectory.error is None, trajectory.error
    named_turn, required_turn = trajectory.turns()
    named = trajectory.outcome["named"]["choices"][0]
    assert named["finish_reason"] == "tool_calls"
    assert named["message"]["tool_calls"][0]["function"]["name"] == "add"
    required = trajectory.outcome["required"]["choices"][0]
    assert required["finish_reason"] == "tool_calls"
    assert required["message"]["tool_calls"][0]["function"]["name"] in ("lookup", "add")
    for turn, opening in ((named_turn, '<tool_call>\n{"name": "add", "arguments":'),
                          (required_turn, '<tool_call>\n{"name": "')):
        assert turn.forced_ids and turn.prompt_ids[-len(turn.forced_ids):] == turn.forced_ids  # prompt side
        assert turn.prompt.endswith(opening) and turn.text.startswith(opening)
        assert len(turn.logprobs) == len(turn.response_ids) and turn.format_error is None
    assert trajectory.outcome["named"]["unimas"]["forced_tokens"] == len(named_turn.forced_ids)


async def tool_round_trip_agent(task: dict, base_url: str) -> dict:
    """A real round trip with the plain openai client: the model calls a tool, the agent runs it and sends the
    result back; then a request with a changed tool list (which cannot continue the ids)."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    tools = [tool("lookup")]
    messages = [{"role": "user", "content": "repeat: q"}]
    first = await client.chat.completions.create(model="agent", messages=messages, tools=tools)
    calls = first.choices[0].message.tool_calls or []
    results = {"lookup": task["target"]}
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    for call in calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.function.name]})
    second = await client.chat.completions.create(model="agent", messages=messages, tools=tools)
    messages.append({"role": "assistant", "content": second.choices[0].message.content})
    messages.append({"role": "user", "content": "repeat: z"})
    third = await client.chat.completions.create(model="agent", messages=messages, tools=[tool("add")])
    return {"answer": second.choices[0].message.content, "calls": [c.function.name for c in calls],
            "third": third.model_dump()}


def test_a_tool_round_trip_continues_the_ids_exactly(tool_model):
    [trajectory], _ = run_episodes(agent_team(tool_model, "tests.test_gateway_controls:tool_round_trip_agent"),
                                   [{"target": "7", "answer": "7"}], greedy=True)
    assert trajectory.error is None, trajectory.error
    first, second, third = trajectory.turns()
    assert trajectory.outcome["calls"] == ["lookup"] and trajectory.outcome["answer"] == "7"
    assert (first.id, second.id) in trajectory.graph.edges  # the result answered the first turn's call
    # tool call and tool result included: the second prompt extends the first turn's ids exactly
    assert second.continued and second.rerendered is None
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == first.prompt_ids + first.response_ids
    assert "<|im_start|>tool\n7<|im_end|>" in second.prompt
    # a changed tool list: rendered afresh, and the turn and the response say why
    assert not third.continued and "tool list" in third.rerendered
    assert "tool list" in trajectory.outcome["third"]["unimas"]["rerendered"]
    metrics = rollout_metrics([trajectory], ["agent"], None)
    assert metrics["role/agent/rerendered_turns"] == 1.0
    assert json.loads(json.dumps(trajectory.to_dict()))["nodes"][2]["rerendered"] == third.rerendered
