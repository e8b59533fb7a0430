"""Rollout control: how a step's task list becomes trajectories.

The trainer makes one call per step, :meth:`Rollout.collect`. Without
plugins it runs ``group_size`` independent episodes per task, exactly as
before. An ``algorithm.rollout`` plugin (hook ``unimas_rollout_controls``)
takes over the episodes: it gets a :class:`RolloutSession` that runs specs,
forks recorded episodes at a turn (:mod:`unimas.controller.forking`) and
scores episodes early (reward allocation), so it can branch where outcomes
are mixed or the policy is unsure, or spend more samples on some tasks. An
``algorithm.replay`` plugin (:mod:`unimas.training.replay`) then revisits stored tasks
and mixes stored episodes into the step's groups. ``algorithm.credit`` and
``algorithm.update_order`` are resolved here too, so the trainer holds one
object for all algorithm plugins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from unimas.config import plugin_params
from unimas.contract.protocols import ReplayBuffer, RolloutControl, UpdateOrder
from unimas.contract.registry import singular
from unimas.controller.episodes import Controller
from unimas.controller.specs import EpisodeSpec
from unimas.errors import UserError
from unimas.output.checkpoints import notice
from unimas.safe_load import load_json, reading
from unimas.training.session import RolloutSession
from unimas.trajectory import GraphTrajectory

if TYPE_CHECKING:
    from unimas.algorithms.credit import CreditAssigner
    from unimas.config.schema import AlgorithmPlugin
    from unimas.training.experiment import Experiment

REPLAY_STATE = "replay_state.json"
"""In a checkpoint: the replay buffer's contents and the last step's episodes it has yet to observe."""


class ReplayState(BaseModel):
    """:data:`REPLAY_STATE`: the last collected step's episodes (JSON each) and the buffer's own ``state()``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    previous_step: int = Field(ge=0)
    previous: list[str]
    buffer: Any
    """The buffer's ``state()``; null only for a buffer that keeps none (required: a file without it is damage)."""


class Rollout:
    """The trainer's one object for rollout control, replay, credit shaping and update order."""

    def __init__(self, controller: Controller, credit: "CreditAssigner", group_size: int,
                 control: RolloutControl | None = None, replay: "ReplayBuffer | None" = None,
                 update_order: "UpdateOrder | None" = None):
        self.controller = controller
        self.credit = credit
        self.group_size = group_size
        self.control = control
        self.replay = replay
        self.update_order = update_order
        self._previous: list[GraphTrajectory] = []
        self._previous_step = 0

    @classmethod
    def from_experiment(cls, experiment: "Experiment", controller: Controller,
                        credit: "CreditAssigner") -> "Rollout":
        algorithm = experiment.config.algorithm
        registry = experiment.registry
        credit.shaper = _build(registry, "credit_shapers", algorithm.credit, "algorithm.credit")
        return cls(controller, credit, algorithm.group_size,
                   control=_build(registry, "rollout_controls", algorithm.rollout, "algorithm.rollout"),
                   replay=_build(registry, "replay_buffers", algorithm.replay, "algorithm.replay"),
                   update_order=_build(registry, "update_orders", algorithm.update_order, "algorithm.update_order"))

    def save(self, directory: Path) -> None:
        """With a replay buffer: its contents and the episodes it has not observed yet, into a checkpoint."""
        if self.replay is None:
            return
        state = getattr(self.replay, "state", None)
        (directory / REPLAY_STATE).write_text(json.dumps({
            "previous_step": self._previous_step, "previous": [t.to_json() for t in self._previous],
            "buffer": state() if state is not None else None}))

    def load(self, directory: Path, last_step: int) -> None:
        """Restore what :meth:`save` wrote; a checkpoint without it (written before ``algorithm.replay`` was set)
        starts the buffer empty, with a notice.

        ``last_step``: the newest (0-based) step the checkpoint collected
        episodes for; episodes recorded as observed later come from another
        checkpoint or run, and are refused with the file named. So is a file
        without the buffer's contents for a buffer that keeps some: resuming
        it empty would silently forget what it stored.
        """
        path = directory / REPLAY_STATE
        if self.replay is None:
            return
        if not path.exists():
            notice(f"{directory} has no {REPLAY_STATE} (written before algorithm.replay was set?): the replay "
                   "buffer starts empty")
            return
        state = load_json(path, ReplayState)
        if state.previous_step > last_step:
            raise UserError(f"previous_step {state.previous_step}: the checkpoint collected episodes up to step "
                            f"{last_step} only (copied from another checkpoint or run?)", where=str(path))
        if state.buffer is None and hasattr(self.replay, "state") and hasattr(self.replay, "load_state"):
            raise UserError("buffer: null, but this run's replay buffer keeps contents (state/load_state): they "
                            "are missing, so the checkpoint is refused rather than resumed with an empty buffer",
                            where=str(path))
        with reading(path):
            previous = [GraphTrajectory.from_json(text) for text in state.previous]
            if state.buffer is not None and hasattr(self.replay, "load_state"):
                self.replay.load_state(state.buffer)
        self._previous_step, self._previous = state.previous_step, previous

    async def collect(self, specs: list[EpisodeSpec], step: int) -> list[GraphTrajectory]:
        """The step's trajectories: the control's (or ``specs`` run as they are), then replayed ones mixed in."""
        session = RolloutSession(self.controller, self.credit, step, self.group_size)
        if self.replay is not None:
            if self._previous:  # credited by now: their turns carry rewards and advantages
                self.replay.observe(self._previous, self._previous_step)
            specs = self.replay.revisit(specs, step)
        if self.control is not None:
            fresh = await self.control.rollout(session, specs)
        else:
            fresh = await session.run(specs)
        if self.replay is None:
            return fresh
        self._previous, self._previous_step = fresh, step
        return fresh + self.replay.mix(fresh, session)


def _build(registry: Any, kind: str, entry: "AlgorithmPlugin | None", where: str) -> Any:
    """The object a plugin's factory makes from its checked params (:mod:`unimas.config.plugin_params`).

    ``unimas validate`` has checked the params the same way; a factory that
    still refuses them (a check its types do not express) is the user's mistake too.
    """
    if entry is None:
        return None
    factory = registry.get(kind, entry.name, where=f"{where}.name")
    kwargs = plugin_params.bind(factory, entry.name, entry.params, f"{where}.params")
    try:
        return factory(**kwargs)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{singular(kind)} '{entry.name}': {exc}", where=f"{where}.params") from None
