"""Gateway overhead: the signalling game as a native workflow vs through the gateway, side by side in one process.

Three ways to run the same episodes on the same model group, interleaved so
that machine load hits them alike:
  native    ctx.act (unimas_workflows.signalling)
  function  an async openai-client agent in the trainer's process (workflow.agent.function)
  command   examples/gateway/two_agents.py as a subprocess per episode (workflow.agent.command)
Prints rollout wall time and turns/s per way (median over rounds). From the repository root:
  python -m unimas.testing.tiny_chat examples/models/tiny-chat
  python examples/gateway/overhead.py examples/models/tiny-chat --episodes 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import sys
import time
from pathlib import Path

from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from unimas.config.loading import config_from_dict
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.runtime.transport import start_transport
from unimas.training.experiment import Experiment

HERE = Path(__file__).resolve().parent


AGENT_TLS = ssl.create_default_context()
"""One TLS context for every episode's client: ``AsyncOpenAI()`` built without one loads the CA bundle, 30 ms a
client on the 2-core machine (15 ms a turn of a two-turn episode): the agent's cost, not the gateway's."""


async def signalling_agent(task: dict, base_url: str) -> dict:
    http = DefaultAsyncHttpxClient(verify=AGENT_TLS, trust_env=False)  # trust_env: no proxy for loopback
    async with AsyncOpenAI(base_url=base_url, api_key="unused", http_client=http) as client:
        ask = client.chat.completions.create
        message = (await ask(model="speaker", messages=[{"role": "user", "content": f"target: {task['target']}"}],
                             max_tokens=1)).choices[0].message.content
        guess = (await ask(model="listener", messages=[{"role": "user", "content": f"message: {message}"}],
                           max_tokens=1)).choices[0].message.content
    return {"answer": guess.strip(), "message": message}


def config(model: Path, workflow: dict) -> dict:
    role = {"model": "shared", "generation": {"max_new_tokens": 1, "require_eos": False}}
    return {"models": {"shared": {"options": {"path": str(model)}}},
            "roles": {"speaker": {**role, "template": "target: {target}"},
                      "listener": {**role, "template": "message: {message}"}},
            "workflow": workflow, "data": {"name": "signalling"}, "rewards": [{"name": "exact_match"}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ways = {"native": {"name": "signalling"},
            "function": {"agent": {"function": "overhead:signalling_agent"}},
            "command": {"agent": {"command": [sys.executable, str(HERE / "two_agents.py")]}}}
    experiments = {name: Experiment.resolve(config_from_dict(config(args.model, w))) for name, w in ways.items()}
    first = next(iter(experiments.values())).config
    transport = start_transport(first, experiments["native"].registry)  # one model group for all three
    tasks = [{"target": "abcdefgh"[i % 8], "answer": "abcdefgh"[i % 8]} for i in range(args.episodes)]
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    turns: dict[str, int] = {}
    try:
        for _ in range(args.rounds):
            for name, experiment in experiments.items():
                controller = Controller(experiment.workflow, experiment.config.roles, Router(transport), {})
                specs = [EpisodeSpec(f"e{i}", f"t{i}", task) for i, task in enumerate(tasks)]
                started = time.perf_counter()
                trajectories = asyncio.run(controller.run(specs))
                seconds[name].append(time.perf_counter() - started)
                assert not any(t.failed for t in trajectories), [t.error for t in trajectories if t.failed][:1]
                turns[name] = sum(len(t.turns()) for t in trajectories)
    finally:
        transport.shutdown()
    base = statistics.median(seconds["native"])
    print(f"{'way':<10}{'episodes':>9}{'turns':>7}{'rollout s':>11}{'turns/s':>9}{'x native':>10}")
    for name in ways:
        wall = statistics.median(seconds[name])
        rate = turns[name] / wall
        print(f"{name:<10}{args.episodes:>9}{turns[name]:>7}{wall:>11.2f}{rate:>9.1f}{wall / base:>10.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))  # so that workflow.agent.function can name this file's agent
    main()
