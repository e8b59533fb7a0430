"""From rewards to one advantage per trainable turn: the one credit path.

:meth:`CreditAssigner.assign` takes a step's trajectories and runs three
stages, writing each turn's ``reward`` and ``advantage`` exactly once:

1. **Reward allocation** (:meth:`CreditAssigner.allocate`, also used alone by
   evaluation). Each reward plugin scores an episode at the level its config
   entry names; the reward of a turn ``t`` of role ``r`` is::

       reward(t) = sum over trajectory rewards  w * R
                 + sum over role rewards        w * R[r]
                 + sum over turn rewards        w * R[t.id]

   where an entry with ``roles: [...]`` only reaches turns of those roles. A
   failed episode (workflow or reward exception) scores 0 everywhere.

   **Range.** A reward value must be a finite number: NaN and ±inf fail the
   episode (:class:`RewardValueError`). A finite value beyond
   ±:data:`REWARD_BOUND` (1e6) is clipped to it, and so is each weighted term
   ``w * R`` and each turn's sum; the trajectory keeps what the plugin
   returned in ``unclipped_rewards`` and the step counts the clipped values
   in ``reward/clipped``. Clipping rather than failing, because a reward of
   1e308 is still a clear signal of "much better", while its square (in a
   group's std), a sum of two of them, or its float32 copy in the estimator is
   inf, and that would turn the whole group's advantages into NaN.
2. **Grouping** (``algorithm.grouping``): which turns are normalised together
   — ``role``: all turns of one role across the G episodes of one task;
   ``role_turn``: also split by the role's turn index; ``trajectory``: all
   turns of the task's G episodes together.
3. **Estimation**: the turns' rewards go through the estimator (plugin or
   verl, see :mod:`unimas.algorithms.estimators`) as a ``(turns, 1)`` tensor; the
   backend broadcasts each advantage over the turn's response tokens.

The diagnostics (per-reward per-role means, zero-variance groups, advantage
spread) are computed here, once, and returned with the credited turns.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from unimas.algorithms import verl_catalog
from unimas.algorithms.estimators import Estimator
from unimas.config.schema import ExperimentConfig, RewardConfig
from unimas.errors import UserError, describe
from unimas.trajectory import GraphTrajectory, TurnNode

if TYPE_CHECKING:
    import torch


REWARD_BOUND = 1e6
"""Largest magnitude of a reward value, a weighted term and a turn's reward: values beyond are clipped.

Far above any sensible reward scale, and small enough that sums, squares and
the float32 tensors of the estimators stay finite."""


def is_finite_number(value: Any) -> bool:
    """An int or float (not a bool) that is not NaN or ±inf; an int too large for a float counts as finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def clip_reward(value: int | float) -> tuple[float, bool]:
    """A finite reward value as a float within ±REWARD_BOUND, and whether it had to be clipped."""
    if abs(value) > REWARD_BOUND:
        return (REWARD_BOUND if value > 0 else -REWARD_BOUND), True
    return float(value), False


def reward_keys(rewards: Sequence[RewardConfig]) -> list[str]:
    """Stable names under which each reward entry's value is stored (``name``, or ``name#i`` when repeated)."""
    counts = Counter(r.name for r in rewards)
    return [r.name if counts[r.name] == 1 else f"{r.name}#{i}" for i, r in enumerate(rewards)]


@dataclass
class CreditedTurn:
    trajectory: GraphTrajectory
    turn: TurnNode
    key: str
    """Group key: turns with the same key are normalised together."""
    signal: float = 0.0
    """The turn's credit scalar handed to the estimator (the shaper's signal, else its reward); a group with a
    critic puts it on the turn's last token for GAE (docs/critic.md)."""

    @property
    def reward(self) -> float:
        return self.turn.reward

    @property
    def advantage(self) -> float:
        return self.turn.advantage


@dataclass
class Credit:
    turns: list[CreditedTurn] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


class CreditAssigner:
    """Owns a run's reward entries, reward functions, trainable roles, grouping and estimator."""

    def __init__(self, config: ExperimentConfig, functions: Mapping[str, Callable[..., Any]], estimator: Estimator):
        self.config = config
        self.entries = list(zip(reward_keys(config.rewards), config.rewards))
        self.functions = functions
        self.estimator = estimator
        self.trainable_roles = {name for name, role in config.roles.items()
                                if role.trainable and config.models[role.model].trainable}
        self.shaper: Callable[[list[CreditedTurn]], list[float]] | None = None
        """``algorithm.credit``'s per-turn signal (it may rewrite keys); set by :class:`unimas.training.rollout.Rollout`."""

    # -- 1. allocation ------------------------------------------------------
    def _score(self, trajectory: GraphTrajectory, key: str, spec: RewardConfig) -> Any:
        """One reward plugin on one episode, its return value checked against the level and clipped.

        A wrong shape, a NaN or a key the run does not have raises
        :class:`RewardValueError`: a reward that misbehaves on some inputs fails
        those episodes, like a reward that raises. A value beyond
        ±``REWARD_BOUND`` is clipped; the original goes to ``trajectory.unclipped_rewards[key]``.
        """
        function = self.functions[spec.name]
        value = function(trajectory, trajectory.task, **spec.params)
        if spec.level == "trajectory":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RewardValueError(f"returned {type(value).__name__}; at level 'trajectory' it must return a "
                                       "number", function)
            counted, clipped = clip_reward(_finite(value, function))
            if clipped:
                trajectory.unclipped_rewards[key] = _original(value)
            return counted
        if not isinstance(value, Mapping):
            raise RewardValueError(f"returned {type(value).__name__}; at level '{spec.level}' it must return a dict "
                                   f"of {spec.level} -> number", function)
        known = set(self.config.roles) if spec.level == "role" else {t.id for t in trajectory.turns()}
        unknown = sorted(str(k) for k in value if str(k) not in known)
        if unknown:
            noun = "roles" if spec.level == "role" else "turn node ids in this episode"
            raise RewardValueError(f"returned {_first_few(unknown)}, which are not {noun} (known: "
                                   f"{', '.join(sorted(known)) or 'none'}); its value would reach no turn", function)
        scored, originals = {}, {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise RewardValueError(f"returned {type(v).__name__} for {k!r}; values must be numbers", function)
            scored[str(k)], clipped = clip_reward(_finite(v, function))
            if clipped:
                originals[str(k)] = _original(v)
        if originals:
            trajectory.unclipped_rewards[key] = originals
        return scored

    def allocate(self, trajectories: Sequence[GraphTrajectory]) -> dict[str, float]:
        """Score every episode and write each turn's ``reward``; returns ``reward/<key>/<role>`` means and
        ``reward/clipped``.

        A reward that raises, returns the wrong shape or a non-finite number
        fails its episode (recorded with the file and line of the reward's
        code); the run goes on unless the failure budget is spent. Values
        beyond ±``REWARD_BOUND`` are clipped and counted (see the module docstring).
        """
        sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])  # (key, role) -> [sum, count]
        clipped = 0
        for trajectory in trajectories:
            trajectory.unclipped_rewards = {}  # scoring again (rollout.score, then credit) starts afresh
            for key, spec in self.entries:
                if trajectory.failed:
                    break
                try:
                    trajectory.rewards[key] = self._score(trajectory, key, spec)
                except UserError:
                    raise
                except (Exception, SystemExit) as exc:  # noqa: BLE001 - a reward bug fails the episode, not the run
                    trajectory.fail(f"reward '{spec.name}' (rewards.{key}): {describe(exc)}", exc)
            if trajectory.failed:
                trajectory.rewards = {key: 0.0 if spec.level == "trajectory" else {} for key, spec in self.entries}
                trajectory.unclipped_rewards = {}
            clipped += sum(len(v) if isinstance(v, dict) else 1 for v in trajectory.unclipped_rewards.values())
            for turn in trajectory.turns():
                reward, beyond = 0.0, False
                for key, spec in self.entries:
                    if spec.roles is not None and turn.role not in spec.roles:
                        continue
                    value = trajectory.rewards[key]
                    part = value if spec.level == "trajectory" else value.get(
                        turn.role if spec.level == "role" else turn.id, 0.0)
                    term, over = clip_reward(spec.weight * part)  # a large weight can overflow to ±inf: clipped
                    reward += term
                    beyond |= over
                    tally = sums[key, turn.role]
                    tally[0] += part
                    tally[1] += 1
                turn.reward, over = clip_reward(reward)
                clipped += beyond or over
        metrics = {f"reward/{key}/{role}": total / count for (key, role), (total, count) in sums.items()}
        metrics["reward/clipped"] = float(clipped)
        return metrics

    # -- 2. grouping --------------------------------------------------------
    def group_key(self, trajectory: GraphTrajectory, turn: TurnNode, grouping: str | None = None) -> str:
        """``grouping`` defaults to ``algorithm.grouping`` (``assign`` reads it once per step)."""
        grouping = grouping or self.config.algorithm.grouping
        if grouping == "role":
            return f"{trajectory.task_id}|{turn.role}"
        if grouping == "role_turn":
            return f"{trajectory.task_id}|{turn.role}|{turn.role_turn_index}"
        return trajectory.task_id

    # -- the whole path -----------------------------------------------------
    def assign(self, trajectories: Sequence[GraphTrajectory]) -> Credit:
        """Allocation -> grouping -> estimation for one training step."""
        metrics = self.allocate(trajectories)
        grouping, trainable = self.config.algorithm.grouping, self.trainable_roles
        turns = [CreditedTurn(t, turn, self.group_key(t, turn, grouping))
                 for t in trajectories if not t.failed
                 for turn in t.turns() if turn.role in trainable and turn.response_ids and not turn.replayed]
        metrics["credit/nonfinite_advantages"] = 0.0
        if not turns:
            return Credit([], metrics)
        # 3. estimation
        algorithm = self.config.algorithm
        signal = self.shaper(turns) if self.shaper is not None else [c.turn.reward for c in turns]
        import torch  # here, not at the top: reading metrics or a report imports this module without training

        scores = torch.tensor([[value] for value in signal], dtype=torch.float32)
        if self.estimator.needs_critic:  # per-token advantages come from a critic: the groups' or the central one
            advantages = torch.zeros_like(scores)
        elif _underlying(self.estimator.fn) is _verl_grpo():
            advantages = grouped_advantages(scores, [c.key for c in turns], algorithm.norm_by_std)
        else:
            index = np.array([c.key for c in turns], dtype=object)
            advantages = self.estimator(scores, index, norm_by_std=algorithm.norm_by_std, gamma=algorithm.gamma)
        for credited, value, credit in zip(turns, advantages[:, 0].tolist(), scores[:, 0].tolist()):
            credited.turn.advantage, credited.signal = value, credit
        finite = [c for c in turns if math.isfinite(c.turn.advantage) and math.isfinite(c.signal)]
        metrics["credit/nonfinite_advantages"] = float(len(turns) - len(finite))  # they never reach an optimiser
        if finite:
            metrics.update(_diagnostics(finite, per_turn_advantages=not self.estimator.needs_critic))
        return Credit(finite, metrics)


def _underlying(fn: Callable[..., Any]) -> Callable[..., Any]:
    """verl's own function behind a catalog entry (:mod:`unimas.algorithms.verl_catalog`); else ``fn``."""
    return fn.resolve() if isinstance(fn, verl_catalog.VerlFunction) else fn


def _verl_grpo() -> Callable[..., Any]:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    return compute_grpo_outcome_advantage


def grouped_advantages(scores: torch.Tensor, keys: Sequence[str], norm_by_std: bool,
                       epsilon: float = 1e-6) -> torch.Tensor:
    """verl's GRPO outcome advantage, (turns, 1), computed for all groups of one size at once.

    verl's function indexes one turn at a time (~6 ms per 192 turns, a
    third of a 3-role step's framework time). The same float32 mean and std
    reductions over the same values, batched per group size, give the same
    bits (``tests/test_async_pipeline.py`` compares them); a lone turn keeps
    mean 0 and std 1, as there.
    """
    import torch

    flat = scores[:, 0].clone()
    members: dict[str, list[int]] = defaultdict(list)
    for row, key in enumerate(keys):
        members[key].append(row)
    by_size: dict[int, list[list[int]]] = defaultdict(list)
    for rows in members.values():
        by_size[len(rows)].append(rows)
    mean, std = torch.zeros_like(flat), torch.ones_like(flat)
    for size, groups in by_size.items():
        if size > 1:
            index = torch.tensor(groups)
            values = flat[index]
            mean[index] = values.mean(dim=1, keepdim=True).expand_as(index)
            std[index] = values.std(dim=1, keepdim=True).expand_as(index)
    centred = flat - mean
    return (centred / (std + epsilon) if norm_by_std else centred)[:, None]


class RewardValueError(ValueError):
    """A reward returned something unusable; the message points at the reward's definition."""

    def __init__(self, problem: str, function: Callable[..., Any]):
        super().__init__(f"{problem} (defined at {_source(function)})")


def _source(function: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]}"
    except (TypeError, OSError):
        return repr(function)


UNKNOWN_KEYS_SHOWN = 10
"""How many of a reward's unknown keys its error names, each cut to :data:`UNKNOWN_KEY_CHARS` characters: a reward
may return a million keys or a key of megabytes, and the error is printed and written into every failed episode."""
UNKNOWN_KEY_CHARS = 60


def _first_few(keys: Sequence[str]) -> str:
    """``'a', 'b'``: the first :data:`UNKNOWN_KEYS_SHOWN` keys, then how many more there are."""
    shown = ", ".join(repr(key) if len(key) <= UNKNOWN_KEY_CHARS else f"{key[:UNKNOWN_KEY_CHARS]!r}..."
                      for key in keys[:UNKNOWN_KEYS_SHOWN])
    return shown if len(keys) <= UNKNOWN_KEYS_SHOWN else f"{shown} and {len(keys) - UNKNOWN_KEYS_SHOWN} more"


def _finite(value: int | float, function: Callable[..., Any]) -> int | float:
    if not is_finite_number(value):
        raise RewardValueError(f"returned {value}; rewards must be finite", function)
    return value


def _original(value: int | float) -> float | str:
    """A clipped value as the trajectory records it: the float, or for an int beyond any float, its size in words
    (JSON and ``str`` refuse integers of over 4300 digits)."""
    try:
        return float(value)
    except OverflowError:
        return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"


def _diagnostics(turns: list[CreditedTurn], per_turn_advantages: bool = True) -> dict[str, float]:
    """Share of groups whose rewards are all equal (no learning signal), overall and per role; advantage spread
    (not with a critic: its advantages are per token, reported by the groups as ``critic/advantage_std/<role>``)."""
    rewards: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))  # role -> key -> rewards
    spread: dict[str, list[float]] = defaultdict(list)
    for c in turns:
        rewards[c.turn.role][c.key].append(c.turn.reward)
        spread[c.turn.role].append(c.turn.advantage)
    pooled: dict[str, list[float]] = defaultdict(list)
    metrics: dict[str, float] = {}
    for role, groups in rewards.items():
        flat = sum(max(values) - min(values) < 1e-8 for values in groups.values())
        metrics[f"role/{role}/zero_variance_frac"] = flat / len(groups)
        if per_turn_advantages:
            values = spread[role]
            metrics[f"role/{role}/advantage_std"] = float(np.std(values)) if len(values) > 1 else 0.0
        for key, values in groups.items():
            pooled[key].extend(values)
    flat = sum(max(values) - min(values) < 1e-8 for values in pooled.values())
    metrics["credit/zero_variance_groups"] = flat / len(pooled)
    return metrics
