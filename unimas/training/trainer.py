"""The training loop, readable in one sitting.

    for each step:
        sample tasks -> G episodes per task (all concurrently, star controller)
        rewards -> per-turn credit -> grouped advantages
        each model group updates on exactly the turns it owns (in parallel)
        metrics; every `eval_every` steps a greedy evaluation; checkpoints

With ``algorithm.max_staleness > 0`` the episodes of the next steps are
generated while the groups update (``unimas/training/pipeline.py``); 0 is the loop above.
The loop decides when a checkpoint is written; ``unimas/training/resume.py``
writes it, and restores a run from it on ``--resume``.

The loop never touches weights: it talks to model groups through a transport
(in-process or Ray), which is what makes `runtime.kind` a config switch.
"""

from __future__ import annotations

import gc
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from unimas.training import central_critic, exploration

from unimas.algorithms.credit import CreditAssigner, CreditedTurn
from unimas.config.loading import dump_config
from unimas.config.schema import RoleConfig
from unimas.controller.context import workflow_label
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.errors import ModelGroupError, TrainingFailed, UserError
from unimas.groups.base import TrainTurn
from unimas.groups.base import Transport
from unimas.training.experiment import Experiment
from unimas.output.metrics import (
    MetricsWriter,
    evaluation_metrics,
    rollout_metrics,
    throughput_metrics,
)
from unimas.training.pipeline import RolloutPipeline, WeightVersions, pipeline_depth
from unimas.training.rollout import Rollout
from unimas.output.rundir import RunDir, TrainerState
from unimas.training.resume import Checkpointer
from unimas.training.snapshots import SnapshotPools
from unimas.training.update_order import execution_order, update_groups
from unimas.trajectory import GraphTrajectory, write_jsonl

T = TypeVar("T")


YOUNG_GC_THRESHOLD = 10_000
"""Allocations between two young-generation collections during a run (Python's default: 700)."""


def settle_collector() -> tuple[int, int, int]:
    """Before the first step: keep the cyclic garbage collector's pauses off the step time; returns the
    thresholds it replaced (``Trainer.run`` puts them back at its end).

    Models, tokenizers and imported modules live for the whole run: freezing them keeps the collector's
    full passes (measured: ~250 ms every ~10 steps) away. A step then still allocates ~5,000 tracked
    objects (turn nodes, requests, results), which at the default threshold meant ~7 young collections
    per step of the 3-role benchmark, ~1 % of its step time (``benchmarks/overhead.py``); almost all of
    those objects die by reference counting, so a higher threshold frees the same garbage with fewer passes.
    """
    gc.collect()
    gc.freeze()
    previous = gc.get_threshold()
    gc.set_threshold(max(previous[0], YOUNG_GC_THRESHOLD), *previous[1:])
    return previous


def train_turn(c: CreditedTurn, role: RoleConfig) -> TrainTurn:
    """The record a group trains on for one credited turn of ``role`` (turns keep execution order per episode,
    which GAE over a role's turns relies on: docs/critic.md)."""
    return TrainTurn(
        prompt_ids=c.turn.prompt_ids, response_ids=c.turn.response_ids, rollout_logprobs=c.turn.logprobs,
        rollout_logprobs_exact=c.turn.logprobs_exact, advantage=c.turn.advantage,
        temperature=role.generation.temperature or 1.0, adapter=role.adapter,
        weight_version=c.turn.weight_version, episode=c.trajectory.episode_id, role=c.turn.role, reward=c.signal,
    )


def no_turn_episodes(trajectories: list[GraphTrajectory]) -> list[GraphTrajectory]:
    """The episodes that ended without failing yet made no model turn: nothing of them can be trained."""
    return [t for t in trajectories if not t.failed and not t.turns()]


class Trainer:
    def __init__(self, experiment: Experiment, run_dir: RunDir, transport: Transport,
                 log: Callable[[dict], None] | None = None):
        self.experiment = experiment
        self.config = experiment.config
        self.run_dir = run_dir
        self.transport = transport
        self.log = log or (lambda record: None)
        runtime = self.config.runtime
        self.controller = Controller(experiment.workflow, self.config.roles, self._new_router(), experiment.tools,
                                     max_concurrent=runtime.max_concurrent_episodes,
                                     tool_timeout_s=runtime.tool_timeout_s, episode_timeout_s=runtime.episode_timeout_s,
                                     parsers=experiment.parsers, workflow_label=workflow_label(self.config.workflow))
        self.credit = CreditAssigner(self.config, experiment.rewards, experiment.estimator)
        self.rollout = Rollout.from_experiment(experiment, self.controller, self.credit)
        self.snapshots = SnapshotPools(self.config, transport, run_dir)
        self.train_tasks = experiment.tasks("train")
        self.eval_tasks = experiment.tasks("eval")[: self.config.trainer.eval_size]
        self.start_step = 0
        self.failed_steps_in_a_row = 0
        self.pipeline = RolloutPipeline(self._collect, pipeline_depth(self.config), self.config.trainer.steps)
        self.versions = WeightVersions(self.config)
        self.checkpointer = Checkpointer(self.config, run_dir, transport, self.pipeline, self.rollout, self.snapshots)
        self.collapse = exploration.CollapseWatch(self.config.roles, self.config.logging.entropy_warning)

    def _new_router(self) -> Router:
        runtime = self.config.runtime
        return Router(self.transport, runtime.max_batch_size, runtime.max_wait_ms / 1000)

    def _step_specs(self, step: int) -> list[EpisodeSpec]:
        trainer = self.config.trainer
        rng = random.Random(trainer.seed * 1_000_003 + step)
        tasks = [rng.choice(self.train_tasks) for _ in range(trainer.tasks_per_step)]
        group_size = self.config.algorithm.group_size
        return [
            EpisodeSpec(f"s{step}-t{i}-g{g}", f"s{step}-t{i}", task)
            for i, task in enumerate(tasks) for g in range(group_size)
        ]

    async def _collect(self, step: int) -> list[GraphTrajectory]:
        """The episodes of step ``step``; the pipeline calls it, ahead of the step when it runs asynchronously."""
        trajectories = await self.rollout.collect(self._step_specs(step), step)
        return trajectories

    # -- one training step: episodes -> credit -> group updates -> metrics ---
    async def train_step(self, step: int) -> dict[str, Any]:
        started = time.perf_counter()
        trajectories = await self.pipeline.take(step)
        credit = self.credit.assign(trajectories)
        rollout_s = time.perf_counter() - started
        over_budget = self._check_failure_budget(step, trajectories)
        if credit.metrics.get("credit/nonfinite_advantages") and self.config.trainer.on_nonfinite == "stop":
            raise TrainingFailed(f"step {step + 1}: {credit.metrics['credit/nonfinite_advantages']:.0f} turns got a "
                                 "non-finite advantage (trainer.on_nonfinite: stop)")

        turns, staleness = self.versions.admit(credit.turns)
        update_started = time.perf_counter()
        group_metrics = {} if over_budget else await self._update_groups(turns)
        if not over_budget:
            self.versions.advance(turns, group_metrics)
        update_s = time.perf_counter() - update_started
        self._check_nonfinite_updates(step, group_metrics)

        metrics = {"step": step + 1, "episode/over_budget": float(over_budget),
                   "episode/no_turns": float(len(no_turn_episodes(trajectories)))}
        metrics.update(rollout_metrics(trajectories, self.config.roles, self.experiment.primary_reward))
        metrics.update(exploration.distinct_answers(trajectories, self.config.roles))
        metrics.update(credit.metrics)
        metrics.update(staleness)
        metrics.update(group_metrics)
        metrics.update(throughput_metrics(trajectories, group_metrics))
        metrics.update({"time/rollout_s": rollout_s, "time/update_s": update_s,
                        "time/step_s": time.perf_counter() - started})
        self._sample_trajectories(trajectories, step + 1)
        self.collapse.observe(metrics)
        return metrics

    def _check_failure_budget(self, step: int, trajectories: list[GraphTrajectory]) -> bool:
        """True when too many of the step's episodes failed, or made no model turn (nothing to train on: an agent
        answering from a client-side cache): the step skips its update. After ``trainer.max_failed_steps`` such steps
        in a row the run stops."""
        trainer = self.config.trainer
        failed = sum(t.failed for t in trajectories)
        silent = no_turn_episodes(trajectories)
        if failed <= trainer.failure_budget * len(trajectories) and \
                len(silent) <= trainer.no_turn_budget * len(trajectories):
            self.failed_steps_in_a_row = 0
            return False
        self.failed_steps_in_a_row += 1
        if self.failed_steps_in_a_row >= trainer.max_failed_steps:
            if failed > trainer.failure_budget * len(trajectories):
                first = next(t.error for t in trajectories if t.failed)
                raise TrainingFailed(f"step {step + 1}: {failed}/{len(trajectories)} episodes failed "
                                     f"({self.failed_steps_in_a_row} step(s) over trainer.failure_budget in a row); "
                                     f"first error: {first}")
            raise TrainingFailed(f"step {step + 1}: {len(silent)}/{len(trajectories)} episodes made no model turn "
                                 f"({self.failed_steps_in_a_row} step(s) over trainer.no_turn_budget or "
                                 f"trainer.failure_budget in a row), e.g. {silent[0].episode_id}: its agent answered "
                                 "without calling the model (a client-side cache? docs/gateway.md)")
        return True

    def _check_nonfinite_updates(self, step: int, group_metrics: dict[str, float]) -> None:
        skipped = [key.split("/")[1] for key, value in group_metrics.items()
                   if key.endswith("/nonfinite_skipped") and value > 0]
        if skipped and self.config.trainer.on_nonfinite == "stop":
            raise TrainingFailed(f"step {step + 1}: a non-finite loss or gradient in model group(s) "
                                 f"{', '.join(skipped)} (trainer.on_nonfinite: stop)")

    async def _update_groups(self, credited: list[CreditedTurn]) -> dict[str, float]:
        turns = [train_turn(c, self.config.roles[c.turn.role]) for c in credited]
        critic_metrics, warming_up = {}, False
        if self.config.algorithm.critic == "centralized" and turns:  # every turn valued first (docs/critic.md)
            turns, critic_metrics, warming_up = await central_critic.value_turns(self.transport, self.config,
                                                                                 credited, turns)
        turns_by_group: dict[str, list[TrainTurn]] = defaultdict(list)
        roles_by_group: dict[str, list[str]] = defaultdict(list)
        for c, turn in zip(credited, turns):
            group = self.config.roles[c.turn.role].model
            turns_by_group[group].append(turn)
            roles_by_group[group].append(c.turn.role)
        if warming_up:  # only the central critic trains: each policy group's update is empty (its schedule advances)
            results = await update_groups(self.transport, {g: [] for g in turns_by_group}, {})
        else:
            results = await update_groups(self.transport, turns_by_group, roles_by_group, self.rollout.update_order,
                                          execution_order([(c.turn.started, c.turn.role) for c in credited]))
        # a role's own keys (role/<role>/entropy) stay unprefixed: a role belongs to one group
        return {**critic_metrics, **{k if k.startswith("role/") else f"group/{g}/{k}": v
                                     for g, stats in sorted(results.items()) for k, v in stats.items()}}

    def _sample_trajectories(self, trajectories: list[GraphTrajectory], step: int) -> None:
        count = self.config.trainer.sample_trajectories
        if not count:
            return
        rng = random.Random(step)
        chosen = rng.sample(trajectories, min(count, len(trajectories)))
        for traj in chosen:
            traj.step = step if traj.step is None else traj.step  # a replayed episode keeps the step it was sampled at
        write_jsonl(self.run_dir.trajectories("train"), chosen)

    # -- evaluation -------------------------------------------------------
    async def evaluate(self, step: int, strict: bool = False) -> dict[str, float]:
        """Greedy (or ``eval_samples``-way) episodes on the eval tasks.

        ``strict``: when every episode fails, the workflow or a reward is
        broken for every input — a :class:`UserError` naming the user's file
        and line, not a quiet accuracy of 0.
        """
        samples = self.config.trainer.eval_samples
        specs = [EpisodeSpec(f"eval{step}-t{i}-k{k}", f"eval-{i}", task)
                 for i, task in enumerate(self.eval_tasks) for k in range(samples)]
        trajectories = await self.controller.run(specs, greedy=samples == 1)
        self.credit.allocate(trajectories)
        if strict and all(t.failed for t in trajectories):
            first = trajectories[0]
            raise UserError(f"every one of the {len(trajectories)} evaluation episodes failed; the first: "
                            f"{first.error}. Fix the workflow or reward code (run with --debug for the traceback)",
                            where=f"step {step} evaluation") from first.exception
        for traj in trajectories:
            traj.step = step
        write_jsonl(self.run_dir.trajectories("eval"), trajectories)
        return evaluation_metrics(trajectories, self.config, self.experiment.primary_reward, samples)

    # -- checkpoints (written and restored by resume.py) ------------------
    def _state(self, step: int) -> TrainerState:
        """What a checkpoint of ``step`` records of the loop itself."""
        return TrainerState(step=step, failed_steps_in_a_row=self.failed_steps_in_a_row,
                            weight_versions=self.versions.state())

    def _continue_from(self, state: TrainerState) -> None:
        """Take the loop's counters up where a restored checkpoint left them."""
        self.failed_steps_in_a_row = state.failed_steps_in_a_row
        self.versions = WeightVersions(self.config, state.weight_versions)

    async def load_checkpoint(self, directory: Path) -> int:
        """Restore the run from the complete checkpoint ``directory`` (``unimas eval --checkpoint``); its step."""
        state = await self.checkpointer.load(directory)
        self._continue_from(state)
        return state.step

    # -- the loop ---------------------------------------------------------
    async def run(self, resume: bool = False) -> list[dict[str, Any]]:
        trainer = self.config.trainer
        stop = self.config.stop_condition
        collector = settle_collector()
        writer = MetricsWriter(self.run_dir.metrics)
        history: list[dict[str, Any]] = []
        try:
            if resume:  # the newest usable checkpoint; none usable: start over from step 0
                restored = await self._guarded("resume", self.checkpointer.resume)
                if restored is not None:
                    self.start_step = restored.step
                    self._continue_from(restored)
            self.run_dir.config.write_text(dump_config(self.config))  # the config in force (not on a refusal)
            if self.start_step == 0:
                record = {"step": 0, **(await self._guarded("step 0 (evaluation)",
                                                            lambda: self.evaluate(0, strict=True)))}
                writer.write(record); history.append(record); self.log(record)
            await self._guarded("snapshots", lambda: self.snapshots.start(self.start_step))
            for step in range(self.start_step, trainer.steps):
                record = await self._guarded(f"step {step + 1}", lambda: self.train_step(step))
                done = step + 1
                record.update(await self._guarded(f"step {done} (snapshots)", lambda: self.snapshots.after_step(done)))
                last = done == trainer.steps
                if last or (trainer.eval_every and done % trainer.eval_every == 0):
                    record.update(await self._guarded(f"step {done} (evaluation)", lambda: self.evaluate(done)))
                writer.write(record); history.append(record); self.log(record)
                reached = stop is not None and stop.reached(record)
                if last or reached or (trainer.save_every and done % trainer.save_every == 0):
                    await self._guarded(f"step {done} (checkpoint)",
                                        lambda: self.checkpointer.save(self._state(done)))
                if reached:
                    break
        finally:
            await self.pipeline.close()
            writer.close()
            gc.set_threshold(*collector)
        return history

    async def _guarded(self, where: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work``; a model group that fails in it stops the run with a :class:`ModelGroupError`
        naming group, step and phase, or — with ``runtime.restart_failed_groups`` — is restarted from
        the last complete checkpoint (initial weights if none) and ``work`` is retried once."""
        try:
            return await work()
        except ModelGroupError as failure:
            if not self.config.runtime.restart_failed_groups:
                raise failure.during(where, "runtime.restart_failed_groups is off") from failure.cause
            group = failure.group
        latest = self.run_dir.latest_checkpoint()
        checkpoint = latest / group if latest is not None else None
        try:
            await self.transport.restart(group, checkpoint)
            # a fresh router: requests stranded by the failed attempt must not join the retry's batches
            self.controller.router = self._new_router()
            return await work()
        except ModelGroupError as again:
            raise again.during(where, f"after restarting '{group}' from {checkpoint or 'its initial weights'} "
                               "and retrying once") from again.cause
