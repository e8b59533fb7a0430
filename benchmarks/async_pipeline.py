"""Asynchronous pipeline vs the synchronous loop: `python benchmarks/async_pipeline.py`.

Two CPU tasks: the 2-role signalling game (``quickstart``: speaker and
listener on one shared tiny model) and the 3-role relay of
``benchmarks/overhead.py`` (speaker -> relay -> listener, one model each).
Each runs ``--steps`` training steps with ``algorithm.max_staleness`` 0 (the
synchronous loop), 1 and 2, and ``--process-staleness`` (default 1) with
``models.<g>.options.rollout_process: true`` on every group (sampling in a
child process per group, ``unimas/groups/torch/rollout_replica.py``), from
the same seed, so every variant samples the same number of episodes (equal
sampled tokens up to response lengths). ``--ray-staleness`` (off unless
given) adds runs under ``runtime: ray`` with a rollout process per group:
each group's update then runs in its own actor process, the rollout
processes are the actors' children, and this process keeps only the
controller; their ratio is against the same synchronous in-process loop
(CPU is not counted for them: it is spent in the actors).

Throughput is trained tokens per second of wall time over the steps (sum of
``group/<g>/tokens`` / elapsed, the pipeline's warm-up included). Beside its
ratio stands the ratio of steps per second (sync run time / async run time):
the variants take the same steps and episodes, but where answers can end
early their lengths drift apart as the policies do, and tokens/s would count
an async run's longer answers as speed. Final
reward is the mean ``reward/mean`` of the last quarter of the steps.
CPU s per 1000 trained tokens (this process, all threads, plus its rollout
processes, whose share is shown apart) shows whether the pipeline adds work
and how much of it a rollout process takes off this interpreter; "overlap
bound" = (rollout + update) / max(rollout, update) of the synchronous run
(``time/rollout_s``, ``time/update_s`` summed over its steps), the speed-up a
perfect overlap could give on otherwise idle cores (an estimate, not a
measurement). A rollout process's start-up is left out of the timed steps.

Repetitions interleave the variants (0 1 2, then 2 1 0, ...), each
repetition with its own seed; the table gives medians over repetitions, the
per-repetition ratio async / sync (median, min-max) and the final reward's
mean ± std over seeds (the seed noise the async reward is compared with).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    Phases,
    build_unimas,
    collector_as_in_training,
    machine_line,
    markdown_table,
    median,
    quiet_environment,
    setup_torch,
    warm_verl,
)
from benchmarks.overhead import relay_config  # noqa: E402

TASKS = ("2-role", "3-role")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: for the test suite")
    p.add_argument("--steps", type=int, default=40, help="training steps per run")
    p.add_argument("--repeats", type=int, default=3, help="runs per variant (seeds 0..repeats-1), interleaved")
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--process-staleness", type=int, nargs="*", default=[1],
                   help="max_staleness values also run with a rollout process per group (none: leave out)")
    p.add_argument("--ray-staleness", type=int, nargs="*", default=[],
                   help="max_staleness values also run under runtime: ray, a rollout process per group")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=4, help="3-role relay: tokens per turn")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the pipeline adds Python threads)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.repeats, args.tasks_per_step, args.group, args.hidden = 3, 1, 2, 2, 32
    return args


def variants(args: argparse.Namespace) -> list[tuple[int, bool, bool]]:
    """(max_staleness, rollout process, on Ray) triples, in run order."""
    return ([(s, False, False) for s in args.staleness] + [(s, True, False) for s in args.process_staleness]
            + [(s, True, True) for s in args.ray_staleness])


def variant_of(result: dict) -> tuple[int, bool, bool]:
    return result["staleness"], result["process"], result.get("ray", False)


def variant_name(staleness: int, process: bool, on_ray: bool = False) -> str:
    return f"{staleness} + process" + (", ray" if on_ray else "") if process else str(staleness)


def task_config(task: str, staleness: int, seed: int, args: argparse.Namespace, process: bool = False,
                on_ray: bool = False) -> dict:
    if task == "3-role":
        tree = relay_config("separate", argparse.Namespace(**{**vars(args), "tasks": args.tasks_per_step,
                                                             "kl": 0.0, "heads": 4}), seed)
    else:
        tiny = {"architecture": "qwen2", "alphabet": "SL:abcdefgh01234567", "hidden_size": args.hidden,
                "num_layers": args.layers, "num_heads": 4, "init_std": 0.1, "tie_embeddings": False}
        gen = {"max_new_tokens": 1, "temperature": 1.0, "require_eos": False}
        tree = {
            "name": "bench-async-signalling",
            "models": {"shared": {"options": {"tiny": tiny}, "optim": {"lr": 0.001}}},
            "roles": {"speaker": {"model": "shared", "template": "S:{target}", "generation": gen},
                      "listener": {"model": "shared", "template": "L:{message}", "generation": gen}},
            "workflow": {"name": "signalling"},
            "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
            "rewards": [{"name": "exact_match", "level": "trajectory"}],
            "algorithm": {"group_size": args.group, "entropy_coef": 0.03},
            "trainer": {"seed": seed, "tasks_per_step": args.tasks_per_step, "torch_threads": args.threads},
            "logging": {"console": False, "report": False},
        }
    tree["algorithm"] = {**tree["algorithm"], "max_staleness": staleness}
    tree["trainer"] = {**tree["trainer"], "steps": args.steps, "sample_trajectories": 0}
    if process:
        for model in tree["models"].values():
            model["options"] = {**model["options"], "rollout_process": True}
    if on_ray:
        tree["runtime"] = {**tree.get("runtime", {}), "kind": "ray"}
    return tree


def one_run(task: str, staleness: int, seed: int, args: argparse.Namespace, root: Path, process: bool = False,
            on_ray: bool = False) -> dict:
    name = variant_name(staleness, process, on_ray).replace(" + ", "p").replace(", ", "-")
    trainer, transport = build_unimas(task_config(task, staleness, seed, args, process, on_ray),
                                      root / f"{task}-{name}-{seed}", Phases())

    async def steps() -> list[dict]:
        records = []
        try:
            for step in range(args.steps):
                records.append(await trainer.train_step(step))
        finally:
            await trainer.pipeline.close()
        return records

    replicas = [] if on_ray else replicas_of(transport)
    for replica in replicas:  # their start-up (imports, model build) is not part of the timed steps
        replica.generator_state()
    if on_ray:  # the same for the actors' replicas: saving a group waits for its replica's generator state
        async def warm() -> None:
            for group in sorted(transport.inner.actors):
                await transport.inner.save(group, root / f"warm-{name}-{seed}" / group)
        asyncio.run(warm())
    started, cpu, child_cpu = time.perf_counter(), time.process_time(), sum(map(cpu_seconds, replicas))
    with collector_as_in_training():
        records = asyncio.run(steps())
    elapsed = time.perf_counter() - started
    cpu, child_cpu = time.process_time() - cpu, sum(map(cpu_seconds, replicas)) - child_cpu
    transport.shutdown()
    tokens = sum(v for r in records for k, v in r.items() if k.startswith("group/") and k.endswith("/tokens"))
    tail = records[-max(1, len(records) // 4):]
    rollout, update = (sum(r[f"time/{phase}_s"] for r in records) for phase in ("rollout", "update"))
    syncs = [v for r in records for k, v in r.items() if k.endswith("/weight_sync_s")]
    waits = [v for r in records for k, v in r.items() if k.endswith("/weight_sync_wait_s")]
    return {"task": task, "staleness": staleness, "process": process, "ray": on_ray, "seed": seed,
            "elapsed_s": elapsed,
            "tokens": tokens, "rollout_s": rollout, "update_s": update,
            "weight_sync_ms": 1000 * statistics.fmean(syncs) if syncs else None,
            "weight_sync_wait_ms": 1000 * statistics.fmean(waits) if waits else None,
            "cpu_s_per_ktoken": None if on_ray else 1000 * (cpu + child_cpu) / tokens,
            "replica_cpu_s_per_ktoken": None if on_ray else 1000 * child_cpu / tokens,
            "overlap_bound": (rollout + update) / max(rollout, update),
            "tokens_per_s": tokens / elapsed, "final_reward": statistics.fmean(r["reward/mean"] for r in tail),
            "staleness_mean": statistics.fmean(v for r in records for k, v in r.items()
                                               if k.endswith("/staleness_mean"))}


def replicas_of(transport) -> list:
    """The rollout replicas of the run's groups (``options.rollout_process``)."""
    samplers = [getattr(g, "sampler", None) for g in transport.inner.groups.values()]
    return [sampler.replica for sampler in samplers if hasattr(sampler, "replica")]


def cpu_seconds(replica) -> float:
    """User + system CPU seconds a replica's process has used so far (``/proc/<pid>/stat``, Linux)."""
    fields = Path(f"/proc/{replica.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(args: argparse.Namespace) -> list[dict]:
    quiet_environment(args.threads)
    setup_torch(args.threads)
    warm_verl()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.repeats):
            order = variants(args) if seed % 2 == 0 else variants(args)[::-1]
            for task in args.tasks:
                for staleness, process, on_ray in order:
                    results.append(one_run(task, staleness, seed, args, Path(tmp), process, on_ray))
                    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def report(args: argparse.Namespace, results: list[dict]) -> str:
    lines = [f"### Asynchronous pipeline vs synchronous loop — {args.steps} steps, "
             f"{args.tasks_per_step * args.group} episodes per step",
             "",
             f"tiny Qwen2 h{args.hidden} L{args.layers}, {args.repeats} seed(s), variants interleaved. "
             f"{machine_line(args.threads)}.",
             "",
             "tokens/s = trained tokens / wall time of the run; ratio = async / sync of the same seed "
             "(median, min-max); steps/s vs sync = sync run time / async run time of the same seed (both runs "
             "take the same steps and episodes; unlike tokens/s, longer answers in one run do not count as "
             "speed); final reward = mean reward/mean over the last quarter of the steps (mean ± std "
             "over seeds); CPU s counts this process and its rollout processes (their start-up, excluded from the "
             "timed steps, left out); weight sync = "
             "mean group/<g>/weight_sync_s (the copy), in brackets weight_sync_wait_s (the update waiting for a "
             "batch in flight); overlap bound = (rollout + update) / max(rollout, update) of the "
             "synchronous run.",
             ""]
    rows = []
    for task in args.tasks:
        runs = {v: [r for r in results if r["task"] == task and variant_of(r) == v] for v in variants(args)}
        sync = {r["seed"]: r for r in runs.get((0, False, False), [])}
        for (staleness, process, on_ray), mine in runs.items():
            ratios = [r["tokens_per_s"] / sync[r["seed"]]["tokens_per_s"] for r in mine if r["seed"] in sync]
            step_ratios = [sync[r["seed"]]["elapsed_s"] / r["elapsed_s"] for r in mine if r["seed"] in sync]
            rewards = [r["final_reward"] for r in mine]
            spread = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
            syncs = [(r["weight_sync_ms"], r["weight_sync_wait_ms"]) for r in mine if r["weight_sync_ms"] is not None]
            cpu = [r["cpu_s_per_ktoken"] for r in mine if r["cpu_s_per_ktoken"] is not None]
            replica_cpu = [r["replica_cpu_s_per_ktoken"] for r in mine if r["replica_cpu_s_per_ktoken"] is not None]
            rows.append([task, variant_name(staleness, process, on_ray), median(r["elapsed_s"] for r in mine),
                         median(r["tokens_per_s"] for r in mine),
                         spread_of(ratios), spread_of(step_ratios),
                         f"{statistics.fmean(rewards):.3f} ± {spread:.3f}",
                         median(r["staleness_mean"] for r in mine), median(cpu) if cpu else "-",
                         median(replica_cpu) if process and replica_cpu else "-",
                         f"{median(c for c, _ in syncs):.2f} ({median(w for _, w in syncs):.2f})" if syncs else "-",
                         f"{median(r['overlap_bound'] for r in mine):.2f}×" if not (staleness or process) else "-"])
    lines.append(markdown_table(["task", "max_staleness", "run s", "trained tokens/s", "ratio vs sync",
                                 "steps/s vs sync",
                                 "final reward", "mean staleness", "CPU s / 1k tokens", "of which replicas",
                                 "weight sync ms (wait)",
                                 "overlap bound"], rows))
    return "\n".join(lines)


def spread_of(ratios: list[float]) -> str:
    """``median× (min-max)`` of per-seed ratios, or ``-`` when there are none."""
    return f"{median(ratios):.2f}× ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"


def main(argv=None) -> int:
    args = parse_args(argv)
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(report(args, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
