"""Build model groups from the mapping: which adapters, which backend, which seed."""

from __future__ import annotations

import zlib

from unimas.backends.base import ModelGroup
from unimas.config import ExperimentConfig
from unimas.registry import Registry


def adapters_of(config: ExperimentConfig, group: str) -> list[str]:
    return sorted({r.adapter for r in config.roles.values() if r.model == group and r.adapter})


def group_seed(seed: int, group: str) -> int:
    """Per-group seed that does not depend on how many other groups exist."""
    return (seed * 1_000_003 + zlib.crc32(group.encode())) % 2**31


def build_group(config: ExperimentConfig, registry: Registry, name: str) -> ModelGroup:
    spec = config.models[name]
    factory = registry.get("backends", spec.backend, where=f"models.{name}.backend")
    return factory(name, spec, adapters_of(config, name), group_seed(config.trainer.seed, name))
