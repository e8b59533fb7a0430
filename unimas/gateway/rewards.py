"""The ``agent_reward`` reward: what the agent posted for its own turns (``POST .../v1/rewards``).

Use it at ``level: turn``; turns the agent did not score get 0.
"""

from __future__ import annotations

import unimas
from unimas.trajectory import GraphTrajectory


def agent_reward(trajectory: GraphTrajectory, task: dict) -> dict[str, float]:
    posted = trajectory.outcome.get("agent_rewards") or {}
    return {turn.id: float(posted[turn.id]) for turn in trajectory.turns() if turn.id in posted}


@unimas.hookimpl
def unimas_rewards():
    return {"agent_reward": agent_reward}
