"""The choice of a transport: how the hub reaches the spokes for this run.

The trainer and the router talk to model groups only through the calls of
:class:`~unimas.groups.base.Transport`, so ``runtime.kind`` is a config switch: :class:`~unimas.runtime.local.LocalTransport`
calls plain objects in this process, :class:`~unimas.runtime.ray_actors.RayTransport`
calls one Ray actor per group. Every failure of a call surfaces as
:class:`~unimas.errors.ModelGroupError` naming the group and the phase.
"""

from __future__ import annotations

from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import Registry
from unimas.groups.base import Transport
from unimas.runtime.local import LocalTransport


def start_transport(config: ExperimentConfig, registry: Registry) -> Transport:
    """Build every model group on the transport ``runtime.kind`` names."""
    if config.runtime.kind == "ray":
        from unimas.runtime.ray_actors import RayTransport  # imports Ray: only for Ray runs

        return RayTransport.start(config)
    return LocalTransport.start(config, registry)
