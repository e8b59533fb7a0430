"""The placement plan: which model group asks for what, and whether it fits.

Pure: no Ray import. For ``runtime: ray`` the available resources are what Ray reports
(``ray.cluster_resources()`` for totals, ``ray.nodes()`` per node; memory
in bytes). Totals are not enough on a multi-node cluster — an actor lives on
one node — so when nodes are given every group is also assigned a node
(largest requests first, first node that still has room). Ray's scheduler
may choose other nodes; the plan proves that a placement exists.
"""

from __future__ import annotations

from unimas.config.schema import ExperimentConfig, ModelGroupConfig
from unimas.errors import UserError
from unimas.groups.verl import plan as verl_plan

GIB = 2**30


def _need(group: ModelGroupConfig) -> dict[str, float]:
    res = group.resources
    # a verl worker group's ranks each hold a CPU bundle of their own, beside the group's process
    cpus = res.cpus + verl_plan.rank_cpus(group)
    return {"CPU": cpus, "GPU": res.gpus, "memory": (res.memory_gb or 0.0) * GIB}


def _describe(res: dict[str, float]) -> str:
    memory = f", {res['memory'] / GIB:.3g} GiB" if res.get("memory") else ""
    return f"{res.get('CPU', 0.0):g} CPU, {res.get('GPU', 0.0):g} GPU{memory}"


def _fits(need: dict[str, float], free: dict[str, float]) -> bool:
    return all(v <= free.get(k, 0.0) + 1e-9 for k, v in need.items() if v > 0)


def _assign_nodes(config: ExperimentConfig, nodes: list[tuple[str, dict[str, float]]]) -> dict[str, str]:
    free = [(label, dict(res)) for label, res in nodes]
    order = sorted(config.models, key=lambda n: (-config.models[n].resources.gpus,
                                                 -config.models[n].resources.cpus, n))
    assigned: dict[str, str] = {}
    for name in order:
        need = _need(config.models[name])
        for label, res in free:
            if _fits(need, res):
                for k, v in need.items():
                    res[k] = res.get(k, 0.0) - v
                assigned[name] = label
                break
        else:
            largest = ", ".join(f"{label}: {_describe(res)}" for label, res in nodes)
            raise UserError(
                f"model group '{name}' ({_describe(need)}) fits on no node once the larger groups are placed "
                f"(nodes: {largest}). An actor runs on one node: lower models.{name}.resources or add a "
                "bigger node.", where=f"models.{name}.resources")
    return assigned


def placement_plan(config: ExperimentConfig, available: dict[str, float] | None = None,
                   nodes: list[tuple[str, dict[str, float]]] | None = None) -> str:
    """Describe each group's resource request; raise UserError if ``available`` cannot hold them all.

    ``available``: cluster totals in Ray's units (``CPU``, ``GPU``, ``memory``
    in bytes). ``nodes``: ``[(node label, resources)]``; when given, each
    group is also assigned a node.
    """
    lines = [f"placement ({config.runtime.kind} runtime):"]
    need = {"CPU": 0.0, "GPU": 0.0, "memory": 0.0}
    for name, group in sorted(config.models.items()):
        for k, v in _need(group).items():
            need[k] += v
    if available is not None:
        short = [f"{k}: need {_amount(k, v)}, cluster has {_amount(k, available.get(k, 0.0))}"
                 for k, v in need.items() if v > available.get(k, 0.0) + 1e-9]
        if short:
            raise UserError("the cluster cannot place every model group (" + "; ".join(short) +
                            "). Lower models.<group>.resources or add nodes.", where="models.*.resources")
    assigned = _assign_nodes(config, nodes) if nodes else {}
    for name, group in sorted(config.models.items()):
        where = f" -> node {assigned[name]}" if name in assigned else ""
        lines.append(f"  model group {name}: {_describe(_need(group))}{where}")
    lines.extend(verl_plan.plan_lines(config))
    lines.append(f"  total: {_describe(need)}")
    if available is not None:
        count = f" on {len(nodes)} node{'s' if len(nodes) != 1 else ''}" if nodes else ""
        lines.append(f"  cluster: {_describe(available)}{count} -> fits")
    return "\n".join(lines)


def _amount(key: str, value: float) -> str:
    return f"{value / GIB:.3g} GiB" if key == "memory" else f"{value:g}"

