"""The gateway as real agent frameworks use it (issue 43): episodes that never reach the model, edited history,
Responses cut off at the role's limit, fields the gateway ignores or refuses, Agent Lightning's API key, malformed
tools, and ``unimas serve``'s memory across batches of concurrent requests.

Each agent here plays what a framework does: DSPy answering from its cache, a client that rewrites its previous
answer, the OpenAI Agents SDK with its default settings, LlamaIndex sending ``temperature``, Agent Lightning's runner
sending the key of its own ``LLM`` resource.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from openai import AsyncOpenAI

from tests.test_gateway import run_episodes, team
from tests.test_gateway_controls import agent_team, tool, tool_model  # noqa: F401 - the fixture
from unimas.cli import main
from unimas.gateway import responses
from unimas.gateway.app import build_app
from unimas.gateway.protocol import GatewayError, completion, parse_chat
from unimas.gateway.responses import parse_responses
from unimas.gateway.sessions import Serving, check_answer, edited_answer
from unimas.trajectory import TurnNode

HI = [{"role": "user", "content": "hi"}]
TRAIN = ["trainer.steps=1", "trainer.tasks_per_step=2", "algorithm.group_size=2", "trainer.eval_every=0",
         "trainer.eval_size=1", "logging.console=false", "logging.report=false"]


def settings(*extra: str) -> list[str]:
    return [a for s in [*TRAIN, *extra] for a in ("--set", s)]


# -- 1. episodes that made no model turn ------------------------------------------------------------------------

async def cached_agent(task: dict, base_url: str) -> dict:
    """DSPy with its default cache: the answer comes from the client's cache, the gateway never hears of it."""
    return {"answer": task["answer"]}


def test_episodes_without_a_model_turn_are_counted_warned_about_once_and_fail_the_step(chat_model, tmp_path,
                                                                                       capfd):
    config = tmp_path / "cached.yaml"
    config.write_text(yaml.safe_dump(team(chat_model, {"agent": {
        "function": "tests.test_gateway_in_practice:cached_agent"}})))
    capfd.readouterr()
    assert main(["train", str(config), "--run-dir", str(tmp_path / "strict"), *settings()]) == 1
    err = capfd.readouterr().err
    assert "trainer.no_turn_budget" in err and "4/4" in err, err
    assert err.count("made no model request") == 1 and "cache" in err  # once, with the likely cause

    allowed = tmp_path / "allowed"
    assert main(["train", str(config), "--run-dir", str(allowed), *settings("trainer.no_turn_budget=1")]) == 0
    [record] = [json.loads(line) for line in (allowed / "metrics.jsonl").read_text().splitlines()
                if '"reward/mean"' in line]
    assert record["episode/no_turns"] == 4 and record["episode/over_budget"] == 0
    assert capfd.readouterr().err.count("made no model request") == 1

    assert main(["validate", str(config), "--set", "trainer.no_turn_budget=2"]) == 2
    assert "trainer.no_turn_budget" in capfd.readouterr().err


# -- 2. an edited previous answer ---------------------------------------------------------------------------------

def answered(text: str, tools: list | None = None) -> TurnNode:
    return TurnNode(id="agent#0", role="agent", model_group="g", prompt="", text=text, messages=HI,
                    prompt_ids=[1], response_ids=[5], logprobs=[-1.0], tools=tools)


def test_the_answer_sent_back_is_compared_with_the_sampled_one_as_the_template_renders_it():
    plain = answered("Paris.  ")
    assert edited_answer(plain, {"role": "assistant", "content": "Paris."}) is None  # the client stripped it
    assert "text" in edited_answer(plain, {"role": "assistant", "content": "Lyon."})
    call = answered('<tool_call>\n{"name": "lookup", "arguments": {"q": "a", "n": 1}}\n</tool_call>',
                    tools=[tool("lookup")])
    sent = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "lookup", "arguments": {"n": 1, "q": "a"}}}]}
    assert edited_answer(call, sent) is None  # re-encoded (key order, spacing, call id): the same call
    changed = {**sent, "tool_calls": [{**sent["tool_calls"][0], "function": {"name": "lookup",
                                                                             "arguments": {"n": 2, "q": "a"}}}]}
    assert "tool calls" in edited_answer(call, changed)
    assert "tool calls" in edited_answer(call, {"role": "assistant", "content": "no call"})


async def editing_agent(task: dict, base_url: str) -> dict:
    """Rewrites its previous answer, then sends the next answer back as it was given."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    first = [{"role": "user", "content": "repeat: a"}]
    answer = (await client.chat.completions.create(model="speaker", messages=first)).choices[0].message.content
    edited = [*first, {"role": "assistant", "content": answer + " (edited)"}, {"role": "user", "content": "repeat: b"}]
    second = (await client.chat.completions.create(model="speaker", messages=edited))
    kept = [*edited, {"role": "assistant", "content": second.choices[0].message.content},
            {"role": "user", "content": "repeat: c"}]
    third = await client.chat.completions.create(model="speaker", messages=kept)
    return {"answer": "", "notes": [second.model_extra["unimas"], third.model_extra["unimas"]]}


def test_an_edited_previous_answer_is_rendered_afresh_and_says_why(chat_model):
    [trajectory], _ = run_episodes(team(chat_model, {"agent": {
        "function": "tests.test_gateway_in_practice:editing_agent"}}), [{"target": "a", "answer": "a"}])
    assert trajectory.error is None, trajectory.error
    _, second, third = trajectory.turns()
    assert not second.continued and "differs from what speaker#0 sampled" in second.rerendered
    assert "rerendered" in trajectory.outcome["notes"][0]
    assert third.continued and third.rerendered is None  # the answer sent back unchanged is extended exactly
    assert third.prompt_ids[:len(second.prompt_ids) + len(second.response_ids)] == \
        second.prompt_ids + second.response_ids


async def reencoding_agent(task: dict, base_url: str) -> dict:
    """ADK through LiteLLM: sends the model's tool call back re-encoded (its arguments as indented JSON); then the
    same round trip with the call's arguments changed."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    tools = [tool("lookup")]
    notes = []
    for change in (False, True):
        messages = [{"role": "user", "content": f"repeat: {task['target']}"}]
        first = (await client.chat.completions.create(model="agent", messages=messages, tools=tools)).choices[0]
        sent = []
        for call in first.message.tool_calls or []:
            arguments = {**json.loads(call.function.arguments or "{}"), **({"q": "changed"} if change else {})}
            sent.append({"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": json.dumps(arguments, indent=2)}})
        messages.append({"role": "assistant", "content": first.message.content, "tool_calls": sent})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": task["target"]} for c in sent]
        second = await client.chat.completions.create(model="agent", messages=messages, tools=tools)
        notes.append(second.model_extra["unimas"])
    return {"answer": "", "notes": notes}


def test_a_re_encoded_tool_call_continues_and_a_changed_one_is_rendered_afresh(tool_model):  # noqa: F811
    [trajectory], _ = run_episodes(agent_team(tool_model, "tests.test_gateway_in_practice:reencoding_agent"),
                                   [{"target": "7", "answer": "7"}], greedy=True)
    assert trajectory.error is None, trajectory.error
    first, kept, _, changed = trajectory.turns()
    assert '"name": "lookup"' in first.text  # the model called the tool
    assert kept.continued and kept.rerendered is None
    assert kept.prompt_ids[:len(first.prompt_ids) + len(first.response_ids)] == first.prompt_ids + first.response_ids
    assert not changed.continued and "(its tool calls)" in changed.rerendered
    assert "rerendered" not in trajectory.outcome["notes"][0] and "rerendered" in trajectory.outcome["notes"][1]


# -- 3. the Responses API at the role's token limit ------------------------------------------------------------

async def sdk_plain_agent(task: dict, base_url: str) -> dict:
    """An OpenAI Agents SDK agent with default model settings (no max_tokens) whose role may say 1 token."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    model = agents.OpenAIResponsesModel(model="agent", openai_client=AsyncOpenAI(base_url=base_url, api_key="x"))
    result = await agents.Runner.run(agents.Agent(name="agent", instructions="be brief", model=model),
                                     f"repeat: {' '.join([task['target']] * 6)}", max_turns=2)
    async with httpx.AsyncClient(base_url=base_url) as http:
        limited = (await http.post("/responses", json={"model": "agent", "input": "repeat: a a a",
                                                       "max_output_tokens": 1})).json()
    return {"answer": str(result.final_output), "limited": limited}


def test_a_response_cut_at_the_roles_limit_completes_when_the_client_set_none(chat_model):
    pytest.importorskip("agents")
    [trajectory], _ = run_episodes(agent_team(chat_model, "tests.test_gateway_in_practice:sdk_plain_agent",
                                              max_new_tokens=1), [{"target": "b", "answer": "b"}], greedy=True)
    assert trajectory.error is None, trajectory.error  # the SDK raised ModelBehaviorError on `incomplete`
    first = trajectory.turns()[0]
    assert not first.finished and len(first.response_ids) == 1  # the truncation is recorded on the turn
    limited = trajectory.outcome["limited"]  # the client's own limit: incomplete, as the API specifies
    assert limited["status"] == "incomplete" and limited["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_response_says_when_the_roles_limit_cut_it():
    call = parse_responses({"model": "agent", "input": "hi"}, {"agent"}, False, responses.ResponseHistory())
    turn = answered("a b")
    turn.finished = False
    body = responses.response_object(turn, call, "resp-1", responses.ResponseHistory(), {"input": "hi"})
    assert body["status"] == "completed" and body["unimas"]["cut_off"].startswith("the role's")


# -- 4. ignored fields, temperature, parallel_tool_calls -------------------------------------------------------

def test_temperature_is_honoured_for_frozen_roles_and_refused_by_name_when_it_differs_for_trained_ones():
    call = parse_chat({"model": "agent", "messages": HI, "temperature": 0.2, "top_p": 0.5}, {"agent"}, False)
    assert "temperature" not in call.ignored and call.sampling == {"temperature": 0.2, "top_p": 0.5}
    from unimas.config.schema import RoleConfig
    from unimas.gateway.sessions import sampling_overrides

    trained = RoleConfig(model="g", generation={"temperature": 1.0})
    with pytest.raises(GatewayError) as refused:
        sampling_overrides(call, "agent", trained)
    assert refused.value.status == 400 and refused.value.param == "temperature"
    assert "roles.agent.trainable" in refused.value.message
    same = parse_chat({"model": "agent", "messages": HI, "temperature": 1}, {"agent"}, False)
    assert sampling_overrides(same, "agent", trained) == {}
    frozen = RoleConfig(model="g", trainable=False)
    assert sampling_overrides(call, "agent", frozen) == {"temperature": 0.2, "top_p": 0.5}


def test_parallel_tool_calls_false_returns_the_first_call_and_records_the_rest_as_a_format_error():
    two = answered('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call><tool_call>\n'
                   '{"name": "b", "arguments": {}}\n</tool_call>', tools=[tool("a"), tool("b")])
    call = parse_chat({"model": "agent", "messages": HI, "tools": [tool("a"), tool("b")],
                       "parallel_tool_calls": False}, {"agent"}, False)
    assert "parallel_tool_calls" not in call.ignored
    check_answer(two, call)
    message = completion(two, "c", tools=True, call=call)["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["a"]
    assert "parallel_tool_calls" in two.format_error
    both = parse_chat({"model": "agent", "messages": HI, "tools": [tool("a")], "parallel_tool_calls": True},
                      {"agent"}, False)
    assert len(completion(two, "c", tools=True, call=both)["choices"][0]["message"]["tool_calls"]) == 2


async def llamaindex_like_agent(task: dict, base_url: str) -> dict:
    """Fields a framework sends on every request and the gateway cannot apply."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    for _ in range(2):
        await client.chat.completions.create(model="speaker", messages=[{"role": "user", "content": "repeat: a"}],
                                             seed=3, user="me", extra_body={"frobnicate": 1, "odd field": 2})
    return {"answer": "a"}


def test_ignored_fields_are_counted_per_role_and_printed_once_per_run(chat_model, capfd):
    capfd.readouterr()
    trajectories, _ = run_episodes(team(chat_model, {"agent": {
        "function": "tests.test_gateway_in_practice:llamaindex_like_agent"}}), [{"answer": "a"}] * 3)
    for trajectory in trajectories:
        assert trajectory.error is None, trajectory.error
        assert trajectory.metrics["gateway.ignored.speaker.seed"] == [2.0]
        assert trajectory.metrics["gateway.ignored.speaker.unknown_fields"] == [4.0]  # bounded: one name for all
    err = capfd.readouterr().err
    assert err.count("'seed'") == 1 and err.count("'user'") == 1 and "speaker" in err, err


# -- 5. Agent Lightning's runner ------------------------------------------------------------------------------

def test_a_wrong_episode_key_is_refused_with_the_way_to_pass_it():
    app = build_app(lambda key: None, ["agent"], token=None, episode_token=lambda key: "secret")
    from fastapi.testclient import TestClient

    answer = TestClient(app).post("/e/k/v1/chat/completions", json={"model": "agent", "messages": HI},
                                  headers={"authorization": "Bearer dummy"})
    assert answer.status_code == 401
    message = answer.json()["error"]["message"]
    assert "OPENAI_API_KEY" in message and "api_key" in message and "docs/gateway.md" in message


def test_the_agent_lightning_example_trains_through_its_own_runner(chat_model, tmp_path):
    pytest.importorskip("agentlightning")
    config = tmp_path / "al.yaml"
    tree = agent_team(chat_model, "unused", max_new_tokens=2)
    example = Path(__file__).resolve().parents[1] / "examples/gateway/agent_lightning.py"
    tree["workflow"] = {"agent": {"command": [sys.executable, str(example)],
                                  "timeout_s": 300}}
    config.write_text(yaml.safe_dump(tree))
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run), *settings()]) == 0
    [record] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                if '"reward/mean"' in line]
    assert record["episode/failures"] == 0 and record["episode/no_turns"] == 0


# -- 6. malformed tools, and serve's memory --------------------------------------------------------------------

@pytest.mark.parametrize("fields,param", [
    ({"tool_choice": 3}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [tool("a")], "tool_choice": 3}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": "{}"}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "a", "description": 5}}]}, "tools[0].function.description"),
])
def test_malformed_tool_fields_are_a_400_naming_the_field(fields: dict, param: str):
    with pytest.raises(GatewayError) as refused:
        parse_chat({"model": "agent", "messages": HI, **fields}, {"agent"}, False)
    assert refused.value.status == 400 and refused.value.param == param


def test_a_responses_tool_whose_parameters_is_a_string_is_a_400():
    with pytest.raises(GatewayError) as refused:
        parse_responses({"model": "agent", "input": "hi", "tools": [{"type": "function", "name": "a",
                                                                     "parameters": "{}"}]},
                        {"agent"}, False, responses.ResponseHistory())
    assert refused.value.status == 400 and "parameters" in refused.value.param


def held_bytes(history: responses.ResponseHistory) -> int:
    """What the remembered conversations' text holds in memory, counted independently of the history's own sums."""
    return sum(sys.getsizeof(message.get("content") or "") for conversation in history._kept.values()
               for message in conversation)


def test_serve_memory_stays_bounded_over_six_batches_of_300_concurrent_requests(chat_model, monkeypatch):
    budget = 1 << 20
    monkeypatch.setattr(responses, "KEPT_BYTES", budget)
    from unimas.config.loading import config_from_dict
    from unimas.controller.router import Router
    from unimas.runtime.transport import start_transport
    from unimas.training.experiment import Experiment

    tree = agent_team(chat_model, "tests.test_gateway_in_practice:cached_agent", max_new_tokens=1)
    experiment = Experiment.resolve(config_from_dict(tree))
    transport = start_transport(experiment.config, experiment.registry)
    serving = Serving(experiment.config.roles, Router(transport, 256, 0.005))
    app = build_app(lambda key: serving, ["agent"], token=None)
    text = "\U0001f600" * 1500  # 4 bytes a character in memory: a bound on characters holds 4x its size

    async def batches() -> list[tuple[int, int]]:
        sizes = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            for batch in range(6):
                answers = await asyncio.gather(*(http.post("/v1/responses", json={
                    "model": "agent", "input": f"repeat: {batch} {i} {text}"}) for i in range(300)))
                assert all(a.status_code == 200 for a in answers)
                sizes.append((len(serving.responses._kept), held_bytes(serving.responses)))
        return sizes

    try:
        sizes = asyncio.run(batches())
    finally:
        transport.shutdown()
    for kept, held in sizes:
        assert 0 < kept <= responses.KEPT_RESPONSES and held <= budget, sizes
    assert sizes[-1][0] < 6 * 300  # the oldest were forgotten
