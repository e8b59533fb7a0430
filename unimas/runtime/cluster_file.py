"""A cluster described on paper: ``unimas validate CONFIG --cluster FILE`` plans a placement for nodes that are not there.

FILE is a YAML list of nodes (or node pools, with ``count``), for example::

    - {name: trainer, count: 56, cpus: 96, gpus: 8, memory_gb: 1024}
    - {name: rollout, count: 8, cpus: 96, gpus: 8, memory_gb: 1024, resources: {rollout_pool: 8}}

Each entry becomes the same ``(label, resources in Ray's units)`` pairs that
``ray.nodes()`` gives on a live cluster, so the plan is made by the one
planner the runtime uses (:mod:`unimas.runtime.placement`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import yaml
from pydantic import Field, ValidationError, field_validator

from unimas.config.loading import MAX_BYTES, parse_yaml
from unimas.config.strict import Strict
from unimas.errors import UserError
from unimas.runtime.placement import BUILTIN, GIB, Resources

MAX_NODES = 100_000
"""Most nodes one file may describe (after ``count``): a plan, not a stress test."""
MAX_GPUS_PER_NODE = 256
"""Most GPUs one node may have: the largest single hosts have 16; a count beyond this is a typo or an attack
(10**10 GPUs made the planner allocate a slot per device and run out of memory)."""
MAX_GPUS = 1_000_000
"""Most GPUs the whole file may describe (after ``count``): the planner keeps one slot per device."""
MAX_CPUS_PER_NODE = 65_536
"""Most CPUs one node may have (the largest hosts have a few thousand hardware threads)."""
MAX_MEMORY_GB = 1_048_576
"""Most memory one node may have, in GiB (1 PiB)."""
MAX_CUSTOM = 1_000_000
"""Most of one custom resource a node may offer (Ray counts them in 1/10,000 units in 64-bit integers)."""


class ClusterNode(Strict):
    """One node, or ``count`` identical ones, of a cluster description."""

    name: Optional[str] = Field(None, min_length=1, description="label in the plan (with -0, -1, ... when count > "
                                "1); default node<entry number>")
    count: int = Field(1, ge=1, le=MAX_NODES, description="identical nodes this entry stands for")
    cpus: float = Field(gt=0, le=MAX_CPUS_PER_NODE, description="CPUs of the node (Ray's `--num-cpus`)")
    gpus: int = Field(0, ge=0, le=MAX_GPUS_PER_NODE, description="GPU devices of the node (Ray's `--num-gpus`)")
    memory_gb: float = Field(gt=0, le=MAX_MEMORY_GB, description="memory Ray may reserve on the node, in GiB")
    resources: dict[str, Annotated[float, Field(ge=0, le=MAX_CUSTOM)]] = Field(
        default_factory=dict, description="custom resources (Ray's `--resources`)")

    @field_validator("resources")
    @classmethod
    def _custom(cls, resources: dict[str, float]) -> dict[str, float]:
        for name in resources:
            if name in BUILTIN:
                raise ValueError(f"'{name}' is built in: use cpus, gpus or memory_gb")
        return resources

    def ray_resources(self) -> Resources:
        return {"CPU": self.cpus, "GPU": float(self.gpus), "memory": self.memory_gb * GIB, **self.resources}


def _read(path: Path) -> object:
    try:
        if not path.is_file():
            raise UserError("cluster file not found" if not path.exists() else "not a regular file",
                            where=str(path))
        if path.stat().st_size > MAX_BYTES:
            raise UserError(f"cluster file is larger than {MAX_BYTES} bytes (use count: for identical nodes)",
                            where=str(path))
        text = path.read_bytes().decode("utf-8")
        return parse_yaml(text, str(path))
    except UnicodeDecodeError:
        raise UserError("is not UTF-8 text", where=str(path)) from None
    except OSError as exc:
        raise UserError(f"cannot read the cluster file: {exc.strerror or exc}", where=str(path)) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise UserError(f"not valid YAML: {exc}", where=str(path)) from None


def load_cluster(path: Path) -> tuple[Resources, list[tuple[str, Resources]]]:
    """(cluster totals, [(node label, resources)]) of a cluster file; a UserError naming the file and entry."""
    tree = _read(path)
    if not isinstance(tree, list) or not tree:
        raise UserError("a cluster file is a non-empty YAML list of nodes, e.g. "
                        "`- {name: gpu, count: 64, cpus: 96, gpus: 8, memory_gb: 1024}`", where=str(path))
    entries, problems = [], []
    for index, item in enumerate(tree, start=1):
        label = f"entry {index}" + (f" ({item['name']})" if isinstance(item, dict) and item.get("name") else "")
        try:
            entries.append(ClusterNode.model_validate(item))
        except ValidationError as exc:
            for err in exc.errors():
                field = ".".join(str(p) for p in err["loc"]) or "(the entry)"
                message = "unknown key (check spelling)" if err["type"] == "extra_forbidden" else err["msg"]
                problems.append(f"  {label}: {field}: {message}")
    if problems:
        raise UserError("invalid cluster file:\n" + "\n".join(problems), where=str(path))
    if sum(entry.count for entry in entries) > MAX_NODES:
        raise UserError(f"describes more than {MAX_NODES:,} nodes", where=str(path))
    if sum(entry.count * entry.gpus for entry in entries) > MAX_GPUS:
        biggest = max(range(len(entries)), key=lambda i: entries[i].count * entries[i].gpus)
        raise UserError(f"describes more than {MAX_GPUS:,} GPUs in all; entry {biggest + 1} alone has "
                        f"{entries[biggest].count:,} x {entries[biggest].gpus} (count x gpus)", where=str(path))
    nodes: list[tuple[str, Resources]] = []
    for index, entry in enumerate(entries, start=1):
        name = entry.name or f"node{index}"
        labels = [name] if entry.count == 1 else [f"{name}-{k}" for k in range(entry.count)]
        nodes += [(label, entry.ray_resources()) for label in labels]
    seen: set[str] = set()
    for label, _ in nodes:
        if label in seen:
            raise UserError(f"two nodes are named '{label}': give each entry its own name", where=str(path))
        seen.add(label)
    totals: Resources = {}
    for _, res in nodes:
        for key, amount in res.items():
            totals[key] = totals.get(key, 0.0) + amount
    return totals, nodes
