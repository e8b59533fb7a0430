"""``verified_successes``: replay of verified successful episodes into later groups (RePO/RLEP).

Seeds: RePO "augments each prompt's GRPO
group with off-policy samples retrieved from a replay buffer"; RLEP
"collect verified trajectories, then blend replayed successes with fresh
rollouts". Episodes whose return reaches ``threshold`` are kept (the newest
``per_task`` per task, none older than ``max_age`` steps). Each step a
``revisit`` share of the task list is swapped for stored tasks, and every
task of the step whose fresh episodes *all* fall short gets up to
``per_group`` stored successes mixed into its group — the case where GRPO has
no signal at all. Mixed-in turns record their staleness.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Annotated, Any

from pydantic import Field, FiniteFloat, NonNegativeInt, PositiveInt, Strict, StrictStr, TypeAdapter

from unimas import GraphTrajectory
from unimas.methods import EpisodeSpec, RolloutSession, by_task, episode_return, replayed_copy


_STATE = TypeAdapter(list[tuple[StrictStr, list[tuple[Annotated[NonNegativeInt, Strict()], StrictStr]]]])
"""What :meth:`VerifiedSuccesses.state` returns, as JSON gives it back (tuples arrive as lists)."""


def task_identity(task: dict[str, Any]) -> str:
    """The same dataset row across steps (task uids are per step): its ``id``, else its content."""
    return str(task["id"]) if "id" in task else json.dumps(task, sort_keys=True, default=str)


class VerifiedSuccesses:
    def __init__(
        self,
        threshold: Annotated[FiniteFloat, Field(description="an episode whose return reaches it is kept")] = 1.0,
        per_task: Annotated[PositiveInt, Field(description="newest successes kept per dataset row")] = 2,
        per_group: Annotated[PositiveInt, Field(description="stored successes mixed into a group whose fresh "
                                                            "episodes all fall short")] = 1,
        revisit: Annotated[float, Field(ge=0, le=1, description="share of a step's tasks swapped for stored "
                                                                "rows")] = 0.25,
        max_age: Annotated[PositiveInt, Field(description="steps after which a row's successes are "
                                                          "forgotten")] = 50,
    ):
        self.threshold, self.per_task, self.per_group = threshold, per_task, per_group
        self.revisit_share, self.max_age = revisit, max_age
        self.kept: OrderedDict[str, list[tuple[GraphTrajectory, int]]] = OrderedDict()

    def observe(self, trajectories: list[GraphTrajectory], step: int) -> None:
        for traj in trajectories:
            if not traj.failed and traj.forked_from is None and episode_return(traj) >= self.threshold:
                key = task_identity(traj.task)
                stored = self.kept.setdefault(key, [])
                stored.append((traj, step))
                del stored[: -self.per_task]
                self.kept.move_to_end(key)
        for task in [t for t, stored in self.kept.items() if step - stored[-1][1] > self.max_age]:
            del self.kept[task]

    def revisit(self, specs: list[EpisodeSpec], step: int) -> list[EpisodeSpec]:
        uids = list(dict.fromkeys(spec.task_uid for spec in specs))
        present = {task_identity(spec.task) for spec in specs}
        stored = [key for key in reversed(self.kept) if key not in present]
        swaps = dict(zip(uids[len(uids) - int(len(uids) * self.revisit_share):], stored))
        return [EpisodeSpec(spec.episode_id, spec.task_uid, self.kept[swaps[spec.task_uid]][-1][0].task)
                if spec.task_uid in swaps else spec for spec in specs]

    def state(self) -> list:
        """``[[task key, [[step, episode JSON], ...]], ...]`` in keeping order (the oldest kept task first)."""
        return [[key, [[step, traj.to_json()] for traj, step in stored]] for key, stored in self.kept.items()]

    def load_state(self, state: list) -> None:
        """Restore :meth:`state`'s list; one of another shape is refused (a ``ValidationError``) before any change."""
        checked = _STATE.validate_python(state)
        self.kept = OrderedDict((key, [(GraphTrajectory.from_json(text), step) for step, text in stored])
                                for key, stored in checked)

    def mix(self, fresh: list[GraphTrajectory], session: RolloutSession) -> list[GraphTrajectory]:
        session.score(fresh)
        mixed = []
        for uid, group in by_task(fresh).items():
            key = task_identity(group[0].task)
            if key not in self.kept or any(episode_return(t) >= self.threshold for t in group):
                continue
            for i, (stored, born) in enumerate(self.kept[key][-self.per_group:]):
                mixed.append(replayed_copy(stored, born, session.step, f"{uid}-replay{i}", task_id=uid))
        return mixed
