"""The in-process transport: model groups are plain objects in this process."""

from __future__ import annotations

from pathlib import Path

from unimas.backends.base import GenRequest, GenResult, ModelGroup, SupervisedExample, TrainTurn
from unimas.config import AlgorithmConfig, ExperimentConfig
from unimas.registry import Registry
from unimas.runtime.groups import build_group


class LocalTransport:
    def __init__(self, groups: dict[str, ModelGroup], config: ExperimentConfig, registry: Registry):
        self.groups = groups
        self.config = config
        self.registry = registry

    @classmethod
    def start(cls, config: ExperimentConfig, registry: Registry) -> "LocalTransport":
        return cls({name: build_group(config, registry, name) for name in sorted(config.models)}, config, registry)

    async def restart(self, group: str, checkpoint: Path | None) -> None:
        """Rebuild a group from config, then load ``checkpoint`` (initial weights when None)."""
        self.groups[group] = build_group(self.config, self.registry, group)
        if checkpoint is not None:
            self.groups[group].load(checkpoint)

    async def generate(self, group: str, requests: list[GenRequest]) -> list[GenResult]:
        return self.groups[group].generate(requests)

    async def update(self, group: str, turns: list[TrainTurn], algorithm: AlgorithmConfig) -> dict[str, float]:
        return self.groups[group].update(turns, algorithm)

    async def train_supervised(self, group: str, examples: list[SupervisedExample]) -> float:
        return self.groups[group].train_supervised(examples)

    async def save(self, group: str, directory: Path) -> None:
        self.groups[group].save(directory)

    async def load(self, group: str, directory: Path) -> None:
        self.groups[group].load(directory)

    async def num_parameters(self, group: str) -> dict[str, int]:
        return self.groups[group].num_parameters()

    def shutdown(self) -> None:
        self.groups.clear()
