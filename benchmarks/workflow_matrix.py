"""The workflow x mapping x credit matrix at CPU scale: `python benchmarks/workflow_matrix.py`.

Each workflow (evaluator-optimizer, voting, orchestrator-workers on exact-checked
arithmetic; Plan-Path on 4x4 grids; ``examples/wf_*_cpu.yaml``, warm-started by
``examples/workflow_warm_start.py``) is trained under every agent-to-model
mapping and every credit choice, with several seeds, each run until it has
*sampled* the workflow's token budget (the same for every cell of a workflow).

Mappings (only ``models:`` and ``roles.<r>.model/adapter`` change):

* ``shared``: one model group for every role;
* ``separate``: one group per role, each a copy of the warm start;
* ``lora``: one frozen warm-start base with a LoRA adapter per role (rank 8 on
  every linear layer; learning rate ``LORA_LR_SCALE`` times the full-weight one,
  as adapters need).

Credit (only ``rewards:`` and ``algorithm:`` change):

* ``team``: GRPO on the team reward (the final answer / path), grouped per role;
* ``per_role``: AT-GRPO-style: the team reward plus each role's own exactly
  checked contribution (``role_score``: a generator's proposals right, an
  evaluator's verdicts right, a solver's votes right, a worker's partial sums
  right, a valid split and a right combine, a valid plan), GRPO grouped per
  role *and* turn index;
* ``ppo_cc``: PPO (GAE, gamma = lam = 1) on the team reward with one
  centralized critic (a copy of the warm start with a value head) that reads
  the episode so far (MAPPO-style; docs/critic.md); 2 critic warm-up updates.

Every run writes one JSON file (curve, per-role scores, wall time) under the
results directory; finished runs are skipped, so an interrupted matrix resumes
where it stopped. ``--report`` only rebuilds the table (and, with ``--docs``,
the section of docs/results.md and the PNGs) from the files:
``benchmarks/workflow_report.py`` does that part.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, machine_line, quiet_environment  # noqa: E402

WORKFLOWS: dict[str, tuple[str, int]] = {
    # name: example config, sampled-token budget per run: about 16 steps of 8 tasks x G=4 at the warm start,
    # what 108 runs on a shared 2-core machine allow in about 80 minutes
    "evaluator_optimizer": ("examples/wf_evaluator_optimizer_cpu.yaml", 4_500),
    "voting": ("examples/wf_voting_cpu.yaml", 6_000),
    "orchestrator_workers": ("examples/wf_orchestrator_workers_cpu.yaml", 9_000),
    "plan_path": ("examples/wf_plan_path_cpu.yaml", 5_000),
}
MAPPINGS = ("shared", "separate", "lora")
CREDITS = ("team", "per_role", "ppo_cc")
SEEDS = (0, 1, 2)
EVAL_EVERY = 4
EVAL_SIZE = 64
LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"]}
LORA_LR_SCALE = 5.0
CRITIC = {"optim": {"lr": 0.001}, "value_clip": 0.5}
CENTRAL = "central_critic"
DEFAULT_RESULTS = REPO / "benchmarks" / "results" / "workflow_matrix"


def absolute_paths(tree: dict, base: Path) -> None:
    """``init_from`` is relative to the config file; the variant is written elsewhere, so make it absolute."""
    for group in tree["models"].values():
        options = group.get("options", {})
        if "init_from" in options:
            options["init_from"] = str((base / options["init_from"]).resolve())


def with_mapping(tree: dict, mapping: str) -> dict:
    """The config tree with its single shared group ``team`` re-mapped."""
    tree = copy.deepcopy(tree)
    team = tree["models"].pop("team")
    if mapping == "shared":
        tree["models"]["team"] = team
    elif mapping == "separate":
        for role, spec in tree["roles"].items():
            tree["models"][f"{role}_model"] = copy.deepcopy(team)
            spec["model"] = f"{role}_model"
    elif mapping == "lora":
        base = copy.deepcopy(team)
        base["lora"] = dict(LORA)
        base["optim"] = {**base.get("optim", {}), "lr": base.get("optim", {}).get("lr", 0.001) * LORA_LR_SCALE}
        tree["models"]["base"] = base
        for role, spec in tree["roles"].items():
            spec["model"], spec["adapter"] = "base", role
    else:
        raise ValueError(f"unknown mapping {mapping!r}")
    return tree


def with_credit(tree: dict, credit: str, warm_start: dict) -> dict:
    """The config tree with its credit choice; ``warm_start`` is the warm-start group (the critic's backbone)."""
    tree = copy.deepcopy(tree)
    algorithm = tree["algorithm"]
    if credit == "per_role":
        tree["rewards"].append({"name": "role_score", "level": "role", "weight": 1.0})
        algorithm["grouping"] = "role_turn"
    elif credit == "ppo_cc":
        tree["models"][CENTRAL] = {"backend": "torch", "options": copy.deepcopy(warm_start["options"]),
                                   "critic": copy.deepcopy(CRITIC)}
        algorithm.update(estimator="gae", gamma=1.0, lam=1.0, critic_warmup=2, critic="centralized",
                         central_critic=CENTRAL)
    elif credit != "team":
        raise ValueError(f"unknown credit {credit!r}")
    return tree


def variant(workflow: str, mapping: str, credit: str) -> dict:
    """The full config tree of one cell."""
    path = REPO / WORKFLOWS[workflow][0]
    tree = yaml.safe_load(path.read_text())
    absolute_paths(tree, path.parent)
    return with_credit(with_mapping(tree, mapping), credit, tree["models"]["team"])


def warm_start_missing(workflow: str) -> Path | None:
    """The example's warm-start checkpoint when it has not been written yet, else None."""
    path = REPO / WORKFLOWS[workflow][0]
    init_from = yaml.safe_load(path.read_text())["models"]["team"]["options"]["init_from"]
    checkpoint = (path.parent / init_from).resolve()
    return None if checkpoint.exists() else checkpoint


def run_name(workflow: str, mapping: str, credit: str, seed: int) -> str:
    return f"{workflow}__{mapping}__{credit}__s{seed}"


def role_scores(episodes) -> dict[str, float]:
    """Mean of each role's own exactly checked score (``outcome.role_scores``) over the episodes."""
    totals: dict[str, list[float]] = {}
    for episode in episodes:
        for role, value in (episode.outcome.get("role_scores") or {}).items():
            totals.setdefault(role, []).append(float(value))
    return {role: sum(values) / len(values) for role, values in sorted(totals.items())}


def role_tokens(episodes) -> dict[str, float]:
    """Mean response tokens per episode, per role: which role dominates a shared model's updates."""
    totals: dict[str, int] = {}
    for episode in episodes:
        for turn in episode.turns():
            totals[turn.role] = totals.get(turn.role, 0) + len(turn.response_ids)
    return {role: count / max(len(episodes), 1) for role, count in sorted(totals.items())}


async def train_to_budget(trainer, budget: int, eval_every: int, run_dir: Path) -> dict:
    """Train until ``budget`` sampled tokens, evaluating greedily every ``eval_every`` steps and at the end."""
    from unimas.controller.forking import sampled_tokens
    from unimas.trajectory import read_jsonl

    tokens = 0
    run = trainer.controller.run

    async def counted(specs, greedy=False):  # every sampled training episode passes through here
        nonlocal tokens
        episodes = await run(specs, greedy=greedy)
        if not greedy:
            tokens += sampled_tokens(episodes)
        return episodes

    trainer.controller.run = counted
    curve: list[dict] = []

    async def evaluate(step: int) -> None:
        accuracy = (await trainer.evaluate(step))["eval/accuracy"]
        curve.append({"step": step, "tokens": tokens, "accuracy": accuracy})

    await evaluate(0)
    step, last = 0, {}
    while tokens < budget:
        last = await trainer.train_step(step)
        step += 1
        if step % eval_every == 0 or tokens >= budget:
            await evaluate(step)
    evals = read_jsonl(run_dir / "trajectories" / "eval.jsonl")
    by_step: dict[int, list] = {}
    for episode in evals:
        by_step.setdefault(episode.step, []).append(episode)
    for point in curve:
        point["role_scores"] = role_scores(by_step.get(point["step"], []))
    train_rewards = {key.split("/")[1]: value for key, value in last.items()
                     if key.startswith("role/") and key.endswith("/reward_mean")}
    return {"curve": curve, "steps": step, "tokens": tokens, "train_role_reward": train_rewards,
            "role_tokens": role_tokens(by_step.get(0, [])),
            "errors_at_end": sum(e.error is not None for e in by_step.get(step, []))}


def run_one(workflow: str, mapping: str, credit: str, seed: int, budget: int, eval_every: int, eval_size: int,
            extra: list[str]) -> dict:
    """One cell and seed, in this process; returns the result record written to its JSON file."""
    from unimas.config.loading import load_config
    from unimas.output.rundir import RunDir
    from unimas.process import torch_setup
    from unimas.runtime.transport import start_transport
    from unimas.training.experiment import Experiment
    from unimas.training.trainer import Trainer

    tree = variant(workflow, mapping, credit)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="workflow-matrix-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(tree, sort_keys=False))
        overrides = [f"trainer.seed={seed}", "trainer.steps=100000", "trainer.sample_trajectories=0",
                     "trainer.stop_at_accuracy=null", f"trainer.eval_size={eval_size}", *extra]
        config = load_config(path, overrides)
        experiment = Experiment.resolve(config)
        torch_setup(config.trainer.torch_threads, seed)
        run_dir = RunDir(Path(tmp) / "run").create()
        transport = start_transport(config, experiment.registry)
        try:
            trainer = Trainer(experiment, run_dir, transport)
            record = asyncio.run(train_to_budget(trainer, budget, eval_every, Path(tmp) / "run"))
        finally:
            transport.shutdown()
    record.update(workflow=workflow, mapping=mapping, credit=credit, seed=seed, budget=budget,
                  eval_every=eval_every, eval_size=eval_size, wall_s=time.perf_counter() - started,
                  overrides=extra)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="one seed, every workflow under (shared, team), (separate, per_role), (lora, ppo_cc), "
                             "a 48-token budget each (seconds per run); "
                             "results go to a temporary directory unless --out is given")
    parser.add_argument("--workflows", nargs="*", default=list(WORKFLOWS), choices=list(WORKFLOWS))
    parser.add_argument("--mappings", nargs="*", default=list(MAPPINGS), choices=list(MAPPINGS))
    parser.add_argument("--credits", nargs="*", default=list(CREDITS), choices=list(CREDITS))
    parser.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiplies every workflow's token budget")
    parser.add_argument("--out", type=Path, default=None, help=f"result files (default {DEFAULT_RESULTS})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run (repeatable)")
    args = parser.parse_args()
    quiet_environment(1)
    extra, eval_every, eval_size, seeds = list(args.set), EVAL_EVERY, EVAL_SIZE, args.seeds
    if args.smoke:
        extra = ["trainer.tasks_per_step=2", "algorithm.group_size=2", *extra]
        eval_every, eval_size, seeds = 1, 4, seeds[:1]
    pairs = [(m, c) for m in args.mappings for c in args.credits]
    if args.smoke:  # a slice that still builds every mapping and every credit once per workflow
        pairs = [pair for pair in zip(MAPPINGS, CREDITS) if pair[0] in args.mappings and pair[1] in args.credits]
    out = args.out or (Path(tempfile.mkdtemp(prefix="workflow-matrix-smoke-")) if args.smoke else DEFAULT_RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine_line(1)}; results in {out}", flush=True)
    started, failures = time.perf_counter(), 0
    for seed in seeds:  # seed-major: a cut-short matrix still has every cell at its first seeds
        for workflow in args.workflows:
            budget = 48 if args.smoke else int(WORKFLOWS[workflow][1] * args.budget_scale)
            for mapping, credit in pairs:
                target = out / f"{run_name(workflow, mapping, credit, seed)}.json"
                if target.exists():
                    continue
                missing = warm_start_missing(workflow)
                if missing:
                    print(f"# {target.stem}: skipped, no warm start at {missing} "
                          "(python examples/workflow_warm_start.py); rerun to resume", flush=True)
                    continue
                try:
                    record = run_one(workflow, mapping, credit, seed, budget, eval_every, eval_size, extra)
                except Exception:  # noqa: BLE001 - one broken cell must not stop an unattended matrix
                    print(f"# {target.stem}: FAILED\n{traceback.format_exc()}", flush=True)
                    failures += 1
                    continue
                partial = target.with_suffix(".json.part")
                partial.write_text(json.dumps(record, indent=1))
                os.replace(partial, target)  # a killed run leaves no half-written result
                curve = record["curve"]
                print(f"# {target.stem}: acc {curve[0]['accuracy']:.3f} -> {curve[-1]['accuracy']:.3f} "
                      f"(peak {max(p['accuracy'] for p in curve):.3f}) in {record['steps']} steps, "
                      f"{record['tokens']} tokens, {record['wall_s']:.0f} s", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s; {failures} run(s) failed", flush=True)
    from benchmarks.workflow_report import load_runs, table
    print(table(load_runs(out)))
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
