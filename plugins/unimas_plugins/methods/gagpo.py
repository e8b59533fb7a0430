"""``gagpo``: TD/GAE turn advantages from a critic-free grouped value proxy.

Seed: GAGPO "critic-free grouped value proxy
from rollouts; TD/GAE-style step advantages; group normalization". The value
of a turn's state ``V(h)`` is the mean episode return over the step's
episodes of the same task that reached the same state ``h`` (same role, same
prompt ids). With the episode's turns ``t = 0..T-1`` and its return ``R``
(its last turn's reward)::

    delta_t = gamma * V(h_{t+1}) - V(h_t)        (t < T-1)
    delta_{T-1} = R - V(h_{T-1})
    A_t = sum_l (gamma * lam) ** l * delta_{t+l}

A turn whose state is new to the group has ``V(h)`` = the task's mean return.
``normalize`` divides by the std of ``A`` within each task/role group.
Pair with ``estimator: passthrough``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field, PositiveFloat

from ._common import episode_return, group_means, history_key

if TYPE_CHECKING:  # CreditedTurn's module imports torch; the registry lists this shaper without it
    from unimas.methods import CreditedTurn


def gagpo(
    gamma: Annotated[float, Field(ge=0, le=1, description="discount between a turn's state and the next")] = 1.0,
    lam: Annotated[float, Field(ge=0, le=1, description="GAE mixing: 0 = one-step TD, 1 = the whole return")] = 1.0,
    normalize: Annotated[bool, Field(description="divide by the std of the advantages of each task/role "
                                                 "group")] = False,
    epsilon: Annotated[PositiveFloat, Field(description="added to that std")] = 1e-6,
):
    def shape(turns: list[CreditedTurn]) -> list[float]:
        episodes = list({id(c.trajectory): c.trajectory for c in turns}.values())
        returns = {id(t): episode_return(t) for t in episodes}
        values = group_means((history_key(t, turn), returns[id(t)]) for t in episodes for turn in t.turns())
        task_means = group_means((t.task_id, returns[id(t)]) for t in episodes)
        advantage: dict[int, float] = {}
        for traj in episodes:
            path = traj.turns()
            v = [values[history_key(traj, turn)][0] if values[history_key(traj, turn)][2] > 1
                 else task_means[traj.task_id][0] for turn in path]
            running = 0.0
            for t in reversed(range(len(path))):
                target = returns[id(traj)] if t == len(path) - 1 else gamma * v[t + 1]
                running = (target - v[t]) + gamma * lam * running
                advantage[id(path[t])] = running
        signal = [advantage[id(c.turn)] for c in turns]
        if not normalize:
            return signal
        spread = group_means((f"{c.trajectory.task_id}|{c.turn.role}", a) for c, a in zip(turns, signal))
        return [a / (spread[f"{c.trajectory.task_id}|{c.turn.role}"][1] + epsilon) for c, a in zip(turns, signal)]

    return shape
