"""Is each role still exploring? ``role/<role>/distinct_answers`` and the one warning for a collapsed role.

A role whose policy collapses (a critic that stopped sampling its reject token) gives GRPO nothing to
compare: every episode of a task gets the same answer, the group's advantages are zero, and the role stops
learning while the run looks healthy. Two numbers show it (docs/metrics.md): ``role/<role>/entropy``, the
mean token entropy of the role's trained turns (reported by its model group's update,
:func:`unimas.algorithms.losses.role_entropy`), and ``role/<role>/distinct_answers``, computed here from
the step's episodes. :class:`CollapseWatch` turns a low entropy that lasts into one warning per role,
naming the per-role setting that counters it (``roles.<role>.entropy_coef``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Iterable, Mapping

from unimas.config.schema import EntropyWarningConfig, RoleConfig
from unimas.output.checkpoints import notice
from unimas.trajectory import GraphTrajectory


def _answer(turn: Any) -> str:
    """What a turn answered: its parsed value when the parser read one, else its stripped text."""
    return str(turn.parsed) if turn.parse_error is None and turn.parsed is not None else turn.text.strip()


def distinct_answers(trajectories: Iterable[GraphTrajectory], roles: Iterable[str]) -> dict[str, float]:
    """``role/<role>/distinct_answers``: per task, how many different answers the role gave over the task's
    episodes (its ``group_size`` samples), averaged over the step's tasks. 1.0 = every sample of a task
    answered the same (nothing for a group-normalised estimator to compare); roles without turns are left out."""
    answers: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for trajectory in trajectories:
        for turn in trajectory.turns():
            answers[turn.role][trajectory.task_id].add(_answer(turn))
    return {f"role/{role}/distinct_answers": statistics.fmean(len(seen) for seen in answers[role].values())
            for role in roles if answers.get(role)}


class CollapseWatch:
    """Warns once per trainable role whose ``role/<role>/entropy`` stays below ``below`` for ``steps`` steps
    in a row (``logging.entropy_warning``); a step without the metric (no update) neither counts nor resets."""

    def __init__(self, roles: Mapping[str, RoleConfig], settings: EntropyWarningConfig | None):
        self.settings = settings
        self.roles = [name for name, role in roles.items() if role.trainable]
        self.low: dict[str, int] = defaultdict(int)
        self.warned: set[str] = set()

    def observe(self, metrics: Mapping[str, Any]) -> list[str]:
        """Count this step's record; the roles warned about now (each at most once per run)."""
        if self.settings is None:
            return []
        warned = []
        for role in self.roles:
            value = metrics.get(f"role/{role}/entropy")
            if not isinstance(value, (int, float)) or role in self.warned:
                continue
            self.low[role] = self.low[role] + 1 if value < self.settings.below else 0
            if self.low[role] >= self.settings.steps:
                self.warned.add(role)
                warned.append(role)
                notice(f"role '{role}' has stopped exploring: its mean token entropy has been below "
                       f"{self.settings.below:g} for {self.low[role]} steps (now {value:.3g}, step "
                       f"{metrics.get('step')}); its samples barely differ, so its advantages vanish. Raise its "
                       f"exploration alone with roles.{role}.entropy_coef (or its generation.temperature); "
                       "logging.entropy_warning sets this check")
        return warned
