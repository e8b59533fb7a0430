"""What each CLI subcommand does; kept apart from argument parsing."""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict

from unimas.config import dump_config, load_config
from unimas.errors import UserError
from unimas.loggers import build_loggers
from unimas.registry import KINDS, build_registry
from unimas.rundir import RunDir
from unimas.validate import summary, validate


def _prepare(args: argparse.Namespace):
    config = load_config(args.config, args.overrides)
    return validate(config)


def cmd_validate(args: argparse.Namespace) -> int:
    experiment = _prepare(args)
    print(f"ok: {args.config}")
    print(summary(experiment))
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    registry = build_registry()
    for kind in KINDS:
        print(f"{kind}:")
        by_provider = defaultdict(list)
        for entry in registry.entries[kind].values():
            by_provider[entry.provider].append(entry.name)
        for provider, names in sorted(by_provider.items()):
            print(f"  {', '.join(sorted(names))}  ({provider})")
    return 0


def _torch_setup(threads: int, seed: int) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)


def cmd_train(args: argparse.Namespace) -> int:
    from unimas.trainer import Trainer, start_transport

    experiment = _prepare(args)
    config = experiment.config
    if args.dry_run:
        from unimas.placement import placement_plan

        print(summary(experiment))
        if config.runtime.kind != "ray":
            print(placement_plan(config))
            return 0
        import ray

        from unimas.placement import ray_available

        totals, nodes, started = ray_available(config)
        try:
            print(placement_plan(config, totals, nodes))
        finally:
            if started:
                ray.shutdown()  # stops a local instance we started; only disconnects from a cluster
        return 0
    if args.resume and args.run_dir is None:
        raise UserError("--resume needs --run-dir pointing at the run to continue", where="--resume")
    run_dir = RunDir(args.run_dir) if args.run_dir else RunDir.new(config.name)
    if not args.resume and run_dir.metrics.exists() and run_dir.metrics.stat().st_size:
        raise UserError("this run directory already holds a run; pass --resume to continue it or choose a new "
                        "--run-dir (nothing was changed)", where=str(run_dir.root))
    run_dir.create()
    _torch_setup(config.trainer.torch_threads, config.trainer.seed)
    logger = build_loggers(config, run_dir)
    try:
        transport = start_transport(config, experiment)
        try:
            trainer = Trainer(experiment, run_dir, transport, log=logger.log)
            asyncio.run(trainer.run(resume=args.resume))
        finally:
            transport.shutdown()  # also on Ctrl-C: group actors stop, a Ray instance we started stops
    finally:
        logger.close()
    if config.logging.report:
        from unimas.report import write_report

        write_report(run_dir.root)
    print(f"run directory: {run_dir.root}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from unimas.trainer import Trainer, start_transport

    experiment = _prepare(args)
    config = experiment.config
    run_dir = (RunDir(args.run_dir) if args.run_dir else RunDir.new(f"{config.name}-eval")).create()
    _torch_setup(config.trainer.torch_threads, config.trainer.seed)
    logger = build_loggers(config, run_dir, mode="eval")
    try:
        transport = start_transport(config, experiment)
        try:
            trainer = Trainer(experiment, run_dir, transport)
            metrics = asyncio.run(_evaluate(trainer, args.checkpoint))
        finally:
            transport.shutdown()
        logger.log(metrics)
    finally:
        logger.close()
    from unimas.metrics import MetricsWriter

    writer = MetricsWriter(run_dir.metrics)
    writer.write(metrics)
    writer.close()
    for key, value in metrics.items():
        print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    print(f"run directory: {run_dir.root}")
    return 0


async def _evaluate(trainer, checkpoint) -> dict:
    step = 0
    if checkpoint is not None:
        if not (checkpoint / "COMPLETE").exists():
            raise UserError("not a complete unimas checkpoint (no COMPLETE marker)", where=str(checkpoint))
        await asyncio.gather(*(trainer.transport.load(g, checkpoint / g) for g in sorted(trainer.config.models)))
        from unimas.rundir import read_trainer_state

        step = read_trainer_state(checkpoint)["step"]
    trainer.run_dir.config.write_text(dump_config(trainer.config))
    return {"step": step, **(await trainer.evaluate(step))}


def cmd_report(args: argparse.Namespace) -> int:
    from unimas.report import write_report

    if not (args.run_dir / "metrics.jsonl").exists():
        raise UserError("no metrics.jsonl here: is this a unimas run directory?", where=str(args.run_dir))
    path = write_report(args.run_dir)
    print(f"report: {path}")
    return 0
