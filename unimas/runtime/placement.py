"""The placement plan: which model group asks for what, whether it fits, and on which node.

Pure: no Ray import, so the same code plans a live cluster (``runtime: ray``:
``ray.cluster_resources()`` for totals, ``ray.nodes()`` per node; memory in
bytes) and one described on paper (``unimas validate --cluster FILE``,
:mod:`unimas.runtime.cluster_file`). Totals are not enough on a multi-node
cluster — an actor (and a verl group's ranks) lives on one node — so when
nodes are given every group is also assigned a node, the most constrained
first (groups that need a custom resource, then by GPUs and CPUs), each on
the first node that still has room. GPUs are counted one device at a time,
as Ray does: a fraction (0.5) takes part of one GPU, so groups with shares
colocate on one device; a whole number takes that many free devices; more
than one GPU must be a whole number. Ray's scheduler may choose other nodes;
the plan proves that a placement exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unimas.config.schema import ExperimentConfig, ModelGroupConfig
from unimas.errors import UserError
from unimas.groups.verl import preflight as verl_preflight

GIB = 2**30
EPS = 1e-9
BUILTIN = ("CPU", "GPU", "memory")

Resources = dict[str, float]


def group_need(group: ModelGroupConfig) -> Resources:
    """What one group reserves, in Ray's units: its actor, plus a CPU bundle per rank of a verl worker group."""
    res = group.resources
    return {"CPU": res.cpus + verl_preflight.rank_cpus(group), "GPU": res.gpus, "memory": (res.memory_gb or 0.0) * GIB,
            **res.custom}


def describe(res: Resources) -> str:
    memory = f", {_amount('memory', res['memory'])}" if res.get("memory") else ""
    custom = "".join(f", {name} {res[name]:g}" for name in sorted(res) if name not in BUILTIN and res[name])
    return f"{res.get('CPU', 0.0):g} CPU, {res.get('GPU', 0.0):g} GPU{memory}{custom}"


@dataclass
class NodeRoom:
    """A node's room while the plan is made: free amounts, and each GPU's free share and occupants."""

    label: str
    total: Resources
    free: Resources = field(init=False)
    gpus: list[float] = field(init=False)
    on_gpu: list[list[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.free = {k: v for k, v in self.total.items() if k != "GPU"}
        whole, rest = divmod(self.total.get("GPU", 0.0), 1.0)
        self.gpus = [1.0] * int(whole) + ([rest] if rest > EPS else [])
        self.on_gpu = [[] for _ in self.gpus]

    def gpu_slots(self, amount: float) -> list[int] | None:
        """Devices a request of ``amount`` GPUs would take here (first fit), or None."""
        if amount <= EPS:
            return []
        if amount < 1:
            return next(([i] for i, free in enumerate(self.gpus) if free >= amount - EPS), None)
        if abs(amount - round(amount)) > EPS:
            return None  # Ray refuses more than one GPU that is not a whole number
        empty = [i for i, free in enumerate(self.gpus) if free >= 1 - EPS]
        return empty[: round(amount)] if len(empty) >= round(amount) else None

    def take(self, name: str, need: Resources) -> list[int] | None:
        """Reserve ``need`` for group ``name``; the GPU devices it got, or None (nothing changed) if it does not fit."""
        if any(v > self.free.get(k, 0.0) + EPS for k, v in need.items() if k != "GPU" and v > 0):
            return None
        slots = self.gpu_slots(need.get("GPU", 0.0))
        if slots is None:
            return None
        for k, v in need.items():
            if k != "GPU":
                self.free[k] = self.free.get(k, 0.0) - v
        share = need.get("GPU", 0.0) if need.get("GPU", 0.0) < 1 else 1.0
        for i in slots:
            self.gpus[i] -= share
            self.on_gpu[i].append(name)
        return slots


@dataclass
class Placement:
    node: str
    gpus: list[int]
    shared_with: list[str]

    def describe(self) -> str:
        if not self.gpus:
            return f"node {self.node}"
        first, last = self.gpus[0], self.gpus[-1]
        devices = (f"GPU {first}" if len(self.gpus) == 1
                   else f"GPUs {first}-{last}" if self.gpus == list(range(first, last + 1))
                   else "GPUs " + ",".join(map(str, self.gpus)))
        shared = f", shared with {', '.join(self.shared_with)}" if self.shared_with else ""
        return f"node {self.node}, {devices}{shared}"


def fits_some_node(group: ModelGroupConfig, nodes: list[tuple[str, Resources]]) -> bool:
    """Whether one of ``nodes`` (their totals) could host the group alone: a replacement actor is not stuck."""
    need = group_need(group)
    return any(NodeRoom(label, res).take("", need) is not None for label, res in nodes)


def _order(config: ExperimentConfig) -> list[str]:
    def key(name: str) -> tuple:
        res = config.models[name].resources
        return (not res.custom, -res.gpus, -res.cpus, name)
    return sorted(config.models, key=key)


def assign_nodes(config: ExperimentConfig, nodes: list[tuple[str, Resources]]) -> dict[str, Placement]:
    """A node (and GPU devices) for every group; a UserError naming the first group that fits nowhere."""
    rooms = [NodeRoom(label, res) for label, res in nodes]
    taken: dict[str, tuple[NodeRoom, list[int]]] = {}
    for name in _order(config):
        need = group_need(config.models[name])
        for room in rooms:
            slots = room.take(name, need)
            if slots is not None:
                taken[name] = (room, slots)
                break
        else:
            raise UserError(f"model group '{name}' ({describe(need)}) does not fit: {_why(need, nodes)}. An actor "
                            f"runs on one node: lower models.{name}.resources or add a node that holds it.",
                            where=f"models.{name}.resources")
    return {name: Placement(room.label, slots, sorted({other for i in slots for other in room.on_gpu[i]} - {name}))
            for name, (room, slots) in taken.items()}


def _why(need: Resources, nodes: list[tuple[str, Resources]]) -> str:
    gpus = need.get("GPU", 0.0)
    if gpus > 1 and abs(gpus - round(gpus)) > EPS:
        return f"more than one GPU must be a whole number (Ray's rule), not {gpus:g}"
    for key, amount in need.items():
        if amount <= EPS:
            continue
        largest = max((res.get(key, 0.0) for _, res in nodes), default=0.0)
        if key not in BUILTIN and largest <= EPS:
            return f"no node offers the custom resource '{key}' (start one with `ray start --resources`)"
        if amount > largest + EPS:
            return f"it needs {_amount(key, amount)} {key}, the largest node has {_amount(key, largest)}"
    count = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    return f"every node that could hold it alone is full once the groups before it are placed ({count})"


def placement_plan(config: ExperimentConfig, available: Resources | None = None,
                   nodes: list[tuple[str, Resources]] | None = None) -> str:
    """Describe each group's resource request; raise UserError if ``available`` cannot hold them all.

    ``available``: cluster totals in Ray's units (``CPU``, ``GPU``, ``memory``
    in bytes, custom resources by name). ``nodes``: ``[(node label,
    resources)]``; when given, each group is also assigned a node.
    """
    lines = [f"placement ({config.runtime.kind} runtime):"]
    need: Resources = {"CPU": 0.0, "GPU": 0.0, "memory": 0.0}
    for group in config.models.values():
        for k, v in group_need(group).items():
            need[k] = need.get(k, 0.0) + v
    if available is not None:
        short = [f"{k}: need {_amount(k, v)}, cluster has {_amount(k, available.get(k, 0.0))}"
                 for k, v in need.items() if v > available.get(k, 0.0) + EPS]
        if short:
            raise UserError("the cluster cannot place every model group (" + "; ".join(short) +
                            f"). Lower models.<group>.resources or add nodes.{_first_misfit(config, nodes)}",
                            where="models.*.resources")
    assigned = assign_nodes(config, nodes) if nodes else {}
    for name, group in sorted(config.models.items()):
        where = f" -> {assigned[name].describe()}" if name in assigned else ""
        lines.append(f"  model group {name}: {describe(group_need(group))}{where}")
    lines.extend(verl_preflight.plan_lines(config))
    lines.append(f"  total: {describe(need)}")
    if available is not None:
        count = f" on {len(nodes)} node{'s' if len(nodes) != 1 else ''}" if nodes else ""
        used = f", {len({p.node for p in assigned.values()})} of them used" if nodes else ""
        lines.append(f"  cluster: {describe(available)}{count} -> fits{used}")
    return "\n".join(lines)


def _first_misfit(config: ExperimentConfig, nodes: list[tuple[str, Resources]] | None) -> str:
    """' First group that does not fit: ...' when the nodes show one, for the cluster-is-short message."""
    if not nodes:
        return ""
    try:
        assign_nodes(config, nodes)
    except UserError as exc:
        return f" The first group that does not fit: {exc}"
    return ""


def _amount(key: str, value: float) -> str:
    if key == "memory":
        gib = value / GIB
        return f"{gib:.3g} GiB" if gib < 1000 else f"{gib:,.0f} GiB"
    return f"{value:g}"
