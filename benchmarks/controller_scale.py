"""How much does the controller cost per turn, and how many turns/s can it route?

The model is replaced by a zero-latency stand-in — a benchmark fixture, not a
backend: a transport whose ``generate`` returns canned ``GenResult``s. Under
``local`` it is called in-process; under ``ray`` it lives in two Ray actors
(one per model group) behind the real ``RayTransport``, so serialisation and
the actor round trip are real. Everything else is the production path:
``Controller.run`` -> ``EpisodeContext.act`` -> ``Router`` (micro-batching)
-> transport, with a two-role, two-group workflow (speaker -> group a,
listener -> group b), i.e. the signalling game's shape.

Columns: ``wall µs/turn`` is elapsed time per turn (for local, all of it is
controller overhead; for ray it includes the actor round trips);
``controller CPU µs/turn`` is the controller process's CPU time per turn
(``time.process_time``: for ray it includes Ray's driver-side threads).
``vs local`` divides ray turns/s by local turns/s at the same concurrency,
measured in this same invocation.

Memory per in-flight episode, in the controller process: ``tracemalloc``
bytes held once every episode is waiting on a model, over the number of
episodes; and the RSS growth of the process over the same moment (no
tracemalloc), per episode. For ray the episodes wait on the actors, so the
controller's side of each pending call (object refs, Ray's driver state)
is counted too.

Under the local table, one line gives the floor any asyncio controller pays: the same shape (workers at
the largest local concurrency, one future per turn, resolved a batch at a time) with nothing of unimas in
it, so the rest of the controller's CPU per turn is unimas's own bookkeeping.

``--no-gc`` turns Python's cyclic garbage collector off during each timed run:
with it the per-turn cost is flat from 1 to 40 000 concurrent episodes, which
shows that the growth with concurrency seen with the collector on is the
collector's (more live objects survive more young-generation passes), not an
algorithmic cost of the controller.

    python benchmarks/controller_scale.py                 # the table in docs/runtime.md (~3 min on 2 cores)
    python benchmarks/controller_scale.py --smoke         # seconds: same code, tiny sizes
    python benchmarks/controller_scale.py --concurrency 1,64,1024,10000 --local-extra 40000 --runtimes local --no-gc
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass

from unimas.config.schema import GenerationConfig, RoleConfig
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.groups.base import GenRequest, GenResult

GROUPS = ("a", "b")
ROLES = {
    "speaker": RoleConfig(model="a", template="S:{target}",
                          generation=GenerationConfig(max_new_tokens=1, require_eos=False)),
    "listener": RoleConfig(model="b", template="L:{message}",
                           generation=GenerationConfig(max_new_tokens=1, require_eos=False)),
}
TURNS_PER_EPISODE = 2
MAX_BATCH_SIZE, MAX_WAIT_S = 256, 0.005  # RuntimeConfig defaults


def canned(requests: list[GenRequest]) -> list[GenResult]:
    """What a one-token model would send back: distinct objects, realistic sizes."""
    return [GenResult(text="b", prompt_ids=[3, 4, 5], response_ids=[7], logprobs=[-2.0794], finished=True)
            for _ in requests]


async def workflow(ctx, task):
    message = await ctx.act("speaker")
    guess = await ctx.act("listener", message=message)
    return {"answer": guess.parsed}


class CannedTransport:
    """Zero-latency in-process stand-in for model groups (router benchmark fixture)."""

    def __init__(self, probe=None):
        self.probe = probe

    async def generate(self, group: str, requests: list[GenRequest]) -> list[GenResult]:
        if self.probe is not None:
            self.probe()
        return canned(requests)


class Probed:
    """A transport that calls ``probe`` before every batch: reads memory while every episode waits."""

    def __init__(self, inner, probe):
        self.inner, self.probe = inner, probe

    async def generate(self, group: str, requests: list[GenRequest]) -> list[GenResult]:
        self.probe()
        return await self.inner.generate(group, requests)


class CannedGroup:
    """The same stand-in as a Ray actor: ``RayTransport`` calls its ``generate``."""

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return canned(requests)


@dataclass
class Row:
    runtime: str
    concurrency: int
    turns: int
    wall_s: float
    cpu_s: float
    batches: int

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall_s


def specs(count: int) -> list[EpisodeSpec]:
    targets = "abcdefgh"
    return [EpisodeSpec(f"e{i}", f"t{i % 64}", {"target": targets[i % 8], "answer": targets[i % 8]})
            for i in range(count)]


async def _run(transport, episodes: int, concurrency: int) -> tuple[Router, list]:
    router = Router(transport, MAX_BATCH_SIZE, MAX_WAIT_S)
    trajectories = await Controller(workflow, ROLES, router, tools={}, max_concurrent=concurrency).run(specs(episodes))
    return router, trajectories


def measure(runtime: str, transport, concurrency: int, turns: int, repeats: int, no_gc: bool = False) -> Row:
    """Median (by wall time) of ``repeats`` runs after one warm-up (``no_gc``: collector off while timed)."""
    episodes = max(concurrency, turns // TURNS_PER_EPISODE)
    asyncio.run(_run(transport, min(episodes, 2 * concurrency), concurrency))  # warm-up
    rows = []
    for _ in range(repeats):
        gc.collect()
        if no_gc:
            gc.disable()
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            router, trajectories = asyncio.run(_run(transport, episodes, concurrency))
        finally:
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            gc.enable()
        failed = [t.error for t in trajectories if t.failed]
        if failed:
            raise RuntimeError(f"{len(failed)} episodes failed, first: {failed[0]}")
        done = sum(len(t.turns()) for t in trajectories)
        rows.append(Row(runtime, concurrency, done, wall, cpu, len(router.batches)))
    return sorted(rows, key=lambda r: r.wall_s)[len(rows) // 2]


async def _bare_asyncio(episodes: int, concurrency: int) -> None:
    """The same shape with nothing of unimas: ``concurrency`` worker tasks run the episodes, each turn awaits
    one future, and one server task resolves them a batch at a time. What any asyncio controller pays per
    turn, whatever it records."""
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future] = []
    wake = asyncio.Event()

    async def episode() -> None:
        for _ in range(TURNS_PER_EPISODE):
            future = loop.create_future()
            waiting.append(future)
            wake.set()
            await future

    async def server() -> None:
        while True:
            await wake.wait()
            wake.clear()
            await asyncio.sleep(0)  # let the batch fill, as the router's flush does
            batch = waiting[:]
            waiting.clear()
            for future in batch:
                future.set_result(None)

    serving = asyncio.ensure_future(server())
    left = iter(range(episodes))

    async def worker() -> None:  # as the controller runs episodes: a fixed set of workers takes the next one
        for _ in left:
            await episode()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    serving.cancel()


def asyncio_floor(concurrency: int, turns: int, repeats: int) -> float:
    """CPU µs per turn of :func:`_bare_asyncio` (median of ``repeats`` after a warm-up)."""
    episodes = max(concurrency, turns // TURNS_PER_EPISODE)
    asyncio.run(_bare_asyncio(min(episodes, 2 * concurrency), concurrency))
    samples = []
    for _ in range(repeats):
        cpu = time.process_time()
        asyncio.run(_bare_asyncio(episodes, concurrency))
        samples.append(1e6 * (time.process_time() - cpu) / (episodes * TURNS_PER_EPISODE))
    return sorted(samples)[len(samples) // 2]


def memory_per_episode(episodes: int, transport) -> tuple[float, float]:
    """(tracemalloc bytes, RSS bytes) per in-flight episode in this (the controller) process."""
    import psutil

    process = psutil.Process()

    def peak_of(reading):
        peak = [0]

        def probe():
            peak[0] = max(peak[0], reading())
        return peak, probe

    # RSS first, in a process that has not run episodes yet (freed memory is reused, not returned)
    gc.collect()
    base = process.memory_info().rss
    peak, probe = peak_of(lambda: process.memory_info().rss)
    asyncio.run(_run(Probed(transport, probe), episodes, episodes))
    rss = (peak[0] - base) / episodes

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    peak, probe = peak_of(lambda: tracemalloc.get_traced_memory()[0])
    asyncio.run(_run(Probed(transport, probe), episodes, episodes))
    tracemalloc.stop()
    traced = (peak[0] - base) / episodes
    return traced, rss


def probe_memory(runtime: str, episodes: int) -> list[float]:
    if runtime == "local":
        return list(memory_per_episode(episodes, CannedTransport()))
    transport, started = ray_transport()
    try:
        return list(memory_per_episode(episodes, transport))
    finally:
        transport.shutdown()
        if started:
            import ray

            ray.shutdown()


def memory_in_fresh_process(runtime: str, episodes: int) -> tuple[float, float]:
    """The memory probe in a process of its own: RSS growth is only meaningful before memory was freed for reuse."""
    out = subprocess.run([sys.executable, __file__, "--memory-probe", runtime, "--memory-episodes", str(episodes)],
                         check=True, capture_output=True, text=True).stdout
    traced, rss = json.loads(out.strip().splitlines()[-1])
    return traced, rss


def ray_transport():
    import ray

    from unimas.config.schema import RuntimeConfig
    from unimas.runtime.ray_actors import RayTransport, connect

    started = connect(RuntimeConfig(kind="ray"), cpus_needed=len(GROUPS))
    actor = ray.remote(num_cpus=1, max_concurrency=1)(CannedGroup)
    transport = RayTransport({g: actor.remote() for g in GROUPS})
    ray.get([transport.actors[g].generate.remote([]) for g in GROUPS])  # actors up before timing
    return transport, started


def table(rows: list[Row]) -> str:
    local = {r.concurrency: r.turns_per_s for r in rows if r.runtime == "local"}
    lines = ["| runtime | concurrent episodes | turns | wall s | turns/s | wall µs/turn | controller CPU µs/turn "
             "| mean batch | vs local |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        compare = r.runtime != "local" and r.concurrency in local
        ratio = f"{r.turns_per_s / local[r.concurrency]:.2f}x" if compare else "—"
        lines.append(f"| {r.runtime} | {r.concurrency} | {r.turns} | {r.wall_s:.2f} | {r.turns_per_s:,.0f} | "
                     f"{1e6 * r.wall_s / r.turns:.1f} | {1e6 * r.cpu_s / r.turns:.1f} | "
                     f"{r.turns / r.batches:.1f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,64,1024,10000", help="concurrent episodes, comma separated")
    parser.add_argument("--local-extra", default="", help="extra concurrency levels for local only")
    parser.add_argument("--turns", type=int, default=20000, help="turns per measurement (2 per episode)")
    parser.add_argument("--memory-episodes", type=int, default=10000, help="in-flight episodes for the memory probe")
    parser.add_argument("--no-gc", action="store_true", help="Python's garbage collector off during timed runs")
    parser.add_argument("--memory-probe", choices=("local", "ray"), help=argparse.SUPPRESS)
    parser.add_argument("--runtimes", default="local,ray")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row; the median is reported")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: seconds, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.concurrency, args.local_extra, args.turns, args.memory_episodes, args.repeats = "1,8", "64", 200, 256, 1
    levels = [int(x) for x in args.concurrency.split(",") if x]
    extra = [int(x) for x in args.local_extra.split(",") if x]
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]

    print(f"# controller scale: python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"max_batch_size {MAX_BATCH_SIZE}, {args.turns} turns per row, median of {args.repeats}\n", flush=True)
    if args.memory_probe:  # the child process of memory_in_fresh_process
        print(json.dumps(probe_memory(args.memory_probe, args.memory_episodes)))
        return 0
    memory = {runtime: memory_in_fresh_process(runtime, args.memory_episodes)
              for runtime in runtimes if args.memory_episodes}
    rows: list[Row] = []
    if "local" in runtimes:
        for level in levels + extra:
            rows.append(measure("local", CannedTransport(), level, max(args.turns, TURNS_PER_EPISODE * level),
                                args.repeats, args.no_gc))
    if "ray" in runtimes:
        transport, started = ray_transport()
        try:
            for level in levels:
                rows.append(measure("ray", transport, level, max(args.turns, TURNS_PER_EPISODE * level),
                                    args.repeats, args.no_gc))
        finally:
            transport.shutdown()
            if started:
                import ray

                ray.shutdown()
    print(table(rows))
    if "local" in runtimes:
        level = max(levels + extra)
        print(f"\nbare asyncio at {level} concurrent episodes (a future per turn, resolved a batch at a time; "
              f"nothing of unimas): {asyncio_floor(level, args.turns, args.repeats):.1f} CPU µs/turn")
    if memory:
        print("\n| runtime | in-flight episodes | tracemalloc bytes/episode | RSS growth bytes/episode |")
        print("|---|---:|---:|---:|")
        for runtime, (traced, rss) in memory.items():
            print(f"| {runtime} | {args.memory_episodes} | {traced:,.0f} | {rss:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
