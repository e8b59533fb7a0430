"""The OpenAI-compatible gateway in-process: routing by role, episode isolation, errors, native parity.

Episodes run through the real controller, router and torch model group on
the built tiny chat model; agents here are Python callables (the ``function``
agent kind) or small commands. Training through a subprocess agent and
``unimas serve`` are in tests/test_gateway_train.py.
"""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest
from fastapi.testclient import TestClient
from openai import AsyncOpenAI

from unimas.algorithms.credit import CreditAssigner
from unimas.config.loading import config_from_dict
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.errors import UserError
from unimas.gateway.app import build_app
from unimas.gateway.protocol import GatewayError
from unimas.gateway.rewards import agent_reward
from unimas.gateway.server import is_loopback
from unimas.gateway.sessions import consumed_turns
from unimas.runtime.transport import start_transport
from unimas.training.experiment import Experiment
from unimas.trajectory import GraphTrajectory, TurnNode


def team(model_dir, workflow: dict, templates: bool = False) -> dict:
    def role(template: str) -> dict:
        spec = {"model": "shared", "generation": {"max_new_tokens": 2, "temperature": 1.0, "require_eos": False}}
        return {**spec, "template": template} if templates else spec

    return {
        "models": {"shared": {"options": {"path": str(model_dir)}}},
        "roles": {"speaker": role("target: {target}"), "listener": role("message: {message}")},
        "workflow": workflow,
        "data": {"name": "signalling"},
        "rewards": [{"name": "exact_match"}],
    }


def run_episodes(tree: dict, tasks: list[dict], greedy: bool = False):
    """Episodes of ``tree``'s workflow on ``tasks``, all at once; (trajectories, experiment)."""
    experiment = Experiment.resolve(config_from_dict(tree))
    transport = start_transport(experiment.config, experiment.registry)
    controller = Controller(experiment.workflow, experiment.config.roles, Router(transport), experiment.tools,
                            episode_timeout_s=60)
    specs = [EpisodeSpec(f"e{i}", f"t{i}", task) for i, task in enumerate(tasks)]
    try:
        return asyncio.run(controller.run(specs, greedy=greedy)), experiment
    finally:
        transport.shutdown()


# -- agents (the `function` kind): async def run(task, base_url) -> dict --------------------------------------

async def signalling_agent(task: dict, base_url: str) -> dict:
    """The signalling game written against the OpenAI client, as examples/gateway/two_agents.py does."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    speaker = await client.chat.completions.create(
        model="speaker", messages=[{"role": "user", "content": f"target: {task['target']}"}])
    message = speaker.choices[0].message.content
    listener = await client.chat.completions.create(
        model="listener", messages=[{"role": "user", "content": f"message: {message}"}])
    return {"answer": listener.choices[0].message.content.strip(), "message": message}


async def marked_agent(task: dict, base_url: str) -> dict:
    """Three concurrent turns whose prompts carry the task's marker; posts a reward for the last one."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    replies = await asyncio.gather(*(client.chat.completions.create(
        model=role, messages=[{"role": "user", "content": f"marker {task['marker']} call {i}"}])
        for i, role in enumerate(["speaker", "listener", "speaker"])))
    async with httpx.AsyncClient() as http:
        posted = await http.post(f"{base_url}/rewards", json={"turn": replies[-1].id, "reward": 0.5})
        for value in (1, int(task["marker"][1:-1])):  # the agent's own numbers, as a workflow's ctx.metric
            await http.post(f"{base_url}/metrics", json={"name": "calls", "value": value})
    return {"answer": task["marker"], "posted": posted.json()}


async def probing_agent(task: dict, base_url: str) -> dict:
    """Bad requests first, then a good one: each refusal is an OpenAI-style JSON error, the episode goes on."""
    url = f"{base_url}/chat/completions"
    good = {"model": "speaker", "messages": [{"role": "user", "content": "target: a"}]}
    async with httpx.AsyncClient() as http:
        probes = {
            "unknown_role": await http.post(url, json={**good, "model": "critic"}),
            "malformed": await http.post(url, content=b'{"model": "speaker", "messages": [', headers={
                "content-type": "application/json"}),
            "no_messages": await http.post(url, json={"model": "speaker"}),
            "two_choices": await http.post(url, json={**good, "n": 2}),
            "tools": await http.post(url, json={**good, "tools": [{"type": "function"}]}),  # no function: malformed
            "oversized": await http.post(url, content=b" " * (5 * 1024 * 1024)),
            "bad_reward": await http.post(f"{base_url}/rewards", json={"turn": "speaker#9", "reward": 1}),
            "bad_metric_name": await http.post(f"{base_url}/metrics", json={"name": "a/b", "value": 1}),
            "bad_metric_value": await http.post(f"{base_url}/metrics", json={"name": "x", "value": "NaN"}),
            "other_episode": await http.post(url.replace("/e/", "/e/x"), json=good),
            "models": await http.get(f"{base_url}/models"),
        }
        answer = await http.post(url, json=good)
    stream = await AsyncOpenAI(base_url=base_url, api_key="unused").chat.completions.create(**good, stream=True)
    streamed = [chunk async for chunk in stream]
    return {"probes": {name: [r.status_code, r.json()] for name, r in probes.items()},
            "answer": answer.json()["choices"][0]["message"]["content"], "base_url": base_url,
            "streamed": "".join(c.choices[0].delta.content or "" for c in streamed),
            "stream_end": [streamed[-1].choices[0].finish_reason, streamed[-1].usage.completion_tokens]}


async def long_prompt_agent(task: dict, base_url: str) -> dict:
    """Sends a prompt over the context of a role with `truncation: error`, then gives up (raises)."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    await client.chat.completions.create(model="speaker", messages=[{"role": "user", "content": "word " * 2000}])
    return {}


# -- tests ------------------------------------------------------------------------------------------------------

def test_gateway_and_native_workflow_record_the_same_graph(chat_model):
    """Greedy turns: the same node ids, edges, prompts and token ids whether ctx.act or the gateway asks."""
    tasks = [{"target": t, "answer": t} for t in "abcd"]
    native, _ = run_episodes(team(chat_model, {"name": "signalling"}, templates=True), tasks, greedy=True)
    gateway, _ = run_episodes(team(chat_model, {"agent": {"function": "tests.test_gateway:signalling_agent"}}),
                              tasks, greedy=True)
    for ours, theirs in zip(gateway, native):
        assert ours.error is None, ours.error
        assert [n.id for n in ours.nodes()] == [n.id for n in theirs.nodes()] == ["speaker#0", "listener#0"]
        assert sorted(ours.graph.edges) == sorted(theirs.graph.edges) == [("speaker#0", "listener#0")]
        for mine, native_turn in zip(ours.turns(), theirs.turns()):
            assert (mine.input, mine.prompt) == (native_turn.input, native_turn.prompt)
            assert mine.prompt_ids == native_turn.prompt_ids and mine.response_ids == native_turn.response_ids
            assert len(mine.logprobs) == len(mine.response_ids) > 0


def test_concurrent_episodes_never_mix(chat_model):
    markers = [f"m{i}x" for i in range(6)]
    tree = team(chat_model, {"agent": {"function": "tests.test_gateway:marked_agent"}})
    tree["rewards"].append({"name": "agent_reward", "level": "turn", "weight": 2.0})
    trajectories, experiment = run_episodes(tree, [{"marker": m, "answer": m} for m in markers])
    CreditAssigner(experiment.config, experiment.rewards, experiment.estimator).allocate(trajectories)
    for marker, trajectory in zip(markers, trajectories):
        assert trajectory.error is None, trajectory.error
        turns = trajectory.turns()
        assert sorted(t.id for t in turns) == ["listener#0", "speaker#0", "speaker#1"]
        assert all(marker in t.messages[0]["content"] for t in turns)  # only its own agent's requests
        last = trajectory.outcome["posted"]["turn"]
        assert trajectory.outcome["agent_rewards"] == {last: 0.5}
        assert agent_reward(trajectory, {}) == {last: 0.5}
        assert {t.id: t.reward for t in turns} == {**{t.id: 1.0 for t in turns}, last: 1.0 + 2.0 * 0.5}
        assert trajectory.metrics == {"calls": [1.0, float(marker[1:-1])]}  # its own episode's, in order


def test_bad_requests_get_openai_errors_and_the_episode_continues(chat_model):
    [trajectory], experiment = run_episodes(
        team(chat_model, {"agent": {"function": "tests.test_gateway:probing_agent"}}), [{"target": "a"}])
    assert trajectory.error is None, trajectory.error
    probes = trajectory.outcome["probes"]
    expected = {"unknown_role": (404, "model_not_found"), "malformed": (400, "invalid_json"),
                "no_messages": (400, "invalid_request"), "two_choices": (400, "invalid_request"),
                "tools": (400, "invalid_request"), "oversized": (413, "request_too_large"),
                "bad_reward": (400, "invalid_request"), "other_episode": (404, "episode_not_found"),
                "bad_metric_name": (400, "invalid_request"), "bad_metric_value": (400, "invalid_request")}
    for name, (status, code) in expected.items():
        got_status, body = probes[name]
        assert (got_status, body["error"]["code"]) == (status, code), (name, body)
        assert body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
    assert "critic" in probes["unknown_role"][1]["error"]["message"]
    assert probes["models"][0] == 200
    assert [m["id"] for m in probes["models"][1]["data"]] == ["listener", "speaker"]
    assert trajectory.metrics == {}  # refused metrics recorded nothing
    speaker, streamed = trajectory.turns()  # refused requests recorded nothing
    assert (speaker.id, streamed.id) == ("speaker#0", "speaker#1")
    assert trajectory.outcome["streamed"] == streamed.text
    assert trajectory.outcome["stream_end"] == ["stop" if streamed.finished else "length", len(streamed.response_ids)]
    finished = httpx.post(f"{trajectory.outcome['base_url']}/chat/completions",
                          json={"model": "speaker", "messages": [{"role": "user", "content": "x"}]})
    assert finished.status_code == 404 and finished.json()["error"]["code"] == "episode_not_found"
    experiment.workflow.gateway.stop()


CRASH = "import sys; sys.stdin.read(); print('agent bug: boom', file=sys.stderr); sys.exit(3)"
GARBAGE = "import sys; sys.stdin.read(); print('all done!')"
HANG = "import sys, time; sys.stdin.read(); time.sleep(60)"


@pytest.mark.parametrize("source,timeout_s,expected", [
    (CRASH, 60, ["exited with code 3", "agent bug: boom"]),
    (GARBAGE, 60, ["not a JSON object", "all done!"]),
    (HANG, 1, ["did not finish within 1 s"]),
])
def test_broken_agent_programs_fail_their_episode_with_the_reason(chat_model, source, timeout_s, expected):
    """Only the hanging agent meets its timeout: on a loaded 2-core machine an interpreter's start alone once
    took more than the 1 s that all three cases had, and the crash was reported as a timeout."""
    agent = {"command": [sys.executable, "-c", source], "timeout_s": timeout_s}
    [trajectory], _ = run_episodes(team(chat_model, {"agent": agent}), [{"target": "a"}])
    assert trajectory.failed
    for text in expected:
        assert text in trajectory.error


def test_command_agent_gets_the_task_and_its_url(chat_model):
    source = ("import json, os, sys; task = json.load(sys.stdin); "
              "print('log line'); print(json.dumps({'answer': task['target'], 'url': os.environ['OPENAI_BASE_URL'], "
              "'key': bool(os.environ['OPENAI_API_KEY'])}))")
    [trajectory], _ = run_episodes(team(chat_model, {"agent": {"command": [sys.executable, "-c", source]}}),
                                   [{"target": "q"}])
    assert trajectory.error is None, trajectory.error
    assert trajectory.outcome["answer"] == "q" and trajectory.outcome["key"] is True
    assert trajectory.outcome["url"].startswith("http://127.0.0.1:") and "/e/e0-" in trajectory.outcome["url"]


def test_templates_are_optional_only_for_agent_workflows(chat_model):
    with pytest.raises(UserError, match="needs a 'template'"):
        Experiment.resolve(config_from_dict(team(chat_model, {"name": "signalling"})))
    with pytest.raises(UserError, match="exactly one of 'command'"):
        config_from_dict(team(chat_model, {"agent": {"command": ["x"], "function": "a.b:c"}}))
    with pytest.raises(UserError, match="must be `async def run"):
        Experiment.resolve(config_from_dict(team(chat_model, {"agent": {"function": "json:dumps"}})))


def test_beyond_loopback_every_request_needs_the_run_token():
    def lookup(key):
        raise GatewayError(404, "no such episode", code="episode_not_found")

    client = TestClient(build_app(lookup, ["speaker"], token="s3cret"))
    refused = client.get("/e/abc/v1/models")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/e/abc/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    passed = client.get("/e/abc/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert passed.status_code == 404 and passed.json()["error"]["code"] == "episode_not_found"
    unknown = client.get("/nowhere")
    assert unknown.status_code == 404 and "error" in unknown.json()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def test_consumed_edges_need_the_whole_output_not_a_piece_of_a_word():
    trajectory = GraphTrajectory("e", "t")
    for node_id, text in [("speaker#0", "a"), ("critic#0", " looks fine. "), ("planner#0", "")]:
        trajectory.add_node(TurnNode(id=node_id, role=node_id[:-2], model_group="g", prompt="", text=text))

    def consumed(content: str) -> list[str]:
        return [t.id for t in consumed_turns(trajectory, [{"role": "user", "content": content}])]

    assert consumed("message: a") == ["speaker#0"]
    assert consumed("target: banana") == []  # "a" only inside a word
    assert consumed("the critic said: looks fine.") == ["critic#0"]
    assert consumed("it looks fine.x") == []  # "looks fine." is followed by a word character, so it is not whole


def test_a_failed_turn_is_the_episodes_error_even_when_the_agent_gives_up(chat_model):
    tree = team(chat_model, {"agent": {"function": "tests.test_gateway:long_prompt_agent"}})
    tree["roles"]["speaker"]["truncation"] = "error"
    [trajectory], _ = run_episodes(tree, [{"target": "a"}])
    assert trajectory.failed and "PromptTooLong" in trajectory.error and "roles.speaker.truncation" in trajectory.error
    assert trajectory.turns()[0].truncated


def test_unimas_serve_needs_an_api_key_beyond_loopback():
    from unimas.gateway.serve import TOKEN_ENV, serve_token

    assert all(serve_token(host, {TOKEN_ENV: "set"}) is None for host in ("127.0.0.1", "localhost", "::1"))
    assert serve_token("0.0.0.0", {TOKEN_ENV: "s3cret"}) == "s3cret"
    generated = {serve_token("0.0.0.0", {}) for _ in range(3)}
    assert len(generated) == 3 and all(len(token) >= 32 for token in generated)
