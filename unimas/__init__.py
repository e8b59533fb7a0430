"""unimas: train LLM multi-agent systems with reinforcement learning.

Everything a plugin author touches is importable from here; ``__all__`` is
the stability contract (see ``docs/plugins.md``, "What is stable"). An
algorithm plugin (rollout control, replay buffer, update order, credit
shaper) also imports from :mod:`unimas.methods`; the code tools use
:mod:`unimas.sandbox`. Deep imports (``unimas.controller.router`` ...) are
internal and may change: ``tests/test_public_surface.py`` holds the built-in
plugins and workflows to these three.

``import unimas`` loads only pluggy and the small modules below: a plugin
module imports unimas at its top, and ``unimas plugins`` imports every plugin,
so the names that pull in pydantic models, the controller or the trainer
(and through them torch) are imported on first use (PEP 562 ``__getattr__``).
``tests/test_startup.py`` holds this.
"""

from typing import TYPE_CHECKING

import pluggy

from unimas.contract.protocols import Backend, DatasetFactory, EstimatorFn, ParserFactory, PolicyLossFn, Reward, Tool, Workflow
from unimas.errors import ModelGroupError, ParseError, UserError
from unimas.lazy_names import lazy_names

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from unimas.api import train
    from unimas.config.schema import ExperimentConfig
    from unimas.contract.registry import Deferred
    from unimas.controller.context import EpisodeContext
    from unimas.groups.base import GenRequest, GenResult, GroupSpec, ModelGroup, NoOptions, TrainTurn
    from unimas.safe_load import read_bytes
    from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode
    from unimas.workflow.safe_expr import ExpressionError, compile_expression

__version__ = "0.2.0"

hookimpl = pluggy.HookimplMarker("unimas")
"""Marks a plugin's hook functions: ``@unimas.hookimpl def unimas_workflows(): ...``."""

_LAZY = {
    "train": "unimas.api",
    "ExperimentConfig": "unimas.config.schema",
    "EpisodeContext": "unimas.controller.context",
    "GraphTrajectory": "unimas.trajectory",
    "TurnNode": "unimas.trajectory",
    "ToolNode": "unimas.trajectory",
    "ModelGroup": "unimas.groups.base",
    "GroupSpec": "unimas.groups.base",
    "NoOptions": "unimas.groups.base",
    "GenRequest": "unimas.groups.base",
    "GenResult": "unimas.groups.base",
    "TrainTurn": "unimas.groups.base",
    "Deferred": "unimas.contract.registry",
    "read_bytes": "unimas.safe_load",
    "compile_expression": "unimas.workflow.safe_expr",
    "ExpressionError": "unimas.workflow.safe_expr",
}
"""Public name -> the module that defines it, imported when the name is first read."""


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

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
    "Deferred",
    "read_bytes",
    "compile_expression",
    "ExpressionError",
]
