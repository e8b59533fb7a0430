"""Loaded by ``import verl`` in every worker process of a verl group's Ray worker group.

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` at the end of
its package init; :mod:`.workers` sets that variable in its workers'
environment to this module, so each rank, before it builds an engine, gets
what the group's own process has: the CPU platform where there is no GPU
(:mod:`.platform`), one torch thread per rank on CPU (ranks already run in
parallel), and the rollout adapters unimas registers in verl's registries
(the served ``hf`` rollout everywhere, the per-group vLLM classes where vLLM
is installed), and the loader of critics' value models (:mod:`.critic`).
"""

from __future__ import annotations

import torch

from unimas.groups.verl import critic, platform, servers

platform.install_cpu_platform()
platform.skip_value_head_patch()
critic.install_value_model_loader()
if not platform.on_gpu():
    torch.set_num_threads(1)
servers.register()  # also the per-group vLLM classes, looked up lazily where vLLM is installed
