"""``adaptive_budget``: more samples where rewards are mixed; zero-variance groups dropped.

Seeds: TRACE spends rollouts where
rewards are "likely yielding mixed rewards"; RAGEN/StarPO-S
"trajectory filtering" against reward-variance collapse. Each task first gets
``probe`` episodes; tasks whose probes all score the same carry no
group-relative signal and are dropped (unless every task is flat, then the
probes are kept so the step still logs). The step's remaining budget —
``group_size - probe`` episodes per task — goes to the mixed tasks, split
evenly, so the sampled episodes per step never exceed plain GRPO's.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from unimas import GraphTrajectory
from unimas.methods import EpisodeSpec, RolloutSession, by_task, episode_return


def extra_samples(returns: dict[str, list[float]], budget: int) -> dict[str, int]:
    """Episodes to add per task: ``budget`` split evenly over the mixed tasks (earlier tasks get the remainder)."""
    mixed = [task for task, values in returns.items() if max(values) - min(values) > 1e-8]
    if not mixed:
        return {}
    share, remainder = divmod(budget, len(mixed))
    return {task: share + (i < remainder) for i, task in enumerate(mixed)}


class AdaptiveBudget:
    def __init__(
        self,
        probe: Annotated[int, Field(ge=2, description="first episodes per task; a variance needs two")] = 4,
        drop_zero_variance: Annotated[bool, Field(description="drop the probes of tasks whose returns are all "
                                                              "equal (unless every task is flat)")] = True,
    ):
        self.probe, self.drop_zero_variance = probe, drop_zero_variance

    async def rollout(self, session: RolloutSession, specs: list[EpisodeSpec]) -> list[GraphTrajectory]:
        per_task: dict[str, list[EpisodeSpec]] = {}
        for spec in specs:
            per_task.setdefault(spec.task_uid, []).append(spec)
        probes = await session.run([spec for group in per_task.values() for spec in group[: self.probe]])
        session.score(probes)
        groups = by_task(probes)
        budget = sum(max(len(group) - self.probe, 0) for group in per_task.values())
        extra = extra_samples({task: [episode_return(t) for t in group] for task, group in groups.items()}, budget)
        more = [EpisodeSpec(f"{task}-x{i}", task, per_task[task][0].task) for task, n in extra.items()
                for i in range(n)]
        added = await session.run(more) if more else []
        if not self.drop_zero_variance or not extra:
            return probes + added
        return [t for t in probes if t.task_id in extra] + added
