"""``counterfactual``: a turn's credit against sibling continuations of the same decision.

Seeds: InfoPO (turn credit against a
counterfactual) and AT^2PO (turn-wise credit on a turn-level tree).
Forked siblings (``algorithm.rollout: entropy_branch``) share their history up
to a fork turn token for token; their fork turns, with the parent's turn at
the same point, are alternative actions in one state. Each of them gets its
episode's return minus the mean return of the *others* (leave-one-out), so the
turn is credited only with what it changed. Turns outside any sibling set
(unforked episodes, turns after a fork point) fall back to leave-one-out within
their task and role. Pair with ``estimator: passthrough``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Callable

from ._common import episode_return, leave_one_out

if TYPE_CHECKING:  # CreditedTurn's module imports torch; the registry lists this shaper without it
    from unimas.methods import CreditedTurn


def decision_key(c: CreditedTurn, forked_points: set[tuple[str, str]]) -> str | None:
    """The sibling set a turn belongs to: ``parent|fork turn``, or None."""
    traj = c.trajectory
    if traj.forked_from is not None and c.turn.id == traj.fork_turn:
        return f"{traj.forked_from}|{traj.fork_turn}"
    if (traj.episode_id, c.turn.id) in forked_points:
        return f"{traj.episode_id}|{c.turn.id}"
    return None


def counterfactual() -> Callable[[list[CreditedTurn]], list[float]]:
    def shape(turns: list[CreditedTurn]) -> list[float]:
        forked_points = {(c.trajectory.forked_from, c.trajectory.fork_turn) for c in turns
                         if c.trajectory.forked_from is not None}
        members: dict[str, list[int]] = defaultdict(list)
        for i, c in enumerate(turns):
            key = decision_key(c, forked_points) or f"{c.trajectory.task_id}|{c.turn.role}|fallback"
            c.key = key
            members[key].append(i)
        signal = [0.0] * len(turns)
        for indices in members.values():
            for i, value in zip(indices, leave_one_out([episode_return(turns[i].trajectory) for i in indices])):
                signal[i] = value
        return signal

    return shape
