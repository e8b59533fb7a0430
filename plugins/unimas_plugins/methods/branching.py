"""``entropy_branch``: fork episodes at their most uncertain or most contested decision.

Seeds: ARPO "entropy-triggered step-level
branching ... mixed with global sampling"; AT^2PO "entropy-guided
expansion"; TRACE "allocates budget to prompt roots and turn
prefixes likely yielding mixed rewards". Per task, ``roots`` episodes run from
scratch; each root is then forked ``siblings`` times at one turn ``k``
(``k >= min_turn``), its first ``k`` turns replayed token for token:

* ``trigger: entropy`` — the turn with the highest surprisal (mean negative
  log-prob of its sampled tokens, the entropy estimate a sampler has);
* ``trigger: mixed`` — only roots of tasks whose root returns are mixed (or,
  when none are, every task), at their last turn: the decision nearest the
  outcome, where the siblings' returns are most likely to differ.

With ``roots * (1 + siblings) == group_size`` a step samples at most as many
turns as plain GRPO, fewer tokens (the prefixes are replayed, not sampled).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from unimas import GraphTrajectory
from unimas.methods import EpisodeSpec, RolloutSession, by_task, episode_return, surprisal


def choose_forks(roots: list[GraphTrajectory], siblings: int, trigger: str,
                 min_turn: int = 1) -> list[tuple[GraphTrajectory, int, int]]:
    """``(parent, k, siblings)`` for each root worth forking; the decision rule of the method."""
    forks = []
    if trigger == "mixed":
        tasks = by_task(roots)
        mixed = {task for task, group in tasks.items() if len({episode_return(t) for t in group}) > 1}
        chosen = mixed or set(tasks)
    for root in roots:
        turns = root.turns()
        if root.failed or len(turns) <= min_turn:
            continue
        if trigger == "entropy":
            k = max(range(min_turn, len(turns)), key=lambda i: (surprisal(turns[i]), -i))
        elif root.task_id in chosen:
            k = len(turns) - 1
        else:
            continue
        forks.append((root, k, siblings))
    return forks


class EntropyBranch:
    uses_forks = True
    """Forks recorded episodes: not for `workflow.agent` programs (validation refuses the pair)."""

    def __init__(
        self,
        roots: Annotated[PositiveInt, Field(description="episodes per task run from scratch")] = 4,
        siblings: Annotated[PositiveInt, Field(description="forks of each root at its chosen turn")] = 1,
        trigger: Annotated[Literal["entropy", "mixed"], Field(
            description="where to fork: the highest-surprisal turn, or the last turn of tasks with mixed "
                        "returns")] = "entropy",
        min_turn: Annotated[NonNegativeInt, Field(description="earliest turn index a fork may start at")] = 1,
    ):
        self.roots, self.siblings, self.trigger, self.min_turn = roots, siblings, trigger, min_turn

    async def rollout(self, session: RolloutSession, specs: list[EpisodeSpec]) -> list[GraphTrajectory]:
        per_task: dict[str, list[EpisodeSpec]] = {}
        for spec in specs:
            per_task.setdefault(spec.task_uid, []).append(spec)
        roots = await session.run([spec for group in per_task.values() for spec in group[: self.roots]])
        if self.trigger == "mixed":
            session.score(roots)
        return roots + await session.fork(choose_forks(roots, self.siblings, self.trigger, self.min_turn))
