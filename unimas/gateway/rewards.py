"""The ``agent_reward`` reward: what the agent posted for its own turns (``POST .../v1/rewards``).

Use it at ``level: turn``; turns the agent did not score get 0. The values go to credit as posted, which clips
those beyond ±1e6 (``unimas.algorithms.credit.REWARD_BOUND``), counts them in ``reward/clipped`` and records the originals.
"""

from __future__ import annotations

import unimas
from unimas.trajectory import GraphTrajectory


def agent_reward(trajectory: GraphTrajectory, task: dict) -> dict[str, int | float]:
    posted = trajectory.outcome.get("agent_rewards") or {}
    return {turn.id: posted[turn.id] for turn in trajectory.turns() if turn.id in posted}


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(f"the agent's outcome field {where} must be a finite number, not {value!r}")
    return float(value)


def agent_outcome_reward(trajectory: GraphTrajectory, task: dict) -> float:
    """``level: trajectory``: the number the agent put under ``reward`` in its outcome JSON."""
    if "reward" not in trajectory.outcome:
        raise ValueError("the agent's outcome JSON has no 'reward' (agent_outcome_reward reads "
                         "{\"reward\": <number>} from its last line)")
    return _number(trajectory.outcome["reward"], "reward")


def agent_role_rewards(trajectory: GraphTrajectory, task: dict) -> dict[str, float]:
    """``level: role``: the numbers the agent put under ``rewards`` (role -> number) in its outcome JSON."""
    rewards = trajectory.outcome.get("rewards")
    if not isinstance(rewards, dict):
        raise ValueError("the agent's outcome JSON has no 'rewards' object (agent_role_rewards reads "
                         "{\"rewards\": {\"<role>\": <number>}} from its last line)")
    return {str(role): _number(value, f"rewards.{role}") for role, value in rewards.items()}


@unimas.hookimpl
def unimas_rewards():
    return {"agent_reward": agent_reward, "agent_outcome_reward": agent_outcome_reward,
            "agent_role_rewards": agent_role_rewards}
