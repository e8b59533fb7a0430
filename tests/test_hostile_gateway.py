"""The gateway against a hostile agent: odd field types, schemas that cannot be checked, numbers past float range,
huge messages against many turns, clients that vanish, requests racing the end of their episode, bursts of bad
requests among good ones, and ids that must not repeat across the clients of ``unimas serve``.

Each case is one a broken or hostile program can send; each time the request gets a 4xx JSON error that names its
field or problem (or the answer reports it), never a 500 nor a logged traceback, and the good requests around it,
and the other episodes, are served as usual.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.test_gateway import run_episodes, team
from unimas.gateway.app import build_app
from unimas.gateway.protocol import parse_chat
from unimas.gateway.server import GatewayServer
from unimas.gateway.sessions import Episode, Serving
from unimas.trajectory import GraphTrajectory, TurnNode

HI = [{"role": "user", "content": "hi"}]
ROLES = {"agent": SimpleNamespace(generation=SimpleNamespace(max_new_tokens=8))}
"""The role config an episode reads: ``agent``, which may sample 8 tokens."""
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def answered_turn(turn_id: str, text: str) -> TurnNode:
    return TurnNode(id=turn_id, role=turn_id.partition("#")[0], model_group="g", prompt="", text=text,
                    prompt_ids=[1], response_ids=[5], logprobs=[-1.0], finished=True)


class StandInContext:
    """The part of an EpisodeContext an :class:`Episode` uses: its trajectory and a turn that answers ``text``."""

    def __init__(self, text: str):
        self.trajectory = GraphTrajectory("e0", "t0")
        self.text = text
        self.after: list[TurnNode] = []
        """The turns the last request was found to consume."""

    async def chat(self, role: str, messages: list, after: list[TurnNode], **options) -> TurnNode:
        self.after = after
        return answered_turn(f"{role}#0", self.text)


class AnsweringSession:
    """A session whose every turn is answered at once with ``ok``."""

    responses = None

    async def chat(self, call, progress=None) -> TurnNode:
        return answered_turn(f"{call.role}#0", "ok")


def stand_in_episode(text: str = "ok") -> Episode:
    """An episode on the running loop whose every turn answers ``text``."""
    return Episode(StandInContext(text), ROLES, asyncio.get_running_loop())


@pytest.mark.parametrize("fields,param", [
    ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": {"name": "user"}, "content": "x"}]}, "messages[0]"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": "lookup"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": None}}, "tool_choice"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"max_completion_tokens": "5", "max_tokens": 5}, "max_completion_tokens"),
])
def test_fields_of_the_wrong_type_are_a_400_naming_the_field_not_a_500(fields: dict, param: str):
    """A role that is a list or an object is unhashable and a named tool_choice whose function is not an object
    has no ``.get``: both used to escape the request checks as a 500. A bad ``max_completion_tokens`` was
    refused under the name ``max_tokens``, a field the agent did not send."""
    client = TestClient(build_app(lambda key: AnsweringSession(), ["agent"], token=None))
    answer = client.post("/v1/chat/completions", json={"model": "agent", "messages": HI, **fields})
    assert answer.status_code == 400, answer.json()
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_request") and param in error["message"]
    assert "Traceback" not in answer.text


def test_a_metric_past_the_float_range_is_a_400_and_the_episode_keeps_its_metrics():
    """``10**400`` is a JSON number and a finite int, but no float: it used to fail the request with a 500
    (OverflowError) where ``ctx.metric`` refuses it as not finite."""
    async def post_metrics() -> tuple[list[httpx.Response], Episode]:
        episode = stand_in_episode()
        transport = httpx.ASGITransport(app=build_app(lambda key: episode, ["agent"], token=None))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            answers = [await http.post("/e/k/v1/metrics", content=json.dumps({"name": "rounds", "value": value}))
                       for value in (10 ** 400, -(10 ** 400), 3)]
        return answers, episode

    (huge, negative, good), episode = asyncio.run(post_metrics())
    for refused in (huge, negative):
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "value", refused.json()
    assert good.status_code == 200 and episode.metrics == [("rounds", 3.0)]


@pytest.mark.parametrize("schema", [{"$ref": "#"}, {"allOf": [{"$ref": "#"}]}, {"$ref": "#/definitions/nowhere"},
                                    {"$ref": "http://127.0.0.1:9/schema.json"}])
def test_a_schema_that_cannot_be_checked_is_the_turns_format_error_not_a_failed_episode(schema: dict):
    """A ``$ref`` that loops or points nowhere made jsonschema raise RecursionError or Unresolvable while the
    gateway checked a JSON answer: the agent got a 500 and its episode failed as if the model group had. The
    schema is the agent's; the miss is reported like an invalid schema, and the episode goes on."""
    body = {"model": "agent", "messages": HI,
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}

    async def turn() -> tuple[TurnNode, Episode]:
        episode = stand_in_episode('{"answer": 1}')
        return await episode.chat(parse_chat(body, {"agent"}, sampling=False)), episode

    answered, episode = asyncio.run(turn())
    assert answered.format_error.startswith("the schema cannot be checked"), answered.format_error
    assert episode.fatal is None


def test_finding_the_consumed_turns_hands_the_shared_loop_back_after_each_turn():
    """The episode loop is every episode's, and each earlier turn costs a regex scan of the request's messages:
    500 turns against a 4 MiB message held the loop for 30 s, stalling every other episode. A task beside the
    scan must now run between the turns (counted by its beats), and the edges found stay the same."""
    async def scan_with_a_neighbour() -> tuple[int, list[str]]:
        episode = stand_in_episode()
        for i in range(64):
            episode.context.trajectory.add_node(answered_turn(f"speaker#{i}", "x" if i % 2 else "y"))
        beats = 0

        async def neighbour() -> None:
            nonlocal beats
            while True:
                beats += 1
                await asyncio.sleep(0)

        beating = asyncio.create_task(neighbour())
        await asyncio.sleep(0)
        await episode.chat(parse_chat({"model": "agent", "messages": [{"role": "user", "content": "say x"}]},
                                      {"agent"}, sampling=False))
        beating.cancel()
        return beats, [turn.id for turn in episode.context.after]

    beats, consumed = asyncio.run(scan_with_a_neighbour())
    assert beats >= 64, f"the neighbour ran {beats} times while 64 turns were matched"
    assert consumed == [f"speaker#{i}" for i in range(1, 64, 2)]


class OneTurnServing(Serving):
    """``unimas serve`` as the routes see it: each request is a one-turn episode of its own, so its turn id is
    always ``<role>#0``; records the messages each turn was asked with."""

    def __init__(self) -> None:
        super().__init__(roles={}, router=None)
        self.asked: list[list[dict]] = []

    async def chat(self, call, progress=None) -> TurnNode:
        self.asked.append(call.messages)
        return answered_turn(f"{call.role}#0", "noted")


def test_served_responses_get_ids_of_their_own_so_one_client_never_continues_anothers():
    """Every served answer was ``resp-agent#0`` / ``chatcmpl-agent#0``: a client continuing its conversation by
    ``previous_response_id`` got the conversation of whichever client was answered last."""
    serving = OneTurnServing()
    client = TestClient(build_app(lambda key: serving, ["agent"], token=None))
    alice = client.post("/v1/responses", json={"model": "agent", "input": "alice: my pin is 1234"}).json()
    bob = client.post("/v1/responses", json={"model": "agent", "input": "bob: hello"}).json()
    assert alice["id"] != bob["id"]
    client.post("/v1/responses", json={"model": "agent", "input": "go on", "previous_response_id": alice["id"]})
    assert [m["content"] for m in serving.asked[-1]] == ["alice: my pin is 1234", "noted", "go on"]
    chats = [client.post("/v1/chat/completions", json={"model": "agent", "messages": HI}).json()["id"]
             for _ in range(2)]
    assert chats[0] != chats[1]


def test_a_client_gone_mid_body_is_neither_answered_nor_logged_as_a_gateway_failure(caplog):
    """An agent killed by its timeout (or one that half-closes its socket) leaves a body unread: that used to be
    logged as a gateway failure with a traceback, and a 500 sent to nobody, once per request of such a client."""
    app = build_app(lambda key: AnsweringSession(), ["agent"], token=None)
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "root_path": "", "query_string": b"", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 50000), "headers": [(b"host", b"127.0.0.1"), (b"content-length", b"100")]}
    arriving = iter([{"type": "http.request", "body": b'{"model": "ag', "more_body": True},
                     {"type": "http.disconnect"}])
    sent: list[dict] = []

    async def receive() -> dict:
        return next(arriving)

    async def send(message: dict) -> None:
        sent.append(message)

    with caplog.at_level(logging.WARNING, logger="unimas.gateway"):
        asyncio.run(app(scope, receive, send))
    assert sent == [] and caplog.records == []
    assert TestClient(app).post("/v1/chat/completions", json={"model": "agent", "messages": HI}).status_code == 200


class SlowContext(StandInContext):
    """A context whose turns take ``seconds`` to answer ``late``; ``started`` is set once one began."""

    def __init__(self, seconds: float) -> None:
        super().__init__("late")
        self.seconds = seconds
        self.started = threading.Event()

    async def chat(self, role: str, messages: list, **options) -> TurnNode:
        self.started.set()
        await asyncio.sleep(self.seconds)
        return answered_turn(f"{role}#0", self.text)


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_still_generating_when_its_episode_ends_is_answered_404_json(stream: bool, caplog):
    """Ending an episode cancels its turns in flight; the cancellation escaped every handler, so uvicorn answered
    a plain-text 500 and logged "Exception in ASGI application" with a traceback (an agent that times out, or
    returns with requests outstanding, does this)."""
    server = GatewayServer(ROLES, sealed=False)
    context = SlowContext(60)
    answers: list[httpx.Response] = []
    body = {"model": "agent", "stream": stream, "messages": HI}

    async def end_the_episode_mid_turn() -> None:
        with server.episode(context) as episode:
            url = f"{server.base_url(episode)}/chat/completions"
            asker = threading.Thread(target=lambda: answers.append(httpx.post(url, json=body, timeout=30)))
            asker.start()
            assert await asyncio.to_thread(context.started.wait, 30)
        await asyncio.to_thread(asker.join, 30)

    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(end_the_episode_mid_turn())
    finally:
        server.stop()
    [answer] = answers
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "episode_finished", answer.text
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


class ClosedOnArrival(set):
    """The episode's set of turns in flight, closing the episode just before a turn joins it: the order the
    controller's thread and the web server's may take when an episode ends as a request comes in."""

    def __init__(self, episode: Episode):
        super().__init__()
        self.episode = episode

    def add(self, future) -> None:
        self.episode.close()
        super().add(future)


def test_a_turn_handed_over_as_its_episode_ends_is_refused_not_added_to_the_finished_episode():
    """chat() checked that the episode was open, then handed the turn to the controller's loop and only then
    listed it as in flight: an episode closed in between never cancelled it, so a turn ran on (and was added
    to) a finished episode, and its agent was answered as if the episode still ran. (The turn takes 2 s, so it
    cannot have ended before the episode did.)"""
    server = GatewayServer(ROLES, sealed=False)
    answers: list[httpx.Response] = []

    async def request_as_the_episode_ends() -> None:
        with server.episode(SlowContext(2)) as episode:
            episode._inflight = ClosedOnArrival(episode)
            url = f"{server.base_url(episode)}/chat/completions"
            answers.append(await asyncio.to_thread(httpx.post, url, json={"model": "agent", "messages": HI},
                                                   timeout=30))

    try:
        asyncio.run(request_as_the_episode_ends())
    finally:
        server.stop()
    [answer] = answers
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "episode_finished", answer.text


async def burst_agent(task: dict, base_url: str) -> dict:
    """24 requests at once: every third one good, the others malformed each in its own way."""
    good = {"model": "speaker", "max_tokens": 1, "messages": [{"role": "user", "content": f"target: {task['target']}"}]}
    bad = [{**good, "messages": [{"role": ["user"], "content": "x"}]}, {**good, "messages": "x"},
           {**good, "tools": TOOLS, "tool_choice": {"type": "function", "function": "lookup"}}, {**good, "stop": [""]}]
    bodies = [good if i % 3 == 0 else bad[i % len(bad)] for i in range(24)]
    async with httpx.AsyncClient(timeout=60) as http:
        answers = await asyncio.gather(*(http.post(f"{base_url}/chat/completions", json=body) for body in bodies))
    return {"answer": task["target"], "statuses": [a.status_code for a in answers]}


def test_a_burst_of_bad_requests_among_good_ones_gets_400s_and_the_good_ones_are_answered(chat_model, caplog):
    """Two episodes at once, each sending bad and good requests concurrently: no bad request is a 500 (none is
    logged as a gateway failure), every good one is a turn of its own episode."""
    tree = team(chat_model, {"agent": {"function": "tests.test_hostile_gateway:burst_agent"}})
    with caplog.at_level(logging.WARNING, logger="unimas.gateway"):
        trajectories, experiment = run_episodes(tree, [{"target": "a"}, {"target": "b"}])
    experiment.workflow.gateway.stop()
    for target, trajectory in zip("ab", trajectories):
        assert trajectory.error is None, trajectory.error
        statuses = trajectory.outcome["statuses"]
        assert statuses == [200 if i % 3 == 0 else 400 for i in range(24)], statuses
        assert len(trajectory.turns()) == 8
        assert all(t.messages[0]["content"] == f"target: {target}" for t in trajectory.turns())
    assert not [r for r in caplog.records if "failed" in r.getMessage()]


def test_a_wrong_method_is_a_405_saying_so_not_a_not_found():
    """``GET`` on a POST-only route exists as a path: the error code says the method is wrong, so the agent's
    author does not hunt for a missing route."""
    client = TestClient(build_app(lambda key: AnsweringSession(), ["agent"], token=None))
    answer = client.get("/e/abc/v1/chat/completions")
    assert answer.status_code == 405
    assert answer.json()["error"]["code"] == "method_not_allowed"
    assert client.get("/e/abc/v1/nowhere").json()["error"]["code"] == "not_found"


def test_remembered_responses_are_bounded_by_their_text_not_only_their_count(monkeypatch):
    """Each remembered response holds its whole conversation, and ``unimas serve`` has one session for every
    client: a chain of 4 MiB requests kept gigabytes. Past the text budget the oldest are forgotten, the newest
    is always kept (the budget counts bytes held, not characters: tests/test_gateway_in_practice.py)."""
    from unimas.gateway import responses

    entry = [{"role": "user", "content": "x" * 300}]
    monkeypatch.setattr(responses, "KEPT_BYTES", 3 * responses.held_bytes(entry) + 10)  # room for three
    history = responses.ResponseHistory()
    for index in range(10):
        history.keep(f"r{index}", [{"role": "user", "content": "x" * 300}])
    assert history.conversation("r9") and history.conversation("r7")
    with pytest.raises(Exception, match="previous_response_not_found|not a response"):
        history.conversation("r6")
    history.keep("big", [{"role": "user", "content": "y" * 5000}])  # alone past the budget: kept, others go
    assert history.conversation("big")
    with pytest.raises(Exception, match="not a response"):
        history.conversation("r9")
