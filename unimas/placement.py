"""The placement plan: which model group asks for what, and whether it fits."""

from __future__ import annotations

from unimas.config import ExperimentConfig
from unimas.errors import UserError


def placement_plan(config: ExperimentConfig, available: dict[str, float] | None = None) -> str:
    """Describe each group's resource request; raise if ``available`` cannot hold them all."""
    lines = [f"placement ({config.runtime.kind} runtime):"]
    need = {"CPU": 0.0, "GPU": 0.0}
    for name, group in sorted(config.models.items()):
        res = group.resources
        need["CPU"] += res.cpus
        need["GPU"] += res.gpus
        memory = f", {res.memory_gb:g} GiB" if res.memory_gb else ""
        lines.append(f"  model group {name}: {res.cpus:g} CPU, {res.gpus:g} GPU{memory}")
    lines.append(f"  total: {need['CPU']:g} CPU, {need['GPU']:g} GPU")
    if available is not None:
        short = [f"{k}: need {v:g}, cluster has {available.get(k, 0.0):g}"
                 for k, v in need.items() if v > available.get(k, 0.0) + 1e-9]
        if short:
            raise UserError("the cluster cannot place every model group (" + "; ".join(short) +
                            "). Lower models.<group>.resources or add nodes.", where="models.*.resources")
        lines.append(f"  cluster: {available.get('CPU', 0):g} CPU, {available.get('GPU', 0):g} GPU -> fits")
    return "\n".join(lines)
