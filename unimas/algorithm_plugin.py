"""The config entry naming an algorithm plugin (``algorithm.rollout|replay|update_order|credit``; docs/algorithms.md).

Kept out of :mod:`unimas.config` only to keep that module short.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AlgorithmPlugin(BaseModel):
    """A registered algorithm plugin (rollout control, replay, update order or credit shaper) and its parameters."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="registered name (`unimas plugins` lists them)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the plugin's factory")
