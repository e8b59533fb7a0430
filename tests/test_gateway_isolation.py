"""Isolation: one agent, one episode, one process tree; and no request can hurt the run (docs/gateway.md).

Each case plays the attacker or the broken program: a lone surrogate in a
message during `unimas train`, an agent that snoops /proc for its siblings'
credentials and posts into their episodes, children that try to outlive
their episode, output floods, a 200 MiB body, `max_tokens` 10^12 and a
foreign Host header on `unimas serve`. Each time the run goes on, nothing
lands in another episode and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from openai import AsyncOpenAI

from tests.test_chat import strict_model
from tests.test_gateway import run_episodes, team
from unimas.cli import main
from unimas.config.loading import config_from_dict
from unimas.errors import UserError
from unimas.gateway import agent
from unimas.gateway.app import build_app
from unimas.gateway.confine import Confinement, confinement
from unimas.gateway.guard import allowed_hosts, host_name
from unimas.gateway.protocol import GatewayError
from unimas.training.experiment import Experiment
from unimas.trajectory import read_jsonl

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20

HTTP = r'''
import json, os, sys, urllib.error, urllib.request

def post(url, key, body):
    """(status, JSON answer) of a POST; `body` is bytes sent as they are, or an object sent as JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)

def chat(role, content):
    return {"model": role, "max_tokens": 1, "messages": [{"role": "user", "content": content}]}

BASE, KEY = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
'''

SURROGATE_AGENT = HTTP + r'''
task = json.load(sys.stdin)
content = "target: " + task["target"]
body = json.dumps(chat("speaker", content))
if task["target"] == "a":
    body = body.replace(content, content + "\\ud800")  # in the JSON text: the escape of a lone surrogate
status, answer = post(BASE + "/chat/completions", KEY, body.encode())
if status != 200:  # what an openai client does: raise, and the program exits non-zero
    error = answer["error"]
    sys.exit(f"HTTP {status} {error['code']} param={error['param']}: {error['message']}")
message = answer["choices"][0]["message"]["content"]
status, guess = post(BASE + "/chat/completions", KEY, chat("listener", "message: " + message))
print(json.dumps({"answer": guess["choices"][0]["message"]["content"].strip(), "message": message}))
'''

UNRENDERABLE_AGENT = HTTP + r'''
task = json.load(sys.stdin)
messages = [{"role": "user", "content": "target: " + task["target"]}]
if task["target"] == "a":  # two assistant messages in a row: the strict template raises on them
    messages += [{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]
status, answer = post(BASE + "/chat/completions", KEY, {"model": "speaker", "max_tokens": 1, "messages": messages})
if status != 200:
    error = answer["error"]
    sys.exit(f"HTTP {status} {error['code']} param={error['param']}: {error['message']}")
message = answer["choices"][0]["message"]["content"]
status, guess = post(BASE + "/chat/completions", KEY, chat("listener", "message: " + message))
print(json.dumps({"answer": guess["choices"][0]["message"]["content"].strip(), "message": message}))
'''

SNOOPING_AGENT = HTTP + r'''
import glob, time
task = json.load(sys.stdin)
shared, siblings = sys.argv[1], int(sys.argv[2])

def barrier(name):
    open(os.path.join(shared, f"{task['target']}.{name}"), "w").write(BASE)
    deadline = time.time() + 60
    while len(glob.glob(os.path.join(shared, f"*.{name}"))) < siblings:
        assert time.time() < deadline, "the sibling agents did not run at the same time"
        time.sleep(0.05)

status, own = post(BASE + "/chat/completions", KEY, chat("speaker", "target: " + task["target"]))
assert status == 200, own
barrier("url")  # every agent has a turn and has leaked its URL (but not its key)
urls, keys = set(), set()
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        items = open(path, "rb").read().split(b"\0")
    except OSError:
        continue
    for item in items:
        text = item.decode(errors="replace")
        if text.startswith("OPENAI_BASE_URL="):
            urls.add(text.partition("=")[2])
        elif text.startswith("OPENAI_API_KEY="):
            keys.add(text.partition("=")[2])
        elif "http://" in text and "/e/" in text:
            urls.add(text[text.find("http://"):])
urls.discard(BASE)
keys.discard(KEY)
leaked = {open(path).read() for path in glob.glob(os.path.join(shared, "*.url"))} - {BASE}
attempts = []
for url in sorted(urls | leaked):
    for key in sorted(keys | {KEY, ""}):
        turn, _ = post(url + "/chat/completions", key, chat("speaker", "intruder"))
        reward, _ = post(url + "/rewards", key, {"turn": "speaker#0", "reward": 1000})
        attempts.append([turn, reward])
barrier("done")  # nobody's episode ends before every attack is made
status, _ = post(BASE + "/rewards", KEY, {"turn": own["id"], "reward": 0.5})
print(json.dumps({"answer": task["target"], "proc_urls": len(urls), "proc_keys": len(keys), "leaked": len(leaked),
                  "attempts": attempts, "own_reward": status}))
'''

ESCAPING_AGENT = r'''
import glob, json, subprocess, sys, time
mark, mode, report = sys.argv[1:4]
sys.stdin.read()
sleeper = [sys.executable, "-c", "import time; time.sleep(600)", mark]
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
subprocess.Popen(sleeper, **quiet)                           # same process group
subprocess.Popen(sleeper, start_new_session=True, **quiet)   # setsid: a session and group of its own
subprocess.Popen(sleeper)                                    # holds the agent's stdout and stderr open
deadline = time.time() + 20
while time.time() < deadline:  # an exec'd child shows its new command line a moment after Popen returns
    running = sum(mark.encode() in line and b"time.sleep" in line
                  for line in (open(p, "rb").read() for p in glob.glob("/proc/[0-9]*/cmdline")))
    if running == 3:
        break
    time.sleep(0.01)
open(report, "w").write(str(running))
if mode == "hang":
    time.sleep(600)
print(json.dumps({"answer": "a"}))
'''

FLOOD_AGENT = r'''
import json, sys
task = json.load(sys.stdin)
block = (b"x" * 1023 + b"\n") * 1024  # 1 MiB of log lines
if task["target"] == "a":
    for _ in range(150):
        sys.stdout.buffer.write(block)
    sys.stdout.buffer.write(b'{"answer": "a"}\n')
elif task["target"] == "b":
    for _ in range(150):
        sys.stderr.buffer.write(block)
    sys.stderr.buffer.write(b"the end of stderr\n")
    sys.exit(2)
elif task["target"] == "c":
    sys.stdout.buffer.write(b'{"answer": "' + b"c" * (2 << 20) + b'"}\n')
else:
    print(json.dumps({"answer": task["target"]}))
'''


def program(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return str(path)


def marked(mark: str) -> list[int]:
    """Processes whose command line holds ``mark``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if mark.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def left_behind(mark: str, within_s: float = 5.0) -> list[int]:
    """The marked processes still there after ``within_s`` (a PID namespace is torn down asynchronously)."""
    deadline = time.monotonic() + within_s
    while (found := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def memory_mb(field: str) -> float:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) / 1024


@contextlib.contextmanager
def peak_memory() -> Iterator[dict[str, float]]:
    """``{"growth": MB}`` once the block is done: its peak resident memory (VmHWM) minus the size before it."""
    measured: dict[str, float] = {}
    before = memory_mb("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # restart the peak from the current size
    yield measured
    measured["growth"] = memory_mb("VmHWM:") - before


needs_bwrap = pytest.mark.skipif(confinement().bwrap is None, reason="bubblewrap cannot make a PID namespace here")


@pytest.fixture(params=["bwrap", "reaper"])
def confined(request, monkeypatch) -> str:
    """Each way of confining agents in turn (docs/gateway.md, Isolation)."""
    if request.param == "bwrap":
        if confinement().bwrap is None:
            pytest.skip("bubblewrap cannot make a PID namespace here")
    else:
        monkeypatch.setattr(agent, "confinement", lambda: Confinement(None))
    return request.param


# -- no request can stop the run ---------------------------------------------------------------------------------

def train_two_agent_program(model: Path, tmp_path: Path, name: str, agent: str) -> list:
    """One training step of examples/gateway/two_agents.yaml with ``agent`` as the program (4 tasks, 2 episodes
    each) on ``model``; must exit 0; the trajectories it recorded."""
    text = (REPO / "examples/gateway/two_agents.yaml").read_text()
    text = text.replace("options: {path: ../models/tiny-chat}", f"options: {{path: {model}}}")
    text = text.replace("command: [python, examples/gateway/two_agents.py]",
                        f"command: [{sys.executable}, {program(tmp_path, name, agent)}]")
    text = text.replace("params: {targets: abcdefgh}", "params: {targets: abcd}")
    config = tmp_path / f"{name}.yaml"
    config.write_text(text)
    run = tmp_path / "run"
    settings = ["trainer.steps=1", "trainer.tasks_per_step=4", "algorithm.group_size=2", "trainer.eval_every=0",
                "logging.console=false", "logging.report=false"]
    assert main(["train", str(config), "--run-dir", str(run), *[a for s in settings for a in ("--set", s)]]) == 0
    return read_jsonl(run / "trajectories/train.jsonl")


def test_a_lone_surrogate_fails_its_episode_and_the_run_goes_on(chat_model, tmp_path, capfd):
    trajectories = train_two_agent_program(chat_model, tmp_path, "surrogate", SURROGATE_AGENT)
    poisoned = [t for t in trajectories if t.task["target"] == "a"]
    assert poisoned and all(t.failed and not t.turns() for t in poisoned)  # refused: nothing reached a model
    for trajectory in poisoned:
        assert "HTTP 400 invalid_request param=messages[0].content" in trajectory.error
        assert "lone surrogate" in trajectory.error
    others = [t for t in trajectories if t.task["target"] != "a"]
    assert others and not any(t.failed for t in others)
    assert all([n.role for n in t.turns()] == ["speaker", "listener"] for t in others)
    assert "Traceback" not in capfd.readouterr().err


def test_messages_the_chat_template_cannot_render_fail_their_episode_and_the_run_goes_on(chat_model, tmp_path,
                                                                                         capfd):
    """A template's raise_exception on one agent's messages fails that request (400 naming the problem) and its
    episode, never the batch it was generated in: the other episodes' turns are sampled, the run exits 0."""
    trajectories = train_two_agent_program(strict_model(chat_model, tmp_path), tmp_path, "unrenderable",
                                           UNRENDERABLE_AGENT)
    broken = [t for t in trajectories if t.task["target"] == "a"]
    assert broken and all(t.failed and not t.turns() for t in broken)
    for trajectory in broken:
        assert "cannot turn this request's messages into prompt ids" in trajectory.error
        assert "Conversation roles must alternate" in trajectory.error
    others = [t for t in trajectories if t.task["target"] != "a"]
    assert others and not any(t.failed for t in others)
    assert all([n.role for n in t.turns()] == ["speaker", "listener"] for t in others)
    assert "Traceback" not in capfd.readouterr().err


def test_any_exception_in_a_request_is_that_requests_500_and_the_server_goes_on():
    calls = []

    def lookup(key):
        calls.append(key)
        if len(calls) == 1:
            raise RuntimeError("a bug behind the route")
        raise GatewayError(404, "no such episode", code="episode_not_found")

    client = TestClient(build_app(lookup, ["speaker"], token=None))
    broken = client.get("/e/abc/v1/models")
    assert broken.status_code == 500
    assert broken.json()["error"] == {"message": "the gateway failed on this request: RuntimeError: a bug behind "
                                                 "the route", "type": "server_error", "param": None,
                                      "code": "internal_error"}
    assert client.get("/e/abc/v1/models").json()["error"]["code"] == "episode_not_found"  # still serving


# -- one agent, one episode ----------------------------------------------------------------------------------------

@needs_bwrap
def test_an_agent_cannot_see_or_act_in_a_sibling_episode(chat_model, tmp_path):
    shared = tmp_path / "leaks"
    shared.mkdir()
    targets = "abc"
    command = [sys.executable, program(tmp_path, "snoop", SNOOPING_AGENT), str(shared), str(len(targets))]
    tree = team(chat_model, {"agent": {"command": command, "timeout_s": 120}})
    tree["rewards"].append({"name": "agent_reward", "level": "turn"})
    trajectories, _ = run_episodes(tree, [{"target": t, "answer": t} for t in targets])
    for target, trajectory in zip(targets, trajectories):
        assert trajectory.error is None, trajectory.error
        outcome = trajectory.outcome
        assert (outcome["proc_urls"], outcome["proc_keys"]) == (0, 0)  # /proc shows no sibling
        assert outcome["leaked"] == len(targets) - 1  # the URLs it was handed anyway...
        assert outcome["attempts"] and all(a == [401, 401] for a in outcome["attempts"])  # ...admit nobody
        assert [(t.id, t.messages[0]["content"]) for t in trajectory.turns()] == [("speaker#0", f"target: {target}")]
        assert outcome["own_reward"] == 200 and outcome["agent_rewards"] == {"speaker#0": 0.5}


def test_an_episode_key_alone_admits_nobody():
    tokens = {"k1": "t1"}
    client = TestClient(build_app(lambda key: object(), ["speaker"], token=None, episode_token=tokens.get))
    assert client.get("/e/k1/v1/models", headers={"Authorization": "Bearer t1"}).status_code == 200
    for headers in ({}, {"Authorization": "Bearer t2"}, {"Authorization": "Bearer t1x"}):
        refused = client.get("/e/k1/v1/models", headers=headers)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/e/k2/v1/models", headers={"Authorization": "Bearer t1"}).status_code == 401  # not k2's


def test_a_function_agent_cannot_serve_beyond_loopback(chat_model):
    tree = team(chat_model, {"agent": {"function": "tests.test_gateway:signalling_agent", "host": "0.0.0.0"}})
    with pytest.raises(UserError, match="workflow.agent.host: a `function` agent cannot present its episode's token"):
        Experiment.resolve(config_from_dict(tree))


# -- one process tree ----------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_no_process_of_an_agent_outlives_its_episode(chat_model, tmp_path, confined, mode):
    mark = f"unimas-agent-{uuid.uuid4().hex}"
    report = tmp_path / "running"
    command = [sys.executable, program(tmp_path, "escape", ESCAPING_AGENT), mark, mode, str(report)]
    timeout_s = 3 if mode == "hang" else 60
    [trajectory], _ = run_episodes(team(chat_model, {"agent": {"command": command, "timeout_s": timeout_s}}),
                                   [{"target": "a", "answer": "a"}])
    assert report.read_text() == "3"  # all three children were running
    if mode == "exit":  # ended at once although a child still held its stdout
        assert trajectory.error is None and trajectory.outcome["answer"] == "a"
    else:
        assert trajectory.failed and f"did not finish within {timeout_s} s" in trajectory.error
    assert left_behind(mark) == []


# -- bounded output and bodies -------------------------------------------------------------------------------------

def test_output_floods_are_kept_to_their_tails(chat_model, tmp_path):
    command = [sys.executable, program(tmp_path, "flood", FLOOD_AGENT)]
    tree = team(chat_model, {"agent": {"command": command, "timeout_s": 120}})
    tasks = [{"target": t, "answer": t} for t in "abc"]
    [warm_up], _ = run_episodes(tree, [{"target": "w"}])  # the first run in a process loads the model, torch...
    assert warm_up.error is None, warm_up.error
    with peak_memory() as memory:
        trajectories, _ = run_episodes(tree, tasks)
    stdout_flood, stderr_flood, long_outcome = trajectories
    assert memory["growth"] < 100, f"the trainer grew by {memory['growth']:.0f} MB reading 300 MB of agent output"
    assert stdout_flood.error is None and stdout_flood.outcome["answer"] == "a"
    assert stderr_flood.failed and "exited with code 2" in stderr_flood.error
    assert stderr_flood.error.endswith("the end of stderr\n") and len(stderr_flood.error) < agent.STDERR_KEPT + 200
    assert long_outcome.failed and f"longer than the outcome limit of {agent.OUTCOME_LIMIT} bytes" in long_outcome.error


def raw_post(url: str, size: int, chunked: bool, host: str | None = None) -> tuple[int, dict, int]:
    """POST a body of ``size`` spaces, generated as it is sent, over a raw socket: (status, answer, bytes sent).

    A reader thread takes the answer as soon as it comes, so a server that
    answers early and closes cannot lose it to the reset.
    """
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    head = f"POST {parts.path} HTTP/1.1\r\nHost: {host or parts.netloc}\r\nContent-Type: application/json\r\n" \
           f"{framing}\r\n\r\n"
    received = bytearray()
    answered = threading.Event()

    def read() -> None:
        try:
            while data := sock.recv(65536):
                received.extend(data)
                header, gap, body = bytes(received).partition(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in header.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                if gap and length and len(body) >= length[0]:
                    break
        except OSError:
            pass
        answered.set()
        sock.shutdown(socket.SHUT_RDWR)  # wakes a sender blocked on a server that stopped reading

    threading.Thread(target=read, daemon=True).start()
    piece, sent = b" " * 65536, 0
    try:
        sock.sendall(head.encode())
        while sent < size and not answered.is_set():
            chunk = piece[:size - sent]
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            sent += len(chunk)
        if chunked and not answered.is_set():
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server answered and closed the connection
    assert answered.wait(30), "no answer"
    sock.close()
    header, _, body = bytes(received).partition(b"\r\n\r\n")
    return int(header.split()[1]), json.loads(body), sent


async def hostile_agent(task: dict, base_url: str) -> dict:
    """A foreign Host, a lone surrogate, a 200 MiB body twice (declared, then chunked); then a good turn.

    The gateway serves in this process, so the growth of its peak memory
    while the two bodies arrive is the server's.
    """
    url = f"{base_url}/chat/completions"
    foreign = await asyncio.to_thread(raw_post, url, 10, chunked=False, host="rebound.example.com")
    async with httpx.AsyncClient() as http:
        surrogate = await http.post(url, headers={"content-type": "application/json"},
                                    content=b'{"model": "speaker", "messages": [{"role": "user", "content": "\\ud800"}]}')
    with peak_memory() as memory:
        declared, chunked = await asyncio.gather(asyncio.to_thread(raw_post, url, 200 * MiB, chunked=False),
                                                 asyncio.to_thread(raw_post, url, 200 * MiB, chunked=True))
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    reply = await client.chat.completions.create(model="speaker", messages=[{"role": "user", "content": "target: a"}])
    return {"answer": reply.choices[0].message.content, "declared": declared, "chunked": chunked,
            "foreign": foreign, "surrogate": [surrogate.status_code, surrogate.json()], "growth": memory["growth"]}


def test_huge_bodies_and_foreign_hosts_are_refused_before_reading(chat_model):
    tree = team(chat_model, {"agent": {"function": "tests.test_gateway_isolation:hostile_agent"}})
    [trajectory], experiment = run_episodes(tree, [{"target": "a"}])
    assert trajectory.error is None, trajectory.error
    outcome = trajectory.outcome
    for name in ("declared", "chunked"):
        status, answer, sent = outcome[name]
        assert (status, answer["error"]["code"]) == (413, "request_too_large"), answer
        assert sent < 32 * MiB  # the server stopped reading long before the end (the rest filled socket buffers)
    status, answer, _ = outcome["foreign"]
    assert (status, answer["error"]["code"]) == (400, "invalid_host") and "rebound.example.com" in answer["error"][
        "message"]
    status, answer = outcome["surrogate"]
    assert (status, answer["error"]["param"]) == (400, "messages[0].content")
    assert [t.id for t in trajectory.turns()] == ["speaker#0"]  # the episode went on
    assert outcome["growth"] < 100, f"the server grew by {outcome['growth']:.0f} MB on two 200 MiB bodies"
    experiment.workflow.gateway.stop()


def test_the_host_check_accepts_loopback_and_the_configured_host_only():
    assert [host_name(h) for h in ("localhost:8400", "127.0.0.1", "[::1]:80", "[::1]", "Example.COM:1", "::1")] == [
        "localhost", "127.0.0.1", "::1", "::1", "example.com", "::1"]
    assert allowed_hosts("127.0.0.1") == allowed_hosts("localhost") == frozenset()
    assert allowed_hosts("10.1.2.3") == {"10.1.2.3"} and allowed_hosts("0.0.0.0") is None

    def lookup(key):
        raise GatewayError(404, "no such episode", code="episode_not_found")

    app = build_app(lookup, ["speaker"], token=None, hosts=allowed_hosts("gpu-box.lan"))
    for host, status in [("127.0.0.1:9", 404), ("localhost", 404), ("[::1]:9", 404), ("127.0.0.2", 404),
                         ("gpu-box.lan:8400", 404), ("evil.example", 400), ("localhost.evil.example", 400),
                         ("127.0.0.1.nip.io", 400)]:
        answer = TestClient(app).get("/e/k/v1/models", headers={"host": host})
        assert answer.status_code == status, (host, answer.json())
        assert "error" in answer.json()


# -- unimas serve --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_unimas_serve_caps_max_tokens_and_refuses_foreign_hosts(chat_model, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text((REPO / "examples/gateway/two_agents.yaml").read_text().replace(
        "options: {path: ../models/tiny-chat}", f"options: {{path: {chat_model}}}"))
    server = subprocess.Popen([sys.executable, "-m", "unimas.cli", "serve", str(config)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert " at http://127.0.0.1:" in line, server.stderr.read()
        base_url = line.split(" at ")[1].strip()
        port = urllib.parse.urlsplit(base_url).port
        good = {"model": "speaker", "messages": [{"role": "user", "content": "target: c"}]}
        huge = httpx.post(f"{base_url}/chat/completions", json={**good, "max_tokens": 10 ** 12}, timeout=60)
        assert huge.status_code == 200, huge.text
        assert huge.json()["usage"]["completion_tokens"] == 1  # the role's max_new_tokens
        for host in ("rebound.example.com", f"rebound.example.com:{port}", "0.0.0.0"):
            refused = httpx.get(f"{base_url}/models", headers={"host": host})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_host", host
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
            assert httpx.get(f"{base_url}/models", headers={"host": host}).status_code == 200
        surrogate = httpx.post(f"{base_url}/chat/completions", headers={"content-type": "application/json"},
                               content=json.dumps(good).replace("target: c", "\\udfff").encode())
        assert surrogate.status_code == 400 and surrogate.json()["error"]["param"] == "messages[0].content"
        assert httpx.post(f"{base_url}/chat/completions", json=good, timeout=60).status_code == 200
        assert server.poll() is None  # still serving
    finally:
        server.terminate()
        _, errors = server.communicate(timeout=30)
    assert "Traceback" not in errors
