"""unimas: train LLM multi-agent systems with reinforcement learning.

Everything a plugin author touches is importable from here; ``__all__`` is
the stability contract (see ``docs/plugins.md``, "What is stable"). Deep
imports (``unimas.controller.router`` ...) are internal and may change.
"""

from typing import Any

import pluggy

from unimas.config import ExperimentConfig
from unimas.controller.context import EpisodeContext
from unimas.errors import ModelGroupError, ParseError, UserError
from unimas.groups.base import GenRequest, GenResult, GroupSpec, ModelGroup, NoOptions, TrainTurn
from unimas.protocols import Backend, DatasetFactory, EstimatorFn, ParserFactory, PolicyLossFn, Reward, Tool, Workflow
from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode

__version__ = "0.2.0"

hookimpl = pluggy.HookimplMarker("unimas")
"""Marks a plugin's hook functions: ``@unimas.hookimpl def unimas_workflows(): ...``."""


def __getattr__(name: str) -> Any:
    # `unimas.train` loads torch, transformers and the trainer: only when it is used,
    # so that importing unimas in a plugin module stays cheap.
    if name == "train":
        from unimas.api import train

        return train
    raise AttributeError(f"module 'unimas' has no attribute '{name}'")


__all__ = [
    "__version__",
    "hookimpl",
    "train",
    "ExperimentConfig",
    "EpisodeContext",
    "GraphTrajectory",
    "TurnNode",
    "ToolNode",
    "ModelGroup",
    "GroupSpec",
    "Backend",
    "NoOptions",
    "GenRequest",
    "GenResult",
    "TrainTurn",
    "UserError",
    "ParseError",
    "ModelGroupError",
    "Workflow",
    "Reward",
    "Tool",
    "DatasetFactory",
    "ParserFactory",
    "EstimatorFn",
    "PolicyLossFn",
]
