"""Load a run directory into what the plots and the viewer need.

Everything here tolerates a run that was killed mid-way: torn last lines in
``metrics.jsonl`` or the trajectory files are skipped, and a missing
``config.yaml`` only costs the role-to-model mapping and the role list (it is
then read off the metric names). Episodes are slimmed for the viewer (token ids
and log-probs dropped, long texts cut, tasks labelled by the dataset's own id)
and laid out in layers by topological depth, so the page only has to draw
boxes at given grid positions.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from unimas.metrics import read_metrics

MAX_TEXT = 2000
"""Characters of a prompt or response kept per node; the rest is cut with a marker."""
MAX_STEPS = 40
"""Steps per split offered in the viewer; evenly spaced, first and last always kept."""
PER_OUTCOME = 4
"""Episodes per step and outcome (best / worst / failed) embedded in the page."""


@dataclass
class GroupMapping:
    """How one model group's weights are used, so a reader sees what is shared, separate or frozen."""

    group: str
    backend: str
    roles: list[str]
    frozen_roles: list[str]
    scheme: str


@dataclass
class RunData:
    root: Path
    name: str
    records: list[dict[str, Any]]
    roles: list[str]
    groups: list[str]
    planned_steps: int | None
    primary_reward: str | None = None
    """Key of the first trajectory-level reward: what ``eval/accuracy`` holds the mean of."""
    mapping: list[GroupMapping] = field(default_factory=list)
    """One row per model group from config.yaml; empty when the config is missing."""
    episodes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Split ("train" / "eval") -> slimmed episodes, as the viewer reads them."""

    @property
    def train_records(self) -> list[dict[str, Any]]:
        return [r for r in self.records if any(k.startswith("reward/") for k in r)]


def load_run(root: Path) -> RunData:
    """Read metrics, config and trajectories of one run directory."""
    root = Path(root)
    records = read_metrics(root / "metrics.jsonl") if (root / "metrics.jsonl").exists() else []
    config = _read_config(root / "config.yaml")
    roles_cfg = config.get("roles") or {}
    roles = list(roles_cfg) or _names(records, "role/", 1)
    groups = sorted(set(_names(records, "group/", 1)) | set(config.get("models") or {}))
    primary = _primary_reward(config.get("rewards") or [])
    run = RunData(root=root, name=str(config.get("name") or root.name), records=records, roles=roles,
                  groups=groups, planned_steps=(config.get("trainer") or {}).get("steps"),
                  primary_reward=primary, mapping=model_mapping(config))
    for split in ("train", "eval"):
        raw = _read_jsonl(root / "trajectories" / f"{split}.jsonl")
        run.episodes[split] = select_episodes([slim_episode(e, primary) for e in raw])
    return run


def _read_config(path: Path) -> dict[str, Any]:
    try:
        tree = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return tree if isinstance(tree, dict) else {}


def model_mapping(config: dict[str, Any]) -> list[GroupMapping]:
    """Per model group: backend, roles and sharing scheme, read from the plain config.yaml dict.

    The scheme words follow ``unimas validate``'s summary, so the report and the CLI read alike.
    """
    roles = {name: spec for name, spec in (config.get("roles") or {}).items() if isinstance(spec, dict)}
    rows = []
    for group, spec in (config.get("models") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        members = [name for name, role in roles.items() if role.get("model") == group]
        adapters = sorted({str(roles[r]["adapter"]) for r in members if roles[r].get("adapter")})
        if spec.get("trainable", True) is False:
            scheme = "frozen"
        elif adapters:
            scheme = f"LoRA adapter per role on one base (adapters {', '.join(adapters)})"
        elif len(members) > 1:
            scheme = f"shared by {len(members)} roles"
        else:
            scheme = "one role (separate)" if members else "no roles"
        rows.append(GroupMapping(group=str(group), backend=str(spec.get("backend", "torch")), roles=members,
                                 frozen_roles=[r for r in members if roles[r].get("trainable", True) is False],
                                 scheme=scheme))
    return rows


def _names(records: list[dict[str, Any]], prefix: str, part: int) -> list[str]:
    """Distinct ``part``-th path components of metric keys under ``prefix``, in first-seen order."""
    seen: dict[str, None] = {}
    for record in records:
        for key in record:
            if key.startswith(prefix):
                seen[key.split("/")[part]] = None
    return list(seen)


def _primary_reward(rewards: list[dict[str, Any]]) -> str | None:
    """The first trajectory-level reward, keyed the way ``unimas.credit.reward_keys`` names it."""
    names = [r.get("name") if isinstance(r, dict) else None for r in rewards]
    for index, spec in enumerate(rewards):
        if isinstance(spec, dict) and spec.get("level", "trajectory") == "trajectory":
            name = spec.get("name")
            return name if names.count(name) == 1 else f"{name}#{index}"
    return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    episodes = []
    with open(path) as handle:
        for line in handle:
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and isinstance(data.get("nodes"), list):
                episodes.append(data)
    return episodes


def _cut(value: Any) -> str:
    text = value if isinstance(value, str) else "" if value is None else json.dumps(value, default=str)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"… [{len(text) - MAX_TEXT} more characters]"


def episode_score(episode: dict[str, Any], primary: str | None) -> float:
    """The primary trajectory reward, else the mean credit of the episode's turns."""
    value = (episode.get("rewards") or {}).get(primary) if primary else None
    if isinstance(value, (int, float)):
        return float(value)
    credits = [n["reward"] for n in episode["nodes"] if n.get("kind") == "turn" and n.get("reward") is not None]
    return sum(credits) / len(credits) if credits else 0.0


def layout(nodes: list[dict[str, Any]], edges: list[list[str]]) -> dict[str, tuple[int, int]]:
    """Node id -> (layer, slot): layer = longest path from a source, slot = order of start time in the layer."""
    graph = nx.DiGraph()
    graph.add_nodes_from(n["id"] for n in nodes)
    graph.add_edges_from((a, b) for a, b in edges if a in graph and b in graph)
    depth: dict[str, int] = {}
    for node_id in nx.topological_sort(graph):
        depth[node_id] = max((depth[p] + 1 for p in graph.predecessors(node_id)), default=0)
    layers: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for node in nodes:
        layers[depth[node["id"]]].append(node)
    return {n["id"]: (d, slot) for d, members in layers.items()
            for slot, n in enumerate(sorted(members, key=lambda n: (n.get("started", 0.0), n["id"])))}


def slim_episode(episode: dict[str, Any], primary: str | None) -> dict[str, Any]:
    """What the viewer shows of one episode, with each node's grid position."""
    positions = layout(episode["nodes"], episode.get("edges", []))
    nodes = []
    for raw in episode["nodes"]:
        node = {"id": raw["id"], "kind": raw.get("kind", "turn"), "layer": positions[raw["id"]][0],
                "slot": positions[raw["id"]][1]}
        if node["kind"] == "turn":
            node.update(role=raw.get("role"), group=raw.get("model_group"), prompt=_cut(raw.get("prompt")),
                        text=_cut(raw.get("text")), parsed=raw.get("parsed"), parse_error=raw.get("parse_error"),
                        reward=raw.get("reward"), advantage=raw.get("advantage"),
                        tokens=len(raw.get("response_ids") or []))
        else:
            node.update(tool=raw.get("tool"), arguments=_cut(raw.get("arguments")),
                        result=_cut(raw.get("result")), error=raw.get("error"))
        nodes.append(node)
    task = episode.get("task")
    dataset_id = task.get("id") if isinstance(task, dict) else None
    outcome = dict(episode.get("outcome") or {})
    step = outcome.pop("_step", 0)
    problems = episode.get("error") is not None or any(n.get("parse_error") or n.get("error") for n in nodes)
    return {
        "id": episode.get("episode_id"), "task_id": episode.get("task_id"), "step": int(step),
        # What a reader knows the task by: the dataset's own id; the internal uid only as a fallback.
        "task_label": str(dataset_id) if dataset_id is not None else episode.get("task_id"),
        "task": _cut(episode.get("task")), "outcome": _cut(outcome), "rewards": episode.get("rewards") or {},
        "error": episode.get("error"), "failed": problems, "score": episode_score(episode, primary),
        "wall_s": float(episode.get("ended", 0.0)) - float(episode.get("started", 0.0)),
        "nodes": nodes, "edges": [list(e) for e in episode.get("edges", [])],
    }


def select_episodes(episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep a bounded, useful subset: per kept step the best, worst and failed few."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for episode in episodes:
        by_step[episode["step"]].append(episode)
    steps = sorted(by_step)
    if len(steps) > MAX_STEPS:
        stride = (len(steps) - 1) / (MAX_STEPS - 1)
        steps = sorted({steps[round(i * stride)] for i in range(MAX_STEPS)})
    kept = []
    for step in steps:
        ranked = sorted(by_step[step], key=lambda e: -e["score"])
        picks = ranked[:PER_OUTCOME] + ranked[-PER_OUTCOME:] + [e for e in ranked if e["failed"]][:PER_OUTCOME]
        kept.extend({id(e): e for e in picks}.values())
    return kept
