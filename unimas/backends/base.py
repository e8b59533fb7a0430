"""The model-group interface every backend implements.

A model group owns one set of weights (plus, optionally, one LoRA adapter per
role). The controller sends it thin records — prompt text in, token ids,
text and per-token log-probs out; turns with scalar advantages back in — and
never sees logits or activations. Keeping this interface small is what lets
the same controller drive an in-process torch model, a Ray actor, or verl
workers on GPUs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from unimas.config import AlgorithmConfig, GenerationConfig


@dataclass
class GenRequest:
    """One role turn to generate."""

    prompt: str
    generation: GenerationConfig
    adapter: Optional[str] = None
    greedy: bool = False


@dataclass
class GenResult:
    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    """Response tokens up to and including the first EOS (if any)."""
    logprobs: list[float]
    """Log-probs of ``response_ids`` under the sampling distribution (logits / temperature)."""
    finished: bool
    """True when EOS was produced within ``max_new_tokens``."""


@dataclass
class TrainTurn:
    """One trainable turn handed back to the group that produced it.

    An empty ``old_logprobs`` means the rollout log-probs are not the training
    distribution (top-k / top-p sampling renormalises it): the backend then
    recomputes them with the current weights before the first update epoch.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    temperature: float = 1.0
    adapter: Optional[str] = None


@dataclass
class SupervisedExample:
    prompt: str
    response: str
    adapter: Optional[str] = None


@dataclass
class UpdateStats:
    metrics: dict[str, float] = field(default_factory=dict)


class ModelGroup(ABC):
    """Weights for one or more roles: generate, score, update, checkpoint."""

    name: str
    trainable: bool

    @abstractmethod
    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Generate for a batch of requests, possibly for several adapters."""

    @abstractmethod
    def update(self, turns: list[TrainTurn], algorithm: AlgorithmConfig) -> dict[str, float]:
        """One PPO/GRPO update on this group's turns; returns metrics."""

    @abstractmethod
    def train_supervised(self, examples: list[SupervisedExample]) -> float:
        """One supervised step (cross-entropy on responses); returns the loss."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write weights (safetensors / PEFT adapter dirs) and optimiser + RNG state."""

    @abstractmethod
    def load(self, directory: Path) -> None:
        """Restore exactly what :meth:`save` wrote."""

    def num_parameters(self) -> dict[str, int]:
        return {}

