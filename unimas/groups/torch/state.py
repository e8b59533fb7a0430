"""``rng.pt``, the random state a torch group checkpoint holds: a leaf, read by the checkpoint and the replica."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator


class RngState(BaseModel):
    """``rng.pt``: the group's sampling generator state and its update count."""

    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)
    generator: torch.Tensor
    weight_version: int = Field(0, ge=0, description="absent in states saved before versions were counted")

    @field_validator("generator")
    @classmethod
    def _generator_bytes(cls, value: torch.Tensor) -> torch.Tensor:
        if value.dtype != torch.uint8 or value.dim() != 1:
            raise ValueError(f"must be a 1-D uint8 tensor (a torch.Generator state), not {value.dtype} "
                             f"with shape {tuple(value.shape)}")
        return value
