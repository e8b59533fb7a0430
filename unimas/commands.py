"""What each CLI subcommand does; kept apart from argument parsing.

Each command imports what it needs inside its function: ``unimas plugins``
must not wait for the trainer, the gateway's web stack or the report's
plotting library (and through them torch, verl and matplotlib), and
``unimas validate`` needs only the config checks.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from typing import TYPE_CHECKING

from unimas.contract.registry import KINDS, Registry, build_registry
from unimas.errors import UserError

if TYPE_CHECKING:
    from pathlib import Path

    from unimas.training.experiment import Experiment
    from unimas.training.trainer import Trainer


def _prepare(args: argparse.Namespace) -> Experiment:
    from unimas.config.loading import load_config
    from unimas.preflight.validate import validate

    return validate(load_config(args.config, args.overrides))


def cmd_validate(args: argparse.Namespace) -> int:
    from unimas.preflight.summary import summary
    from unimas.preflight.validate import MAX_EPISODES_PER_STEP

    if args.episodes > MAX_EPISODES_PER_STEP:
        raise UserError(f"{args.episodes} episodes; at most {MAX_EPISODES_PER_STEP} (each is held in memory)",
                        where="--episodes")
    experiment = _prepare(args)
    plan = _cluster_plan(experiment, args.cluster) if args.cluster is not None else None  # no "ok" if it fails
    described = summary(experiment)  # before "ok": the summary reads the tokenizer files, which may be broken
    print(f"ok: {args.config}")
    print(described)
    if args.episodes:
        from unimas.preflight.dry_run import describe_dry_run, dry_run

        print(describe_dry_run(experiment, dry_run(experiment, args.episodes)))
    if plan is not None:
        print(plan)
    return 0


def _cluster_plan(experiment: Experiment, path: Path) -> str:
    """The placement plan on the cluster a file describes (no Ray: the nodes need not exist)."""
    from unimas.runtime.cluster_file import load_cluster
    from unimas.runtime.placement import placement_plan

    totals, nodes = load_cluster(path)
    return f"cluster file {path}:\n" + placement_plan(experiment.config, totals, nodes)


def cmd_plugins(args: argparse.Namespace) -> int:
    from unimas.preflight.algorithm_reference import PARAMS_KEYS

    registry = build_registry()
    for kind in KINDS:
        print(f"{kind}:")
        if args.verbose and kind in PARAMS_KEYS:
            _print_parameters(registry, kind)
        else:
            by_provider = defaultdict(list)
            for entry in registry.entries[kind].values():
                by_provider[entry.provider].append(entry.name)
            for provider, names in sorted(by_provider.items()):
                print(f"  {', '.join(sorted(names))}  ({provider})")
        if kind in VERL_SECTIONS:
            print(_verl_line(registry, kind))
    for line in registry.broken:
        print(f"broken: {line}")
    return 0


VERL_SECTIONS = frozenset({"estimators", "policy_losses"})
"""Kinds whose names also come from verl's own registries (grpo, gae, vanilla ...), no plugin needed."""


def _verl_line(registry: Registry, kind: str) -> str:
    """verl's estimators or policy losses that no plugin shadows, read from the cached catalog, as one line."""
    from unimas.algorithms import verl_catalog

    try:
        names = [name for name in verl_catalog.functions(kind) if not registry.has(kind, name)]
    except UserError as exc:
        return f"  none from verl: {exc}"
    return f"  {', '.join(sorted(names))}  (verl)"


def _print_parameters(registry: Registry, kind: str) -> None:
    """Each plugin of an algorithm kind with the parameters it declares (set under ``PARAMS_KEYS[kind]``)."""
    from unimas.preflight.algorithm_reference import PARAMS_KEYS, parameter_lines

    for name in registry.names(kind):
        print(f"  {name}  ({registry.provider(kind, name)}; {PARAMS_KEYS[kind]})")
        try:
            lines = parameter_lines(kind, name, registry.get(kind, name))
        except UserError as exc:  # annotations that do not evaluate: the plugin's bug, shown in place
            lines = [str(exc)]
        for line in lines:
            print(f"    {line}")


def _dry_run_placement(experiment: Experiment) -> int:
    from unimas.preflight.summary import summary
    from unimas.runtime.placement import placement_plan

    config = experiment.config
    print(summary(experiment))
    if config.runtime.kind != "ray":
        print(placement_plan(config))
        return 0
    import ray

    from unimas.runtime.ray_actors import ray_available

    totals, nodes, started = ray_available(config)
    try:
        print(placement_plan(config, totals, nodes))
    finally:
        if started:
            ray.shutdown()  # stops a local instance we started; only disconnects from a cluster
    return 0


RUN_MARKERS = ("metrics.jsonl", "trajectories", "checkpoints")
"""What a run makes in its directory before anything else: a directory with none of them holds no run."""


def check_run_dir(run_dir: Path) -> None:
    """Refuse a ``--run-dir`` that cannot be a directory, or that holds files but no run: the run writes
    ``config.yaml``, ``metrics.jsonl`` and more there, so ``--run-dir .`` in a project (or ``/``) would
    overwrite the user's own files."""
    where = f"--run-dir {run_dir}"
    try:
        for folder in (run_dir, *run_dir.parents):
            if folder.is_dir():
                break
            if folder.exists() or folder.is_symlink():
                raise UserError("is not a directory" if folder == run_dir else f"{folder} is not a directory, so "
                                "the run directory cannot be made inside it", where=where)
        if not run_dir.is_dir() or any((run_dir / marker).exists() for marker in RUN_MARKERS):
            return
        foreign = sorted(entry.name for entry in run_dir.iterdir())
    except OSError as exc:  # a name too long, a folder we may not read
        raise UserError(f"cannot use it: {exc.strerror or exc}", where=where) from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise UserError(f"holds files but no unimas run ({shown}); a run writes config.yaml, metrics.jsonl, "
                        "trajectories/ and checkpoints/ into its directory, so give a new or empty one (nothing "
                        "was changed)", where=where)


def _check_checkpoint(checkpoint: Path) -> None:
    """Refuse a ``--checkpoint`` that is not a finished one, before a run directory is made or a model loads."""
    from unimas.output.rundir import RunDir

    try:
        complete = RunDir.is_complete(checkpoint)
    except OSError as exc:
        raise UserError(f"cannot read it: {exc.strerror or exc}", where=str(checkpoint)) from None
    if not complete:
        raise UserError("not a complete unimas checkpoint (no COMPLETE marker)", where=str(checkpoint))


def cmd_train(args: argparse.Namespace) -> int:
    from unimas.api import train
    from unimas.config.loading import load_config
    from unimas.output.console import quiet_libraries
    from unimas.output.rundir import RunDir
    from unimas.preflight.validate import validate
    from unimas.training.resume import RunAlreadyComplete

    config = load_config(args.config, args.overrides)
    if args.dry_run:
        return _dry_run_placement(validate(config))
    if args.resume and args.run_dir is None:
        raise UserError("--resume needs --run-dir pointing at the run to continue", where="--resume")
    if args.run_dir is not None:
        check_run_dir(args.run_dir)
    run_dir = args.run_dir or RunDir.new(config.name).root
    try:
        with quiet_libraries(show=getattr(args, "debug", False)):
            train(config, run_dir=run_dir, resume=args.resume)
    except RunAlreadyComplete as complete:
        print(f"{run_dir}: {complete}")
        return 0
    print(f"run directory: {run_dir}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from unimas.output.console import eval_metric_note, quiet_libraries
    from unimas.output.loggers import build_loggers
    from unimas.output.metrics import MetricsWriter
    from unimas.output.rundir import RunDir
    from unimas.process import torch_setup, until_interrupted
    from unimas.runtime.transport import start_transport
    from unimas.training.trainer import Trainer

    experiment = _prepare(args)
    config = experiment.config
    if args.checkpoint is not None:
        _check_checkpoint(args.checkpoint)
    if args.run_dir is not None:
        check_run_dir(args.run_dir)
    run_dir = (RunDir(args.run_dir) if args.run_dir else RunDir.new(f"{config.name}-eval")).create()
    torch_setup(config.trainer.torch_threads, config.trainer.seed)
    logger = build_loggers(config, run_dir, mode="eval")
    try:
        with quiet_libraries(show=getattr(args, "debug", False)):
            transport = start_transport(config, experiment.registry)
            try:
                metrics = asyncio.run(until_interrupted(_evaluate(Trainer(experiment, run_dir, transport),
                                                                    args.checkpoint)))
            finally:
                transport.shutdown()
        logger.log(metrics)
    finally:
        logger.close()
    writer = MetricsWriter(run_dir.metrics)
    writer.write(metrics)
    writer.close()
    for key, value in metrics.items():
        note = eval_metric_note(config, key)
        shown = f"{value:.4f}" if isinstance(value, float) else f"{value}"
        print(f"{key}: {shown}" + (f"  ({note})" if note else ""))
    print(f"run directory: {run_dir.root}")
    return 0


async def _evaluate(trainer: Trainer, checkpoint) -> dict:
    from unimas.config.loading import dump_config

    step = 0
    if checkpoint is not None:
        step = await trainer.load_checkpoint(checkpoint)
    trainer.run_dir.config.write_text(dump_config(trainer.config))
    return {"step": step, **(await trainer.evaluate(step, strict=True))}


def cmd_serve(args: argparse.Namespace) -> int:
    from unimas.gateway.serve import serve
    from unimas.process import torch_setup

    experiment = _prepare(args)
    torch_setup(experiment.config.trainer.torch_threads, experiment.config.trainer.seed)
    asyncio.run(serve(experiment.config, experiment.registry, args.checkpoint, host=args.host, port=args.port))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from unimas.report import write_overlay, write_report

    if args.out is not None and not args.out.parent.is_dir():
        raise UserError("its folder does not exist", where=f"--out {args.out}")
    if len(args.run_dirs) == 1:
        path = write_report(args.run_dirs[0], args.out)
    else:
        path = write_overlay(args.run_dirs, args.out)
    print(f"report: {path}")
    return 0


def cmd_warmstart(args: argparse.Namespace) -> int:
    """``unimas warmstart``: :func:`unimas.training.warm_start.warm_start` on the config and the pair files."""
    from unimas.training.warm_start import warm_start

    config = _prepare(args).config  # the whole config checked, as `unimas validate` does, before any model loads
    warm_start(config, args.data, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
               eval_data=args.eval_data, target=args.target, eval_every=args.eval_every,
               log=lambda line: print(line, flush=True))
    return 0
