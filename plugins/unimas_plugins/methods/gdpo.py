"""``gdpo``: each reward channel normalised within its group before they are summed (verl's GDPO).

Follows: GDPO (verl ``core_algos`` "gdpo", arXiv 2601.05242). With several
reward entries (e.g. team accuracy and a verifier fix/break reward),
summing first lets the larger-variance channel drown the other; GDPO
normalises each channel within the turn's group, sums them with ``weights``
and whitens the sum. The per-turn channel values are the raw
values each entry stored on the trajectory (a number reaches every turn; a
dict is read by the turn's role, then its id). This calls verl's own
implementation. Pair with ``estimator: passthrough``. Its parameters are an
explicit pydantic model (:class:`GdpoParams`): ``weights`` must match ``channels``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:  # the registry lists this shaper without importing torch
    from unimas.methods import CreditedTurn


def channel_value(raw: Any, role: str, turn_id: str) -> float:
    if isinstance(raw, dict):
        return float(raw.get(role, raw.get(turn_id, 0.0)))
    return float(raw)


class GdpoParams(BaseModel):
    """``algorithm.credit.params`` of ``gdpo``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    channels: list[str] = Field(..., min_length=1, description="reward keys (`rewards[].name`) normalised "
                                "separately")
    weights: Optional[list[float]] = Field(None, description="one weight per channel for the sum; null = equal")
    norm_by_std: bool = Field(True, description="divide each channel's group-centred values by their std")

    @model_validator(mode="after")
    def _one_weight_per_channel(self) -> "GdpoParams":
        if self.weights is not None and len(self.weights) != len(self.channels):
            raise ValueError(f"'weights' needs one number per channel ({len(self.channels)})")
        return self


def gdpo(channels: list[str], weights: list[float] | None = None, norm_by_std: bool = True):

    def shape(turns: list[CreditedTurn]) -> list[float]:
        import numpy as np
        import torch
        from verl.trainer.config import AlgoConfig
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

        n = len(turns)
        per_channel = {key: np.array([channel_value(c.trajectory.rewards.get(key, 0.0), c.turn.role, c.turn.id)
                                      for c in turns], dtype=np.float32) for key in channels}
        config = AlgoConfig(gdpo_reward_keys=list(channels), gdpo_reward_weights=weights,
                            norm_adv_by_std_in_grpo=norm_by_std)
        advantages, _ = ADV_ESTIMATOR_REGISTRY["gdpo"](
            token_level_rewards=torch.zeros(n, 1), response_mask=torch.ones(n, 1),
            index=np.array([c.key for c in turns], dtype=object), norm_adv_by_std_in_grpo=norm_by_std,
            config=config, non_tensor_batch=per_channel,
            batch={"prompts": torch.zeros(n, 1), "attention_mask": torch.ones(n, 2, dtype=torch.long)})
        return advantages[:, 0].tolist()

    return shape


gdpo.params = GdpoParams  # type: ignore[attr-defined]
