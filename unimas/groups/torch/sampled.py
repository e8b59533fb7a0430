"""What a torch group's sampling engine reads of the policy and hands back (:mod:`unimas.groups.torch.sampler`).

A leaf module: an engine in a module of its own (:mod:`unimas.groups.torch.vllm_sampler`) uses these types
while the module that lists the engines imports that engine, and no import cycle forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ContextManager, Optional, Protocol

import torch


class SamplingPolicy(Protocol):
    """What an engine reads of the policy it samples for (:class:`unimas.groups.torch.policy.TorchPolicy`)."""

    model: torch.nn.Module
    eos_ids: list[int]
    pad_id: int
    logit_bias: torch.Tensor

    def route(self, model: torch.nn.Module, adapter: Optional[str]) -> ContextManager[None]: ...


@dataclass
class SampledRows:
    """One batch's sampled response ids and their log-probs, row for row, and the weight version that sampled
    them (what staleness and importance ratios are measured against)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    version: int
