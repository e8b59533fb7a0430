"""Loaded by ``import verl`` in every worker process of a verl group's Ray worker group.

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` at the end of
its package init; :mod:`.workers` sets that variable in its workers'
environment to this module, so each rank, before it builds an engine, gets
what the group's own process has: the CPU platform where there is no GPU
(:mod:`.patches`), one torch thread per rank on CPU (ranks already run in
parallel), and the rollout adapters unimas registers in verl's registries
(the served ``hf`` rollout everywhere, the per-group vLLM classes where vLLM
is installed), and the loader of critics' value models (:mod:`.patches`).
"""

from __future__ import annotations

import torch

from unimas.groups.verl import patches, servers

patches.install()  # the CPU platform, no trl value-head patch, unimas's critic loader
if not patches.on_gpu():
    torch.set_num_threads(1)
servers.register()  # also the per-group vLLM classes, looked up lazily where vLLM is installed
