"""``reverse_execution``: one update per role, sequentially, in reverse execution order (SeeUPO).

Seed: SeeUPO (reference/seed-papers.md, 000:237) "turn-by-turn sequential
policy updates in reverse execution order, [which] ensures monotonic
improvement ... via backward induction". The role that acted last updates
first; each earlier role then updates on weights its successors already
moved — on a model shared by all roles too, where a parallel update would mix
them into one step. ``damp`` > 0 scales a role's advantages by
``exp(-damp * ppo_kl)`` of the roles updated before it (a trust-region
reading of how far their ratios moved); 0 leaves them unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from unimas.groups.base import TrainTurn


class ReverseExecution:
    def __init__(self, damp: float = 0.0):
        if damp < 0:
            raise ValueError("damp must be >= 0")
        self.damp = damp

    def stages(self, execution: list[str]) -> list[list[str]]:
        return [[role] for role in reversed(execution)]

    def adjust(self, role: str, turns: list[TrainTurn], done: Mapping[str, Mapping[str, float]]) -> list[TrainTurn]:
        if not self.damp or not done:
            return turns
        moved = sum(stats.get("ppo_kl", 0.0) for stats in done.values())
        scale = math.exp(-self.damp * abs(moved))
        return [dataclasses.replace(turn, advantage=turn.advantage * scale) for turn in turns]
