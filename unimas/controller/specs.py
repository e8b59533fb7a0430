"""The records the hub and the training loop share: what one episode is to run, and a fork's replayed prefix.

Kept apart from :mod:`unimas.controller.episodes` (which runs specs) and
:mod:`unimas.controller.forking` (which makes fork specs) so both, and the
rollout and replay plugins in :mod:`unimas.training`, import them without a
cycle, type-only imports included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from unimas.groups.base import GenResult
from unimas.trajectory import GraphTrajectory, TurnNode


class ReplayDiverged(RuntimeError):
    """A forked episode asked for a turn whose input differs from the recorded one: the prefix is not replayable."""


@dataclass(frozen=True)
class ReplayPrefix:
    """The recorded turns a fork returns instead of sampling, by turn id."""

    parent: str
    turns: dict[str, TurnNode] = field(default_factory=dict)
    fork_turn: str | None = None
    """The parent's turn ``k`` (the first one sampled afresh); None when the whole parent is replayed."""

    @classmethod
    def of(cls, parent: GraphTrajectory, k: int) -> "ReplayPrefix":
        """The first ``k`` turns of ``parent`` in the order they happened."""
        turns = parent.turns()
        if not 0 <= k <= len(turns):
            raise ValueError(f"fork point {k} is outside episode {parent.episode_id} ({len(turns)} turns)")
        return cls(parent.episode_id, {t.id: t for t in turns[:k]}, turns[k].id if k < len(turns) else None)

    def result_for(self, turn_id: str, rendered_input: str) -> GenResult | None:
        """The recorded result of ``turn_id``, or None when that turn is to be sampled."""
        recorded = self.turns.get(turn_id)
        if recorded is None:
            return None
        if recorded.input != rendered_input:
            raise ReplayDiverged(f"turn {turn_id} of fork of {self.parent}: its input differs from the recorded one "
                                 f"({rendered_input[:60]!r} vs {recorded.input[:60]!r})")
        return GenResult(text=recorded.text, prompt_ids=list(recorded.prompt_ids),
                         response_ids=list(recorded.response_ids), logprobs=list(recorded.logprobs),
                         finished=recorded.finished, logprobs_exact=recorded.logprobs_exact,
                         prompt_text=recorded.prompt, continued=recorded.continued, truncated=recorded.truncated)


@dataclass
class EpisodeSpec:
    episode_id: str
    task_uid: str
    task: dict
    prefix: Optional[ReplayPrefix] = None
    """A fork: turns replayed from a recorded episode before sampling starts (see unimas.controller.forking)."""
