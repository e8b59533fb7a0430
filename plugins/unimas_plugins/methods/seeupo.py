"""``reverse_execution``: one update per role, sequentially, in reverse execution order (SeeUPO).

Seed: SeeUPO "turn-by-turn sequential
policy updates in reverse execution order, [which] ensures monotonic
improvement ... via backward induction". The role that acted last updates
first; each earlier role then updates on weights its successors already
moved — on a model shared by all roles too, where a parallel update would mix
them into one step. ``damp`` > 0 scales a role's advantages by
``exp(-damp * ppo_kl)`` of the roles updated before it (a trust-region
reading of how far their ratios moved); 0 leaves them unchanged.
``ratio_clip`` > 0 is the per-episode form (HAPPO's sequential trust region):
each turn's advantage is multiplied by the product of the probability ratios
new/behaviour of the turns the earlier stages trained in the same episode,
clipped to ``[1 - ratio_clip, 1 + ratio_clip]``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Mapping, Optional

from pydantic import Field

from unimas import TrainTurn


class ReverseExecution:
    def __init__(
        self,
        damp: Annotated[float, Field(ge=0, description="scale a role's advantages by exp(-damp * ppo_kl) of the "
                                                       "roles updated before it; 0 = off")] = 0.0,
        ratio_clip: Annotated[float, Field(ge=0, lt=1, description="> 0: weigh each turn's advantage by the "
                                                                   "earlier stages' ratios in its episode, clipped "
                                                                   "to [1 - ratio_clip, 1 + ratio_clip]")] = 0.0,
    ):
        self.damp, self.ratio_clip = damp, ratio_clip

    @property
    def needs_ratios(self) -> bool:
        return self.ratio_clip > 0

    @property
    def rescales_advantages(self) -> bool:
        return self.damp > 0 or self.ratio_clip > 0

    def stages(self, execution: list[str]) -> list[list[str]]:
        return [[role] for role in reversed(execution)]

    def adjust(self, role: str, turns: list[TrainTurn], done: Mapping[str, Mapping[str, float]],
               ratios: Optional[Mapping[str, float]] = None) -> list[TrainTurn]:
        scale = math.exp(-self.damp * abs(sum(s.get("ppo_kl", 0.0) for s in done.values()))) if self.damp else 1.0
        low, high = 1 - self.ratio_clip, 1 + self.ratio_clip
        factor = {t.episode: min(max(ratios.get(t.episode, 1.0), low), high) for t in turns} if ratios else {}
        if scale == 1.0 and not factor:
            return turns
        return [dataclasses.replace(turn, advantage=turn.advantage * scale * factor.get(turn.episode, 1.0))
                for turn in turns]
