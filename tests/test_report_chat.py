"""The trajectory viewer shows a turn's chat: its conversation, the rendered prompt and the chat flags.

A hand-written run directory holds one episode whose turns carry chat fields (``messages``,
``input``, ``prompt`` with template markers, ``continued``, ``truncated``), some of them hostile
or of the wrong type. The report must carry them into the page's data as text, cut like other
texts, and drop malformed messages without breaking the page.
"""

from __future__ import annotations

import json
import re
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest

from unimas.report import write_report
from unimas.report.data import MAX_MESSAGES, MAX_TEXT

CHROMIUM = Path("/usr/bin/chromium")
HOSTILE = "</script><!--<script>document.documentElement.dataset.pwned='chat'</script>"
PROMPT = ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
          "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n" + HOSTILE + "<|im_end|>\n<|im_start|>assistant\n")
LONG = "y" * (MAX_TEXT + 500)


def _turn(node_id: str, role: str, **chat) -> dict:
    return {"kind": "turn", "id": node_id, "role": role, "model_group": "policy", "text": "4",
            "prompt_ids": [1, 2, 3], "response_ids": [4], "logprobs": [-0.1], "reward": 1.0, "advantage": 0.5,
            "started": 0.0, "ended": 1.0, **chat}


def _episode() -> dict:
    nodes = [
        _turn("solver#0", "solver", prompt=PROMPT, input=HOSTILE, continued=True, truncated=True, messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            "not a message",
            {"role": 3, "content": "role is not text"},
            {"role": "user", "content": {"not": "text"}},
            {"role": "user"},
            {"role": "user", "content": HOSTILE + LONG},
        ]),
        # A role with memory: none: no messages, only the input.
        _turn("checker#0", "checker", prompt="<|im_start|>user\ncheck it<|im_end|>\n<|im_start|>assistant\n",
              input="check it", messages=[]),
        # Chat fields of the wrong type everywhere.
        _turn("checker#1", "checker", prompt=["not", "text"], input=7, messages={"role": "user"},
              continued="yes", truncated=1),
        # An old trajectory without any chat fields.
        _turn("checker#2", "checker", prompt="plain prompt"),
        # A long conversation: the first message and the latest ones are kept.
        _turn("solver#1", "solver", prompt="p" * (MAX_TEXT * 3) + "<|im_start|>assistant\n",
              messages=[{"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(60)]),
    ]
    ids = [n["id"] for n in nodes]
    return {"episode_id": "ep0", "task_id": "t0", "task": {"id": "q1", "question": "2+2"},
            "outcome": {"_step": 0}, "rewards": {"exact_match": 1.0}, "error": None, "started": 0.0, "ended": 2.0,
            "nodes": nodes, "edges": [list(pair) for pair in pairwise(ids)]}


@pytest.fixture
def chat_run(tmp_path: Path) -> Path:
    run = tmp_path / "chat-run"
    (run / "trajectories").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/accuracy": 0.5}) + "\n"
        + json.dumps({"step": 1, "reward/mean": 1.0, "reward/exact_match": 1.0, "role/solver/loss": 0.1}) + "\n")
    (run / "config.yaml").write_text(
        "name: chat-run\n"
        "models:\n  policy: {backend: torch}\n"
        "roles:\n  solver: {model: policy, memory: all}\n  checker: {model: policy, memory: none}\n"
        "rewards:\n  - {name: exact_match, level: trajectory}\n"
        "trainer: {steps: 2}\n")
    (run / "trajectories" / "train.jsonl").write_text(json.dumps(_episode()) + "\n")
    return run


def _data(page: str) -> dict:
    block = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.DOTALL).group(1)
    assert "<" not in block and ">" not in block and "&" not in block
    return json.loads(block)


def test_turn_nodes_carry_the_conversation_prompt_and_flags(chat_run, capsys):
    page = write_report(chat_run).read_text(encoding="utf-8")
    assert "warning:" not in capsys.readouterr().err
    (run,) = _data(page)["runs"]
    (episode,) = run["episodes"]["train"]
    nodes = {n["id"]: n for n in episode["nodes"]}

    solver = nodes["solver#0"]
    assert [m["role"] for m in solver["messages"]] == ["system", "user", "assistant", "user"]
    assert solver["messages"][:3] == [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "What is 2+2?"},
                                      {"role": "assistant", "content": "4"}]
    last = solver["messages"][-1]["content"]
    assert last.startswith(HOSTILE) and "more characters" in last and len(last) < MAX_TEXT + 100
    assert solver["messages_omitted"] == 0
    assert solver["prompt"] == PROMPT and solver["input"] == HOSTILE
    assert solver["continued"] is True and solver["truncated"] is True
    assert "prompt_ids" not in solver and "logprobs" not in solver

    checker = nodes["checker#0"]
    assert checker["messages"] == [] and checker["input"] == "check it"
    assert checker["prompt"].startswith("<|im_start|>user\n")
    assert checker["continued"] is False and checker["truncated"] is False

    wrong = nodes["checker#1"]
    assert wrong["messages"] == [] and wrong["messages_omitted"] == 0
    assert isinstance(wrong["prompt"], str) and isinstance(wrong["input"], str)
    assert wrong["continued"] is False and wrong["truncated"] is False

    old = nodes["checker#2"]
    assert old["messages"] == [] and old["input"] == "" and old["prompt"] == "plain prompt"

    long = nodes["solver#1"]
    assert len(long["messages"]) == MAX_MESSAGES and long["messages_omitted"] == 60 - MAX_MESSAGES
    assert long["messages"][0]["content"] == "m0" and long["messages"][-1]["content"] == "m59"
    # A long prompt keeps both ends: the tail has the generation marker.
    assert long["prompt"].endswith("<|im_start|>assistant\n") and "characters left out" in long["prompt"]
    assert len(long["prompt"]) < MAX_TEXT + 100

    outside = page.replace(re.search(r'id="report-data">(.*?)</script>', page, re.DOTALL).group(1), "")
    assert outside.count("<script") == 2, "only the data block and the viewer script"


def _details(dom: str, node_id: str) -> str:
    """The node-details entry of one node: from its opening tag up to the next node's."""
    start = dom.find(f'<details data-node-id="{node_id}"')
    assert start >= 0, f"no details for {node_id}"
    end = dom.find("<details data-node-id=", start + 1)
    return dom[start:end if end >= 0 else len(dom)]


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the Debian `chromium` package at /usr/bin/chromium")
def test_viewer_shows_each_roles_conversation_in_headless_chromium(chat_run, tmp_path):
    path = write_report(chat_run)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom"]
    dom = subprocess.run([str(CHROMIUM), *flags, path.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert "data-pwned" not in dom, "model text ran as script"
    assert re.search(r'<svg id="episode-graph"', dom), "the viewer drew no graph"
    part = _details(dom, "solver#0")
    assert re.findall(r'data-message-role="([^"]+)"', part) == ["system", "user", "assistant", "user"]
    assert "conversation (4 messages)" in part
    assert '<span class="badge continued"' in part and '<span class="badge truncated"' in part
    assert "&lt;/script&gt;&lt;!--&lt;script&gt;" in part  # the hostile message, shown as text
    assert "&lt;|im_start|&gt;assistant" in part and "rendered prompt" in part
    checker = _details(dom, "checker#0")
    assert "data-message-role" not in checker and '<pre class="input">check it</pre>' in checker
    assert "badge" not in checker
    assert "earlier messages left out" in dom
