"""What an algorithm plugin is handed during one step: the rollout session, and helpers to read its episodes.

A rollout control (:mod:`unimas.training.rollout`) and a replay buffer
(:mod:`unimas.training.replay`) both work through a :class:`RolloutSession`;
it lives here, apart from both, so neither imports the other, type-only
imports included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from unimas.controller.episodes import Controller
from unimas.controller.forking import fork_specs
from unimas.controller.specs import EpisodeSpec
from unimas.trajectory import GraphTrajectory

if TYPE_CHECKING:
    from unimas.algorithms.credit import CreditAssigner


class RolloutSession:
    """A rollout control's handle on one step: run, fork and score episodes.

    Plugins see it through its protocol, :class:`unimas.contract.protocols.RolloutSession`
    (``unimas.methods.RolloutSession``), which names what they may call; the controller and the
    credit assigner it holds are internal.
    """

    def __init__(self, controller: Controller, credit: "CreditAssigner", step: int, group_size: int):
        self.controller = controller
        self.credit = credit
        self.step = step
        self.group_size = group_size

    async def run(self, specs: list[EpisodeSpec]) -> list[GraphTrajectory]:
        return await self.controller.run(specs)

    async def fork(self, forks: Sequence[tuple[GraphTrajectory, int, int]]) -> list[GraphTrajectory]:
        """Run ``(parent, k, siblings)`` forks concurrently: each sibling replays ``parent``'s first ``k`` turns."""
        specs = [spec for parent, k, siblings in forks for spec in fork_specs(parent, k, siblings)]
        return await self.controller.run(specs)

    def score(self, trajectories: Sequence[GraphTrajectory]) -> None:
        """Allocate rewards now (``turn.reward``), for decisions; credit re-scores them identically later."""
        self.credit.allocate(trajectories)


def episode_return(trajectory: GraphTrajectory) -> float:
    """One number per scored episode: the mean reward of its turns (0 for a failed or empty one)."""
    turns = trajectory.turns()
    if trajectory.failed or not turns:
        return 0.0
    return sum(t.reward or 0.0 for t in turns) / len(turns)


def by_task(trajectories: Sequence[GraphTrajectory]) -> dict[str, list[GraphTrajectory]]:
    """Trajectories grouped by ``task_id`` (the GRPO group they are normalised in), in the order given."""
    groups: dict[str, list[GraphTrajectory]] = {}
    for traj in trajectories:
        groups.setdefault(traj.task_id, []).append(traj)
    return groups
