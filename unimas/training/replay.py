"""Replay: earlier episodes mixed into a step's groups, with their staleness recorded per turn.

An ``algorithm.replay`` plugin (hook ``unimas_replay_buffers``) sees every
step's episodes once they are credited (:meth:`ReplayBuffer.observe`), may
put stored tasks back into the next step's task list
(:meth:`ReplayBuffer.revisit`), and returns copies of stored episodes to
train on with the fresh ones (:meth:`ReplayBuffer.mix`). A copy joins the
groups of its task like a fresh episode (same ``task_id``), its rewards are
re-scored by the run's reward entries, and each of its turns records
``staleness`` (steps since it was sampled) so a staleness-tolerant loss and
the metrics can tell old from new. Checkpoints hold what the buffer returns
from ``state()`` (plain JSON data) and hand it back through ``load_state``, so
a resumed run replays exactly what an unbroken one would; a buffer without
these two methods starts empty after a resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from unimas.controller.specs import EpisodeSpec
from unimas.trajectory import GraphTrajectory

if TYPE_CHECKING:
    from unimas.training.session import RolloutSession


class ReplayBuffer(Protocol):
    def observe(self, trajectories: list[GraphTrajectory], step: int) -> None:
        """Step ``step``'s credited episodes (the fresh ones): keep what is worth replaying."""

    def revisit(self, specs: list[EpisodeSpec], step: int) -> list[EpisodeSpec]:
        """The step's episode specs, possibly with stored tasks swapped in (return ``specs`` to keep them)."""

    def mix(self, fresh: list[GraphTrajectory], session: "RolloutSession") -> list[GraphTrajectory]:
        """Copies of stored episodes (see :func:`replayed_copy`) to train on with ``fresh``."""

    def state(self) -> Any:
        """Optional: the buffer's contents as JSON data, saved with each checkpoint."""

    def load_state(self, state: Any) -> None:
        """Optional: restore what :meth:`state` returned (resume)."""


def replayed_copy(trajectory: GraphTrajectory, sampled_step: int, step: int, episode_id: str,
                  task_id: str | None = None) -> GraphTrajectory:
    """A detached copy of a stored episode for step ``step``: new id, rewards cleared, staleness on every turn.

    ``task_id``: the group it joins this step (task uids are per step; default: the stored one).
    """
    copy = GraphTrajectory.from_dict(trajectory.to_dict())
    copy.episode_id = episode_id
    copy.task_id = task_id or copy.task_id
    copy.rewards = {}
    for turn in copy.turns():
        turn.reward = turn.advantage = None
        turn.staleness = step - sampled_step
    return copy
