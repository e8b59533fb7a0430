"""Replay: earlier episodes mixed into a step's groups, with their staleness recorded per turn.

An ``algorithm.replay`` plugin (hook ``unimas_replay_buffers``) sees every
step's episodes once they are credited (``observe``), may put stored tasks
back into the next step's task list (``revisit``), and returns copies of
stored episodes to train on with the fresh ones (``mix``; the protocol is
:class:`unimas.contract.protocols.ReplayBuffer`). A copy joins the
groups of its task like a fresh episode (same ``task_id``), its rewards are
re-scored by the run's reward entries, and each of its turns records
``staleness`` (steps since it was sampled) so a staleness-tolerant loss and
the metrics can tell old from new. Checkpoints hold what the buffer returns
from ``state()`` (plain JSON data) and hand it back through ``load_state``, so
a resumed run replays exactly what an unbroken one would; a buffer without
these two methods starts empty after a resume.
"""

from __future__ import annotations

from unimas.trajectory import GraphTrajectory


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
