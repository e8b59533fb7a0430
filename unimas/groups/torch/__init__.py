"""The in-process PyTorch backend (``backend: torch``); see :mod:`unimas.groups.torch.group`.

Names load on first use (PEP 562): checking a config imports :mod:`unimas.groups.torch.options` alone, without
torch or transformers (``unimas validate`` answers in seconds). What it shares with the verl backend comes from
:mod:`unimas.groups` (the kit), never from :mod:`unimas.groups.verl`.

May import: algorithms, config, errors, groups, safe_load.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"TorchBackend": "backend", "TorchModelGroup": "group",
          "TorchOptions": "options", "SupervisedExample": "learner"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
