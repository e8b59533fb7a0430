"""GAE over a role's turns: each (episode, role) is one token sequence, whatever happened in between.

A role's *state* before one of its response tokens is everything it has seen
so far (its prompt plus the tokens it already sampled). Its *next state*
after the last token of turn ``k`` is the state before the first token of its
own turn ``k + 1`` in the same episode: the tool calls and the other roles'
turns in between are the environment's transition, never states of this
role. After the role's last trainable turn the episode ends for it: the next
value is 0. So the turns of one (episode, role), in execution order, are
concatenated into one row of tokens and handed to the estimator (verl's
``gae``) as one sequence, with the reward on turn ends (``algorithm.gae_reward``):

* ``last_turn`` (default): the credit scalar of the role's last turn on its
  last token, 0 elsewhere. The credit scalar of a turn already contains every
  trajectory- and role-level reward that reaches the role, and every turn of
  the role gets the same copy; summing them over k turns would count the
  episode's outcome k times.
* ``every_turn``: each turn's credit scalar on its own last token (for
  turn-level rewards, which differ per turn).

Backend-agnostic: it takes per-token values and returns per-token advantages
and returns; a model group with a critic calls it in its update
(``unimas.groups.torch.critic``). See docs/critic.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Literal, Sequence

import torch

from unimas.groups.base import TrainTurn

if TYPE_CHECKING:
    from unimas.algorithms.estimators import Estimator


def role_sequences(turns: Sequence[TrainTurn]) -> list[list[int]]:
    """Indices of ``turns`` by (episode, role), each in list order (the trainer lists turns in execution order)."""
    sequences: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, turn in enumerate(turns):
        sequences[turn.episode, turn.role].append(index)
    return list(sequences.values())


def sequence_rewards(turns: Sequence[TrainTurn], sequence: Sequence[int],
                     mode: Literal["last_turn", "every_turn"]) -> list[float]:
    """The reward on each turn's last token, in sequence order (see the module docstring)."""
    if mode == "every_turn":
        return [float(turns[i].reward) for i in sequence]
    return [0.0] * (len(sequence) - 1) + [float(turns[sequence[-1]].reward)]


def gae_over_turns(estimator: "Estimator", turns: Sequence[TrainTurn], values: Sequence[Sequence[float]],
                   gamma: float, lam: float, mode: Literal["last_turn", "every_turn"] = "last_turn",
                   ) -> tuple[list[list[float]], list[list[float]]]:
    """Per turn: (advantages, returns) of its response tokens. ``values[i]``: one value per token of turn ``i``.

    One estimator call over all sequences, one row each (padding masked), so
    an estimator that whitens (verl's ``gae``) whitens over every token of
    the call: the group's update batch.
    """
    if not turns:
        return [], []
    sequences = role_sequences(turns)
    width = max(sum(len(turns[i].response_ids) for i in sequence) for sequence in sequences)
    rewards = torch.zeros(len(sequences), width)
    value_rows = torch.zeros(len(sequences), width)
    mask = torch.zeros(len(sequences), width)
    spans: list[tuple[int, int, int]] = []  # (turn, row, first column)
    for row, sequence in enumerate(sequences):
        column = 0
        for i, reward in zip(sequence, sequence_rewards(turns, sequence, mode)):
            length = len(turns[i].response_ids)
            if len(values[i]) != length:
                raise ValueError(f"turn {i}: {len(values[i])} values for {length} response tokens")
            value_rows[row, column: column + length] = torch.tensor(values[i], dtype=torch.float32)
            mask[row, column: column + length] = 1.0
            rewards[row, column + length - 1] = reward
            spans.append((i, row, column))
            column += length
    advantages, returns = estimator.with_values(rewards, value_rows, mask, gamma, lam)
    out_adv: list[list[float]] = [[] for _ in turns]
    out_ret: list[list[float]] = [[] for _ in turns]
    for i, row, column in spans:
        length = len(turns[i].response_ids)
        out_adv[i] = advantages[row, column: column + length].tolist()
        out_ret[i] = returns[row, column: column + length].tolist()
    return out_adv, out_ret
