"""Update order across roles and model groups.

By default every model group updates once per step, all in parallel, on all
the turns it owns. An ``algorithm.update_order`` plugin (hook
``unimas_update_orders``) instead returns *stages* of roles: the stages run
one after another, and within a stage each model group updates once on the
turns of that stage's roles. A role's turns therefore meet weights that the
earlier stages already changed — also on a model shared by several roles,
where sequential per-role updates are the only way to order them. Before
each stage the plugin may ``adjust`` its turns (for example their
advantages) knowing what the already-updated stages reported: their update
statistics (``ppo_kl``, ``clip_frac``: how far their importance ratios moved)
and, for an order with ``needs_ratios = True``, per episode the product of the
probability ratios new/behaviour of every turn the earlier stages trained
(each group scores its stage's turns after updating: one forward pass). That
product is what a sequential trust-region update (HAPPO, SeeUPO) weighs the
next role's advantages by: the later role learns against the team the earlier
ones have just become.

A group updated in several stages reports the mean of each statistic over
its stages, except counters (:data:`COUNTERS`), which report the last stage's.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from typing import Mapping, Sequence

from unimas.contract.protocols import UpdateOrder, capability
from unimas.errors import ModelGroupError, UserError
from unimas.groups.base import TrainTurn
from unimas.groups.base import Transport

COUNTERS = frozenset({"weight_version"})
"""Statistics that count updates: after several stages the last value is the group's state, not the mean."""


def execution_order(roles_in_time: Sequence[tuple[float, str]]) -> list[str]:
    """Roles by the time of their first turn (``(started, role)`` pairs of a step's turns)."""
    first: dict[str, float] = {}
    for started, role in roles_in_time:
        first[role] = min(started, first.get(role, started))
    return sorted(first, key=lambda role: (first[role], role))


async def update_groups(transport: Transport, turns_by_group: Mapping[str, list[TrainTurn]],
                        roles_by_group: Mapping[str, list[str]], order: UpdateOrder | None = None,
                        execution: Sequence[str] = ()) -> dict[str, dict[str, float]]:
    """Update the groups in ``order``'s stages (or all at once); returns each group's statistics.

    ``roles_by_group[g][i]`` is the role of ``turns_by_group[g][i]``.
    """
    if order is None:
        groups = sorted(turns_by_group)
        results = await asyncio.gather(*(transport.update(g, turns_by_group[g]) for g in groups))
        return dict(zip(groups, results))
    by_role: dict[str, dict[str, list[TrainTurn]]] = defaultdict(lambda: defaultdict(list))
    for group, turns in turns_by_group.items():
        for role, turn in zip(roles_by_group[group], turns, strict=True):
            by_role[role][group].append(turn)
    stages = order.stages([role for role in execution if role in by_role] +
                          sorted(role for role in by_role if role not in execution))
    listed = [role for stage in stages for role in stage]
    if sorted(listed) != sorted(by_role):
        raise ValueError(f"update order {type(order).__name__} returned stages {stages}; they must list each of "
                         f"the roles {sorted(by_role)} exactly once")
    done: dict[str, dict[str, float]] = {}
    per_group: dict[str, list[dict[str, float]]] = defaultdict(list)
    with_ratios = capability(order, UpdateOrder, "needs_ratios")
    ratios: dict[str, float] = defaultdict(lambda: 1.0)
    for stage in stages:
        stage_turns: dict[str, list[TrainTurn]] = defaultdict(list)
        owners: dict[str, list[str]] = defaultdict(list)
        for role in stage:
            for group, turns in by_role.get(role, {}).items():
                extra = {"ratios": dict(ratios)} if with_ratios else {}
                stage_turns[group].extend(order.adjust(role, turns, done, **extra))
                owners[group].append(role)
        groups = sorted(g for g in stage_turns if stage_turns[g])
        results = await asyncio.gather(*(transport.update(g, stage_turns[g]) for g in groups))
        for group, stats in zip(groups, results):
            per_group[group].append(stats)
            done.update({role: stats for role in owners[group]})
        if with_ratios and stage is not stages[-1]:
            await _multiply_ratios(transport, {g: stage_turns[g] for g in groups}, ratios, order)
    # a key some stages lack (a critic's per-role statistics) is the mean over the stages that report it
    return {group: {key: runs[-1][key] if key in COUNTERS else
                    sum(s[key] for s in runs if key in s) / sum(key in s for s in runs)
                    for key in dict.fromkeys(k for s in runs for k in s)} for group, runs in per_group.items()}


async def _multiply_ratios(transport: Transport, trained: Mapping[str, list[TrainTurn]], ratios: dict[str, float],
                           order: UpdateOrder) -> None:
    """Fold each just-trained turn's ratio new/behaviour (log-probs summed over its tokens) into its episode's."""
    groups = sorted(trained)
    try:
        scores = await asyncio.gather(*(transport.score(g, trained[g]) for g in groups))
    except ModelGroupError as failure:
        if isinstance(failure.cause, NotImplementedError):
            raise UserError(f"update order {type(order).__name__} needs probability ratios, and {failure.cause}",
                            where="algorithm.update_order") from None
        raise
    for group, new in zip(groups, scores):
        for turn, logp in zip(trained[group], new, strict=True):
            ratios[turn.episode] *= math.exp(logp - sum(turn.rollout_logprobs))
