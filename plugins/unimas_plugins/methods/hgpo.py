"""``hgpo``: turn advantages from a hierarchy of groups by history consistency.

Seed: HGPO "groups steps hierarchically by
history consistency; adaptively weights per-group advantages". Level 0 groups
a turn with every turn of its role on the same task (plain GRPO); level 1
only with turns whose whole context (prompt token ids) is identical — the
same state, e.g. listeners that received the same message. A turn's
advantage is the weighted mean of its group-relative advantages over the
levels whose group has at least two members, level ``l`` weighted
``alpha ** l`` (``alpha > 1`` trusts the more consistent, narrower groups more).
Pair with ``estimator: passthrough``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field, PositiveFloat

from ._common import group_means, history_key

if TYPE_CHECKING:  # CreditedTurn's module imports torch; the registry lists this shaper without it
    from unimas.methods import CreditedTurn


def hgpo(
    alpha: Annotated[PositiveFloat, Field(description="weight base of the levels: level l counts alpha ** l (> 1 "
                                                      "trusts the narrower same-history groups more)")] = 2.0,
    norm_by_std: Annotated[bool, Field(description="divide each group-centred reward by its group's std")] = True,
    epsilon: Annotated[PositiveFloat, Field(description="added to that std")] = 1e-6,
):

    def shape(turns: list[CreditedTurn]) -> list[float]:
        keys = [[f"{c.trajectory.task_id}|{c.turn.role}", history_key(c.trajectory, c.turn)] for c in turns]
        stats = [group_means((k[level], c.turn.reward) for k, c in zip(keys, turns)) for level in range(2)]
        signal = []
        for k, c in zip(keys, turns):
            total = weight = 0.0
            for level, table in enumerate(stats):
                mean, std, count = table[k[level]]
                if count < 2:
                    continue
                advantage = c.turn.reward - mean
                total += alpha ** level * (advantage / (std + epsilon) if norm_by_std else advantage)
                weight += alpha ** level
            signal.append(total / weight if weight else 0.0)
        return signal

    return shape
