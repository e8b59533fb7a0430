"""Training an unmodified agent program through the gateway, then serving the result with `unimas serve`.

The program is examples/gateway/two_agents.py — the plain `openai` client,
roles chosen by `model=` — run as a subprocess per episode.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from openai import OpenAI
from safetensors.torch import load_file

from unimas.cli import main
from unimas.trajectory import read_jsonl

pytestmark = pytest.mark.slow  # a Python process importing openai per episode: tens of seconds on 2 cores

STEPS = 2  # two updates show the team trained; each step starts 8 agent processes
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(chat_model, tmp_path_factory) -> tuple[Path, Path]:
    """(config, run directory) of a short training run of the two-agent program."""
    work = tmp_path_factory.mktemp("gateway-train")
    config = work / "two_agents.yaml"
    text = (REPO / "examples/gateway/two_agents.yaml").read_text()
    text = text.replace("options: {path: ../models/tiny-chat}", f"options: {{path: {chat_model}}}")
    text = text.replace("command: [python, examples/gateway/two_agents.py]",
                        f"command: [{sys.executable}, {REPO / 'examples/gateway/two_agents.py'}]")
    config.write_text(text)
    run = work / "run"
    settings = [f"trainer.steps={STEPS}", "trainer.tasks_per_step=2", "algorithm.group_size=4",
                "trainer.eval_every=0", "trainer.eval_size=2", "logging.console=false", "logging.report=false",
                "roles.speaker.generation.temperature=1.5", "roles.listener.generation.temperature=1.5"]
    assert main(["train", str(config), "--run-dir", str(run), *[a for s in settings for a in ("--set", s)]]) == 0
    return config, run


@pytest.mark.slow
def test_an_unmodified_two_agent_program_trains_through_the_gateway(trained, chat_model):
    _, run = trained
    trajectories = read_jsonl(run / "trajectories/train.jsonl")
    assert trajectories and not any(t.failed for t in trajectories)
    for trajectory in trajectories:
        turns = trajectory.turns()
        assert [t.role for t in turns] == ["speaker", "listener"]
        assert list(trajectory.graph.edges) == [("speaker#0", "listener#0")]  # the listener read the speaker
        assert turns[1].input == f"message: {turns[0].text}"
        for turn in turns:
            assert turn.prompt_ids and len(turn.response_ids) == len(turn.logprobs) == 1
            assert turn.reward is not None and turn.advantage is not None
    assert any(t.advantage != 0 for trajectory in trajectories for t in trajectory.turns())

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/mean" in r]
    assert len(steps) == STEPS
    for record in steps:
        for role in ("speaker", "listener"):
            assert record[f"role/{role}/turns"] == 8
            assert math.isfinite(record[f"role/{role}/reward_mean"])
        assert math.isfinite(record["group/shared/policy_loss"]) and record["episode/failures"] == 0
    assert any(r["group/shared/grad_norm"] > 0 for r in steps)
    checkpoint = run / f"checkpoints/step_{STEPS:06d}/shared"
    before = load_file(str(chat_model / "model.safetensors"))
    after = load_file(str(next(checkpoint.rglob("*.safetensors"))))
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)  # the team was updated


@pytest.mark.slow
def test_unimas_serve_answers_the_same_program_from_the_checkpoint(trained):
    config, run = trained
    checkpoint = run / f"checkpoints/step_{STEPS:06d}"
    server = subprocess.Popen([sys.executable, "-m", "unimas.cli", "serve", str(config), "--checkpoint",
                               str(checkpoint)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert "serving roles listener, speaker at http://127.0.0.1:" in line, server.stderr.read()
        base_url = line.split(" at ")[1].strip()
        client = OpenAI(base_url=base_url, api_key="unused")
        assert sorted(m.id for m in client.models.list().data) == ["listener", "speaker"]
        reply = client.chat.completions.create(model="speaker", messages=[{"role": "user", "content": "target: c"}],
                                               max_tokens=1, temperature=0)
        assert reply.model == "speaker" and reply.usage.completion_tokens == 1
        assert reply.choices[0].message.content
        program = subprocess.run([sys.executable, "examples/gateway/two_agents.py"], input='{"target": "c"}',
                                 capture_output=True, text=True, timeout=120,
                                 env={"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "unused", "PATH": ""},
                                 cwd=REPO)
        assert program.returncode == 0, program.stderr
        assert set(json.loads(program.stdout)) == {"answer", "message"}
    finally:
        server.terminate()
        server.wait(timeout=30)
