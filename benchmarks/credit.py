"""Credit methods at equal sampled-token budgets: `python benchmarks/credit.py`.

Methods (the built-in seed methods, ``plugins/unimas_plugins/methods``) ×
tasks × seeds. Each run trains until it has *sampled* ``budget`` response
tokens (replayed fork prefixes and replay-buffer copies cost nothing; this is
what makes branching and replay comparable with plain GRPO), evaluating
greedily every ``eval_every`` steps and once at the end. Reported per task and
method, mean ± std over seeds:

* final team accuracy (greedy ``eval/accuracy``);
* for the solver → verifier team (``arith``): the verifier's fix rate (a wrong
  proposal turned right) and break rate (a right one turned wrong);
* steps and sampled tokens until the accuracy first reached the task's
  threshold (mean over the seeds that reached it; ``k/n`` says how many did).

Tasks: ``signalling`` (examples/quickstart.yaml), ``arith`` (the warm-started
solver → verifier team of examples/arith_team.yaml, team reward only: the
verifier learns to copy) and ``math_team`` (examples/math_team_cpu.yaml,
solver → verifier → refiner from the workflow library). Everything runs in
this process, one run after another; ``--smoke`` shrinks it to seconds.

Two rows train with a learned critic (docs/critic.md) instead of a credit
method: ``ppo_gae`` (a value model per trainable group, GAE over each role's
turns) and ``centralized_critic`` (one extra critic group, the same model and
tokenizer as the roles', reading the episode so far; MAPPO-style). Their config
changes depend on the task's groups and roles, so they are built from the
task's YAML (:func:`ppo_gae`, :func:`centralized_critic`).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, machine_line, markdown_table, quiet_environment  # noqa: E402


@dataclass(frozen=True)
class Task:
    config: str
    threshold: float
    budget: int
    """Sampled response tokens per run (full mode)."""
    overrides: tuple[str, ...] = ()
    chat_model: bool = False
    """Its config loads the built test chat model (examples/models/tiny-chat): built first if missing."""
    central_critic: bool = True
    """Whether its roles' tokenizer can spell the centralized critic's context lines (``<role>: <text>\\n``)."""


TASKS = {
    "signalling": Task("examples/quickstart.yaml", 0.9, 12_288,
                       ("trainer.tasks_per_step=16", "trainer.eval_size=32")),
    # The warm start's 17-token vocabulary (digits, "+", "=", ">") cannot spell "solver: ": no centralized critic.
    "arith": Task("examples/arith_team.yaml", 0.45, 30_000, ("trainer.tasks_per_step=16", "trainer.eval_size=100"),
                  central_critic=False),
    "math_team": Task("examples/math_team_cpu.yaml", 0.3, 12_000, ("trainer.tasks_per_step=8", "trainer.eval_size=32"),
                      chat_model=True),
}

CRITIC = {"optim": {"lr": 0.001}, "value_clip": 0.5}
"""The critic of examples/quickstart_ppo.yaml, for every critic row and task."""
GAE = ("algorithm.estimator=gae", "algorithm.gamma=1.0", "algorithm.lam=1.0", "algorithm.critic_warmup=2")
CRITIC_FIT_STEPS = 5
"""The critic fit is the mean of the last this-many explained variances logged (one per critic and update)."""
CENTRAL_GROUP = "central_critic"
CONTEXT_CHARACTERS = ": \n"
"""What a centralized critic's context line adds to the role names (unimas.training.central_critic.CONTEXT_LINE)."""


def flow(value) -> str:
    """A ``--set`` value: JSON is YAML flow style, and it quotes newlines and colons."""
    return json.dumps(value)


def ppo_gae(tree: dict) -> tuple[str, ...]:
    """A value model (a copy of the group's initial backbone) for every trainable group, and GAE."""
    groups = [name for name, group in tree["models"].items() if group.get("trainable", True)]
    return (*(f"models.{name}.critic={flow(CRITIC)}" for name in groups), *GAE)


def centralized_critic(tree: dict) -> tuple[str, ...]:
    """One more group, a copy of the roles' model declaration with a critic and no roles, valuing every turn.

    Tiny char models get the characters of the context lines (role names,
    ``": "``, newline) appended to their alphabet, in the roles' groups too:
    the critic reads the policies' own token ids, so all must share one tokenizer.
    """
    role_groups = sorted({role["model"] for role in tree["roles"].values()})
    options = copy.deepcopy(tree["models"][role_groups[0]]["options"])
    overrides = []
    tiny = options.get("tiny")
    if tiny is not None:
        needed = "".join(tree["roles"]) + CONTEXT_CHARACTERS
        tiny["alphabet"] += "".join(sorted(set(needed) - set(tiny["alphabet"])))
        overrides += [f"models.{name}.options.tiny.alphabet={flow(tiny['alphabet'])}" for name in role_groups]
    central = {"backend": "torch", "options": options, "critic": CRITIC}
    return (*overrides, f"models.{CENTRAL_GROUP}={flow(central)}", *GAE, "algorithm.critic=centralized",
            f"algorithm.central_critic={CENTRAL_GROUP}")


METHODS: dict[str, tuple[str, ...] | Callable[[dict], tuple[str, ...]]] = {
    "grpo": (),
    "hgpo": ("algorithm.credit={name: hgpo}", "algorithm.estimator=passthrough"),
    "gagpo": ("algorithm.credit={name: gagpo, params: {lam: 0.95, normalize: true}}",
              "algorithm.estimator=passthrough"),
    "branch+counterfactual": ("algorithm.rollout={name: entropy_branch, params: {roots: 2, siblings: 3}}",
                              "algorithm.credit={name: counterfactual}", "algorithm.estimator=passthrough"),
    "adaptive_budget": ("algorithm.rollout={name: adaptive_budget, params: {probe: 4}}",),
    "replay": ("algorithm.replay={name: verified_successes, params: {revisit: 0.25}}",
               "algorithm.stale_turns=reweight"),
    "replay+m2po": ("algorithm.replay={name: verified_successes, params: {revisit: 0.25}}",
                    "algorithm.stale_turns=reweight", "algorithm.loss=m2po"),
    "seeupo": ("algorithm.update_order={name: reverse_execution}",),
    "seeupo+ratios": ("algorithm.update_order={name: reverse_execution, params: {ratio_clip: 0.2}}",),
    "m2po": ("algorithm.loss=m2po",),
    "ppo_gae": ppo_gae,
    "centralized_critic": centralized_critic,
}
"""Each method's config overrides: fixed, or built from the task's YAML tree (the critic rows)."""


def applies(task_name: str, method: str) -> bool:
    return method != "centralized_critic" or TASKS[task_name].central_critic


def method_overrides(task: Task, method: str) -> tuple[str, ...]:
    spec = METHODS[method]
    if callable(spec):
        return spec(yaml.safe_load((REPO / task.config).read_text()))
    return spec


@dataclass
class Result:
    accuracy: float = 0.0
    fix: float | None = None
    broke: float | None = None
    steps: int = 0
    tokens: int = 0
    reached: tuple[int, int] | None = None
    """(step, sampled tokens) of the first evaluation at or above the threshold."""
    critic_fit: float | None = None
    """Mean explained variance of the critic(s) over the last training steps (None: no critic)."""
    history: list[tuple[int, float]] = field(default_factory=list)


def verifier_rates(episodes) -> tuple[float | None, float | None]:
    """Fix rate over wrong proposals, break rate over right ones (arith outcomes carry answer and proposal)."""
    if not episodes or "proposal" not in episodes[0].outcome:
        return None, None
    wrong = [e for e in episodes if e.outcome.get("proposal") != e.task["answer"]]
    right = [e for e in episodes if e.outcome.get("proposal") == e.task["answer"]]
    fixed = sum(e.outcome.get("answer") == e.task["answer"] for e in wrong)
    broken = sum(e.outcome.get("answer") != e.task["answer"] for e in right)
    return fixed / max(len(wrong), 1), broken / max(len(right), 1)


async def train_to_budget(trainer, task: Task, budget: int, eval_every: int, run_dir: Path) -> Result:
    from unimas.controller.forking import sampled_tokens
    from unimas.trajectory import read_jsonl

    result = Result()
    run = trainer.controller.run

    async def counted(specs, greedy=False):  # every sampled training episode (forks too) passes through here
        episodes = await run(specs, greedy=greedy)
        if not greedy:
            result.tokens += sampled_tokens(episodes)
        return episodes

    trainer.controller.run = counted

    async def evaluate(step: int) -> None:
        accuracy = (await trainer.evaluate(step))["eval/accuracy"]
        result.history.append((step, accuracy))
        if result.reached is None and accuracy >= task.threshold:
            result.reached = (step, result.tokens)
        result.accuracy = accuracy

    await evaluate(0)
    step = 0
    fits: list[float] = []
    while result.tokens < budget:
        metrics = await trainer.train_step(step)
        fits += [value for key, value in metrics.items() if key.endswith("/critic/explained_variance")]
        step += 1
        if step % eval_every == 0 or result.tokens >= budget:
            await evaluate(step)
    result.steps = step
    if fits:
        result.critic_fit = statistics.fmean(fits[-CRITIC_FIT_STEPS:])
    final = [e for e in read_jsonl(run_dir / "trajectories" / "eval.jsonl") if e.step == step]
    result.fix, result.broke = verifier_rates(final)
    return result


def run_one(task_name: str, method: str, seed: int, budget: int, eval_every: int, extra: list[str]) -> Result:
    from unimas.config.loading import load_config
    from unimas.training.experiment import Experiment
    from unimas.runtime.transport import start_transport
    from unimas.process import torch_setup
    from unimas.output.rundir import RunDir
    from unimas.testing.tiny_chat import chat_model_dir
    from unimas.training.trainer import Trainer

    task = TASKS[task_name]
    if task.chat_model:
        chat_model_dir(REPO / "examples" / "models")  # what the example's header asks for: offline, seconds
    overrides = [*task.overrides, *method_overrides(task, method), *extra, f"trainer.seed={seed}",
                 "trainer.steps=100000", "trainer.sample_trajectories=0", "trainer.stop_at_accuracy=null"]
    config = load_config(REPO / task.config, overrides)
    experiment = Experiment.resolve(config)
    torch_setup(config.trainer.torch_threads, seed)
    with tempfile.TemporaryDirectory(prefix="credit-bench-") as tmp:
        run_dir = RunDir(Path(tmp)).create()
        transport = start_transport(config, experiment.registry)
        try:
            trainer = Trainer(experiment, run_dir, transport)
            return asyncio.run(train_to_budget(trainer, task, budget, eval_every, Path(tmp)))
        finally:
            transport.shutdown()


def spread(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def table(results: dict[tuple[str, str], list[Result]]) -> str:
    rows = []
    for (task_name, method), runs in results.items():
        reached = [r.reached for r in runs if r.reached is not None]
        fixes = [r.fix for r in runs if r.fix is not None]
        breaks = [r.broke for r in runs if r.broke is not None]
        critic_fits = [r.critic_fit for r in runs if r.critic_fit is not None]
        rows.append([task_name, method, spread([r.accuracy for r in runs]), spread([r.history[0][1] for r in runs]),
                     spread(fixes), spread(breaks),
                     f"{statistics.fmean(r.steps for r in runs):.0f}",
                     f"{statistics.fmean(r.tokens for r in runs):.0f}",
                     f"{len(reached)}/{len(runs)}",
                     f"{statistics.fmean(s for s, _ in reached):.0f}" if reached else "—",
                     f"{statistics.fmean(t for _, t in reached):.0f}" if reached else "—",
                     spread(critic_fits)])
    return markdown_table(["task", "method", "final team acc", "acc at step 0", "verifier fix rate",
                           "verifier break rate", "steps", "sampled tokens", "reached threshold",
                           "steps to threshold", "tokens to threshold", "critic explained variance"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny budgets, one seed: checks the script runs")
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiplies every task's token budget")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run, after the task's and the method's (repeatable)")
    args = parser.parse_args()
    quiet_environment(1)
    seeds, eval_every, extra = args.seeds, args.eval_every, list(args.set)
    if args.smoke:
        seeds, eval_every = 1, 1
        extra = ["trainer.tasks_per_step=2", "algorithm.group_size=4", "trainer.eval_size=4", *extra]
    print(f"machine: {machine_line(1)}")
    results: dict[tuple[str, str], list[Result]] = {}
    started = time.perf_counter()
    for task_name in args.tasks:
        budget = 64 if args.smoke else int(TASKS[task_name].budget * args.budget_scale)
        for method in args.methods:
            if not applies(task_name, method):
                print(f"# {task_name} {method}: skipped (its roles' tokenizer cannot spell the critic's context)")
                continue
            for seed in range(seeds):
                result = run_one(task_name, method, seed, budget, eval_every, extra)
                results.setdefault((task_name, method), []).append(result)
                print(f"# {task_name} {method} seed {seed}: acc {result.accuracy:.3f} fix {result.fix} break "
                      f"{result.broke} critic fit {result.critic_fit} after {result.steps} steps, "
                      f"{result.tokens} tokens; history {result.history}", flush=True)
        print(f"\n{task_name} so far:\n" + table({k: v for k, v in results.items() if k[0] == task_name}) + "\n",
              flush=True)
    print(f"\nEqual sampled-token budgets; {seeds} seed(s); {time.perf_counter() - started:.0f} s in all.\n")
    print(table(results))


if __name__ == "__main__":
    main()
