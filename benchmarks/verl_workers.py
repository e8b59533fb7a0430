"""Two verl worker groups updating one after the other vs at the same time: `python benchmarks/verl_workers.py`.

Two model groups with ``workers: ray`` (one rank each, a random-init Qwen2 of
``--hidden`` x ``--layers``) receive the same batch of turns. The in-process
transport runs a worker group's calls on a thread of its own
(``ModelGroup.waits_on_workers``), so ``asyncio.gather`` of both updates lets
the two ranks (separate processes) train at the same time. The sequential
variant awaits one update, then the other, through the same transport.

Rounds interleave the variants (sequential, together, together, sequential,
...). The table gives the median wall time of one round of two updates per
variant and the per-pair ratio together / sequential (median, min-max). On a
machine with at least two free cores the ideal ratio is 0.5; each update also
includes the weight sync and its check, which run in the group's process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unimas.config.loading import config_from_dict  # noqa: E402
from unimas.groups.base import TrainTurn  # noqa: E402
from unimas.runtime.local import LocalTransport  # noqa: E402
from unimas.contract.registry import build_registry  # noqa: E402

GROUPS = ("alpha", "beta")


def experiment(hidden: int, layers: int) -> dict:
    tiny = {"architecture": "qwen2", "alphabet": "SL:abcdefgh", "hidden_size": hidden, "num_layers": layers,
            "num_heads": 4, "max_positions": 64}
    group = {"backend": "verl", "options": {"tiny": tiny, "workers": "ray", "world_size": 1},
             "optim": {"lr": 1e-4}}
    return {
        "name": "verl_workers_bench", "models": {name: dict(group) for name in GROUPS},
        "roles": {"speaker": {"model": "alpha", "template": "S:{target}"},
                  "listener": {"model": "beta", "template": "L:{message}"}},
        "workflow": {"name": "signalling"}, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "group_size": 4}, "trainer": {"steps": 1000, "seed": 0},
    }


def turns(rows: int) -> list[TrainTurn]:
    return [TrainTurn([4 + i % 8, 6, 7, 5], [8 + i % 4, 9, 10, 11, 12, 13], [], 1.0 if i % 2 else -1.0)
            for i in range(rows)]


async def one_round(transport: LocalTransport, batch: list[TrainTurn], together: bool) -> float:
    start = time.perf_counter()
    if together:
        await asyncio.gather(*(transport.update(name, batch) for name in GROUPS))
    else:
        for name in GROUPS:
            await transport.update(name, batch)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=64, help="turns per update")
    parser.add_argument("--pairs", type=int, default=4, help="(sequential, together) pairs, interleaved")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one pair (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.rows, args.pairs = 32, 1, 8, 1
    transport = LocalTransport.start(config_from_dict(experiment(args.hidden, args.layers)), build_registry())
    batch = turns(args.rows)
    try:
        asyncio.run(one_round(transport, batch, together=True))  # warm-up: first updates, first syncs
        times: dict[bool, list[float]] = {False: [], True: []}
        for pair in range(args.pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)
            for together in order:
                times[together].append(asyncio.run(one_round(transport, batch, together)))
    finally:
        transport.shutdown()
    ratios = [t / s for t, s in zip(times[True], times[False])]
    result = {"hidden": args.hidden, "layers": args.layers, "rows": args.rows, "pairs": args.pairs,
              "sequential_s": statistics.median(times[False]), "together_s": statistics.median(times[True]),
              "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    print("| variant | median s per round (2 updates) |\n|---|---|")
    print(f"| one after the other | {result['sequential_s']:.3f} |\n| together | {result['together_s']:.3f} |")
    print(f"together / sequential: {result['ratio_median']:.2f} (min {result['ratio_min']:.2f}, "
          f"max {result['ratio_max']:.2f})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
