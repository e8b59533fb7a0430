"""Built-in rewards: exact match on the outcome and a verifier's fix/break credit."""

from __future__ import annotations

import unimas
from unimas import GraphTrajectory


def _normalise(value) -> str:
    return str(value).strip() if value is not None else ""


def exact_match(trajectory: GraphTrajectory, task: dict, field: str = "answer", target: str = "answer") -> float:
    """1.0 when ``outcome[field]`` equals ``task[target]`` (as stripped strings)."""
    produced = trajectory.outcome.get(field)
    return float(produced is not None and _normalise(produced) == _normalise(task[target]))


def fix_or_break(
    trajectory: GraphTrajectory, task: dict, role: str = "verifier", proposal: str = "proposal",
    field: str = "answer", target: str = "answer",
) -> dict[str, float]:
    """Role-level credit for a checker: +1 for turning a wrong proposal right, -1 for breaking a right one."""
    expected = _normalise(task[target])
    was_right = _normalise(trajectory.outcome.get(proposal)) == expected
    is_right = _normalise(trajectory.outcome.get(field)) == expected
    return {role: float(is_right and not was_right) - float(was_right and not is_right)}


def format_ok(trajectory: GraphTrajectory, task: dict) -> dict[str, float]:
    """Turn-level: 1.0 for every turn whose output parsed, 0.0 otherwise."""
    return {turn.id: float(turn.parse_error is None) for turn in trajectory.turns()}


@unimas.hookimpl
def unimas_rewards():
    return {"exact_match": exact_match, "fix_or_break": fix_or_break, "format_ok": format_ok}
