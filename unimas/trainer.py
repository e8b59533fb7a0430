"""The training loop, readable in one sitting.

    for each step:
        sample tasks -> G episodes per task (all concurrently, star controller)
        rewards -> per-turn credit -> grouped advantages
        each model group updates on exactly the turns it owns (in parallel)
        metrics; every `eval_every` steps a greedy evaluation; checkpoints

The loop never touches weights: it talks to model groups through a transport
(in-process or Ray), which is what makes `runtime.kind` a config switch.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from unimas.backends.base import TrainTurn
from unimas.config import ExperimentConfig, dump_config
from unimas.credit import CreditedTurn, estimate_advantages, group_key, reward_keys, score_episode, turn_credit
from unimas.errors import ModelGroupError, RunError, UserError
from unimas.experiment import Experiment
from unimas.metrics import MetricsWriter, rollout_metrics, throughput_metrics
from unimas.runtime.controller import EpisodeSpec, run_episodes
from unimas.runtime.router import GroupFailure, Router
from unimas.rundir import RunDir, read_trainer_state, write_trainer_state
from unimas.trajectory import GraphTrajectory, write_jsonl


class TrainingFailed(RunError):
    """Too many episodes failed in one step (see ``trainer.failure_budget``)."""


class GroupFailed(ModelGroupError):
    """A model group failed during a step and was not restarted, or failed again after its restart."""

    def __init__(self, failure: GroupFailure, where: str, note: str):
        self.group, self.where, self.cause = failure.group, where, failure.cause
        detail = (str(failure.cause).strip().splitlines() or [""])[0]
        super().__init__(f"model group '{failure.group}' failed during {where}: "
                         f"{type(failure.cause).__name__}: {detail} ({note})")


T = TypeVar("T")


def start_transport(config: ExperimentConfig, experiment: Experiment):
    if config.runtime.kind == "ray":
        from unimas.runtime.ray_runtime import RayTransport

        return RayTransport.start(config, experiment.registry)
    from unimas.runtime.local import LocalTransport

    return LocalTransport.start(config, experiment.registry)


class Trainer:
    def __init__(self, experiment: Experiment, run_dir: RunDir, transport, log: Callable[[dict], None] | None = None):
        self.experiment = experiment
        self.config = experiment.config
        self.run_dir = run_dir
        self.transport = transport
        self.log = log or (lambda record: None)
        runtime = self.config.runtime
        self.router = Router(transport, runtime.max_batch_size, runtime.max_wait_ms / 1000)
        self.train_tasks = experiment.tasks("train")
        self.eval_tasks = experiment.tasks("eval")[: self.config.trainer.eval_size]
        self.start_step = 0

    # -- episodes ---------------------------------------------------------
    def _step_specs(self, step: int) -> list[EpisodeSpec]:
        trainer = self.config.trainer
        rng = random.Random(trainer.seed * 1_000_003 + step)
        tasks = [rng.choice(self.train_tasks) for _ in range(trainer.tasks_per_step)]
        group_size = self.config.algorithm.group_size
        return [
            EpisodeSpec(f"s{step}-t{i}-g{g}", f"s{step}-t{i}", task)
            for i, task in enumerate(tasks) for g in range(group_size)
        ]

    async def _episodes(self, specs: list[EpisodeSpec], greedy: bool) -> list[GraphTrajectory]:
        exp = self.experiment
        trajectories = await run_episodes(specs, exp.workflow, self.config.roles, self.router, exp.tools,
                                          greedy=greedy, max_concurrent=self.config.runtime.max_concurrent_episodes)
        for traj in trajectories:
            score_episode(traj, self.config.rewards, exp.rewards)
            for turn in traj.turns():
                turn.reward = turn_credit(traj, turn, self.config.rewards)
        return trajectories

    def _trainable(self, role: str) -> bool:
        spec = self.config.roles[role]
        return spec.trainable and self.config.models[spec.model].trainable

    # -- one training step ------------------------------------------------
    async def train_step(self, step: int) -> dict[str, Any]:
        started = time.perf_counter()
        trajectories = await self._episodes(self._step_specs(step), greedy=False)
        rollout_s = time.perf_counter() - started
        failed = sum(t.failed for t in trajectories)
        if failed > self.config.trainer.failure_budget * len(trajectories):
            first = next(t.error for t in trajectories if t.failed)
            raise TrainingFailed(f"step {step}: {failed}/{len(trajectories)} episodes failed; first error: {first}")

        credited = [
            CreditedTurn(traj, turn, turn.reward, group_key(self.config.algorithm.grouping, traj.task_id, turn))
            for traj in trajectories if not traj.failed
            for turn in traj.turns() if self._trainable(turn.role) and turn.response_ids
        ]
        grouping = estimate_advantages(credited, self.config.algorithm, self.experiment.estimator)
        for c in credited:
            c.turn.advantage = c.advantage

        update_started = time.perf_counter()
        group_metrics = await self._update_groups(credited)
        update_s = time.perf_counter() - update_started

        metrics = {"step": step + 1}
        metrics.update(rollout_metrics(trajectories, credited, self.config.roles, self.experiment.primary_reward))
        metrics.update({f"credit/{k}": v for k, v in grouping.items()})
        metrics.update(group_metrics)
        metrics.update(throughput_metrics(trajectories, group_metrics))
        metrics.update({"time/rollout_s": rollout_s, "time/update_s": update_s,
                        "time/step_s": time.perf_counter() - started})
        self._sample_trajectories(trajectories, step + 1)
        return metrics

    async def _update_groups(self, credited: list[CreditedTurn]) -> dict[str, float]:
        turns_by_group: dict[str, list[TrainTurn]] = defaultdict(list)
        for c in credited:
            role = self.config.roles[c.turn.role]
            exact = role.generation.top_k == 0 and role.generation.top_p == 1.0
            turns_by_group[role.model].append(TrainTurn(
                prompt_ids=c.turn.prompt_ids, response_ids=c.turn.response_ids,
                old_logprobs=c.turn.logprobs if exact else [], advantage=c.advantage,
                temperature=role.generation.temperature or 1.0, adapter=role.adapter,
            ))
        groups = sorted(turns_by_group)
        results = await asyncio.gather(*(
            self.transport.update(g, turns_by_group[g], self.config.algorithm) for g in groups
        ))
        return {f"group/{g}/{k}": v for g, stats in zip(groups, results) for k, v in stats.items()}

    def _sample_trajectories(self, trajectories: list[GraphTrajectory], step: int) -> None:
        count = self.config.trainer.sample_trajectories
        if not count:
            return
        rng = random.Random(step)
        chosen = rng.sample(trajectories, min(count, len(trajectories)))
        for traj in chosen:
            traj.outcome.setdefault("_step", step)
        write_jsonl(self.run_dir.trajectories("train"), chosen)

    # -- evaluation -------------------------------------------------------
    async def evaluate(self, step: int) -> dict[str, float]:
        samples = self.config.trainer.eval_samples
        specs = [EpisodeSpec(f"eval{step}-t{i}-k{k}", f"eval-{i}", task)
                 for i, task in enumerate(self.eval_tasks) for k in range(samples)]
        trajectories = await self._episodes(specs, greedy=samples == 1)
        for traj in trajectories:
            traj.outcome.setdefault("_step", step)
        write_jsonl(self.run_dir.trajectories("eval"), trajectories)
        return evaluation_metrics(trajectories, self.experiment, samples)

    # -- checkpoints ------------------------------------------------------
    async def save(self, step: int) -> Path:
        directory = self.run_dir.checkpoint(step)
        directory.mkdir(parents=True, exist_ok=True)
        await asyncio.gather(*(self.transport.save(g, directory / g) for g in sorted(self.config.models)))
        write_trainer_state(directory, {"step": step})
        return directory

    async def resume(self) -> int:
        directory = self.run_dir.latest_checkpoint()
        if directory is None:
            raise UserError("no complete checkpoint to resume from", where=str(self.run_dir.root))
        await asyncio.gather(*(self.transport.load(g, directory / g) for g in sorted(self.config.models)))
        self.start_step = read_trainer_state(directory)["step"]
        return self.start_step

    # -- the loop ---------------------------------------------------------
    async def run(self, resume: bool = False) -> list[dict[str, Any]]:
        trainer = self.config.trainer
        # Models, tokenizers and imported modules live for the whole run; freezing them keeps
        # the collector's full passes (measured: ~250 ms every ~10 steps) off the step time.
        gc.collect()
        gc.freeze()
        self.run_dir.config.write_text(dump_config(self.config))
        writer = MetricsWriter(self.run_dir.metrics)
        history: list[dict[str, Any]] = []
        try:
            if resume:
                await self.resume()
            else:
                record = {"step": 0, **(await self._guarded("step 0 (evaluation)", lambda: self.evaluate(0)))}
                writer.write(record); history.append(record); self.log(record)
            for step in range(self.start_step, trainer.steps):
                record = await self._guarded(f"step {step + 1}", lambda: self.train_step(step))
                done = step + 1
                last = done == trainer.steps
                if last or (trainer.eval_every and done % trainer.eval_every == 0):
                    record.update(await self._guarded(f"step {done} (evaluation)", lambda: self.evaluate(done)))
                writer.write(record); history.append(record); self.log(record)
                reached = (trainer.stop_at_accuracy is not None
                           and record.get("eval/accuracy", -1.0) >= trainer.stop_at_accuracy)
                if last or reached or (trainer.save_every and done % trainer.save_every == 0):
                    await self._guarded(f"step {done} (checkpoint)", lambda: self.save(done))
                if reached:
                    break
        finally:
            writer.close()
        return history

    async def _guarded(self, where: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work``; a model group that fails in it stops the run with a :class:`GroupFailed`
        naming group and step, or — with ``runtime.restart_failed_groups`` — is restarted from the
        last complete checkpoint (initial weights if none) and ``work`` is retried once."""
        try:
            return await work()
        except GroupFailure as failure:
            if not self.config.runtime.restart_failed_groups:
                raise GroupFailed(failure, where, "runtime.restart_failed_groups is off") from failure.cause
            group = failure.group
        latest = self.run_dir.latest_checkpoint()
        checkpoint = latest / group if latest is not None else None
        try:
            await self.transport.restart(group, checkpoint)
            # a fresh router: requests stranded by the failed attempt must not join the retry's batches
            self.router = Router(self.transport, self.router.max_batch_size, self.router.max_wait_s)
            return await work()
        except GroupFailure as again:
            raise GroupFailed(again, where, f"after restarting '{group}' from "
                              f"{checkpoint or 'its initial weights'} and retrying once") from again.cause


def evaluation_metrics(trajectories: list[GraphTrajectory], experiment: Experiment, samples: int) -> dict[str, float]:
    metrics: dict[str, float] = {}
    keys = reward_keys(experiment.config.rewards)
    for key, spec in zip(keys, experiment.config.rewards):
        if spec.level == "trajectory":
            metrics[f"eval/reward/{key}"] = sum(t.rewards[key] for t in trajectories) / len(trajectories)
    primary = experiment.primary_reward
    if primary is not None:
        metrics["eval/accuracy"] = metrics[f"eval/reward/{primary}"]
        if samples > 1:
            by_task: dict[str, list[float]] = defaultdict(list)
            for t in trajectories:
                by_task[t.task_id].append(t.rewards[primary])
            metrics[f"eval/pass@{samples}"] = sum(max(v) >= 1.0 for v in by_task.values()) / len(by_task)
    for role in experiment.config.roles:
        turns = [turn for t in trajectories for turn in t.turns(role)]
        if turns:
            metrics[f"eval/role/{role}/reward_mean"] = sum(t.reward for t in turns) / len(turns)
    metrics["eval/failures"] = float(sum(t.failed for t in trajectories))
    return metrics
