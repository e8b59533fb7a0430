"""How the hub reaches the spokes: the :class:`Transport` protocol and the choice of one.

The trainer and the router talk to model groups only through these
calls, so ``runtime.kind`` is a config switch: :class:`~unimas.groups.local.LocalTransport`
calls plain objects in this process, :class:`~unimas.groups.ray_actors.RayTransport`
calls one Ray actor per group. Every failure of a call surfaces as
:class:`~unimas.errors.ModelGroupError` naming the group and the phase.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from unimas.config import ExperimentConfig
from unimas.groups.base import Critique, GenRequest, GenResult, TrainTurn
from unimas.groups.local import LocalTransport
from unimas.registry import Registry


class Transport(Protocol):
    async def generate(self, group: str, requests: list[GenRequest]) -> list[GenResult]:
        """Results in request order; one result per request."""

    async def update(self, group: str, turns: list[TrainTurn]) -> dict[str, float]:
        """One update of ``group`` on its turns; the group's metrics."""

    async def critique(self, group: str, turns: list[TrainTurn]) -> Critique:
        """The centralized critic group's per-token advantages for every role's turns, and one critic update."""

    async def score(self, group: str, turns: list[TrainTurn]) -> list[float]:
        """Each turn's response log-probability under the group's current weights (sequential update orders)."""

    async def save(self, group: str, directory: Path) -> None: ...

    async def load(self, group: str, directory: Path) -> None: ...

    async def restart(self, group: str, checkpoint: Path | None) -> None:
        """Replace the group by a fresh one from ``checkpoint`` (initial weights when None)."""

    def shutdown(self) -> None:
        """Stop every group (and a Ray instance this transport started). Idempotent."""


def start_transport(config: ExperimentConfig, registry: Registry) -> Transport:
    """Build every model group on the transport ``runtime.kind`` names."""
    if config.runtime.kind == "ray":
        from unimas.groups.ray_actors import RayTransport  # imports Ray: only for Ray runs

        return RayTransport.start(config)
    return LocalTransport.start(config, registry)
