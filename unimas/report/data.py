"""Load a run directory into what the plots and the viewer need.

Everything here tolerates a run that was killed mid-way or damaged: torn,
malformed or over-long lines in ``metrics.jsonl`` or the trajectory files,
episodes whose graph is broken (nodes without ids, cyclic edges) and an
unreadable ``config.yaml`` are skipped, each recorded as a :class:`Skipped`
note that the report shows and ``unimas report`` prints, so nothing is dropped
silently. A missing config only costs the role-to-model mapping and the role
list (then read off the metric names). Episodes are slimmed for the viewer
(token ids and log-probs dropped, long texts cut, malformed chat messages
skipped, tasks labelled by the dataset's own id) and laid out in layers by
topological depth, so the page only has to draw boxes at given grid positions.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from unimas.output.run_end import RunEnd
from unimas.report.sources import Note, Skipped, bounded, config_text, json_lines, metrics_records, read_config, \
    read_end
from unimas.safe_load import open_regular

MAX_TEXT = 2000
"""Characters of a text (response, message, prompt) kept per node; the rest is cut with a marker.

A prompt keeps both ends (its tail is the newest input), other texts their start."""
MAX_MESSAGES = 24
"""Chat messages kept per turn: the first (usually the system message) and the latest ones."""
MAX_STEPS = 40
"""Steps per split offered in the viewer; evenly spaced, first and last always kept."""
PER_OUTCOME = 4
"""Episodes per step and outcome (best / worst / failed) embedded in the page."""


class DamagedEpisode(ValueError):
    """A trajectory record the viewer cannot draw; the message says why."""


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
    reward_levels: dict[str, str] = field(default_factory=dict)
    """Reward key (as ``reward/<key>/<role>`` names it) -> level, in config order; empty without a config."""
    config_text: str | None = None
    """config.yaml as written, shown in the header; None when missing or unreadable."""
    end: RunEnd | None = None
    """How training ended (run_end.json); None while running, after a kill, or for a record a resume outran."""
    episodes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Split ("train" / "eval") -> slimmed episodes, as the viewer reads them."""
    skipped: list[Skipped] = field(default_factory=list)
    """Damaged lines and files left out, at most ``NOTES_PER_FILE`` per file plus a count."""

    @property
    def train_records(self) -> list[dict[str, Any]]:
        return [r for r in self.records if any(k.startswith("reward/") for k in r)]

    @property
    def critic_groups(self) -> list[str]:
        """Groups that report a learned critic (``group/<g>/critic/...``: their own, or the centralized one)."""
        logged = {key.split("/")[1] for record in self.records for key in record
                  if key.startswith("group/") and key.count("/") >= 3 and key.split("/")[2] == "critic"}
        return [g for g in self.groups if g in logged]


def load_run(root: Path) -> RunData:
    """Read metrics, config and trajectories of one run directory.

    Raises :class:`UserError` only when ``metrics.jsonl`` exists but cannot be read at all.
    """
    root = Path(root)
    skipped: list[Skipped] = []

    def note(file: str) -> Note:
        return lambda line, why: skipped.append(Skipped(file, line, why))

    records = metrics_records(root / "metrics.jsonl", note("metrics.jsonl"))
    config = read_config(root / "config.yaml", note("config.yaml"))
    roles = list(config["roles"]) or _names(records, "role/", 1)
    groups = sorted(set(_names(records, "group/", 1)) | set(config["models"]))
    primary = _primary_reward(config["rewards"])
    steps = config["trainer"].get("steps")
    planned = steps if isinstance(steps, int) and not isinstance(steps, bool) else None
    run = RunData(root=root, name=str(config.get("name") or root.name), records=records, roles=roles,
                  groups=groups, planned_steps=planned, primary_reward=primary, mapping=model_mapping(config),
                  reward_levels=reward_levels(config["rewards"]), config_text=config_text(root / "config.yaml"))
    end = read_end(root, note("run_end.json"))
    last = max((r["step"] for r in records if isinstance(r.get("step"), int)), default=0)
    run.end = end if end is not None and end.step >= last else None
    if (root / "trajectories").exists() and not (root / "trajectories").is_dir():
        note("trajectories")(None, "not a directory; no episodes shown")
    for split in ("train", "eval"):
        name = f"trajectories/{split}.jsonl"
        run.episodes[split] = select_episodes(_read_episodes(root / name, primary, note(name)))
    run.skipped = bounded(skipped)
    return run


def model_mapping(config: dict[str, Any]) -> list[GroupMapping]:
    """Per model group: backend, roles and sharing scheme, read from the plain config.yaml dict.

    The scheme words follow ``unimas validate``'s summary, so the report and the CLI read alike.
    """
    roles = {name: spec for name, spec in (config.get("roles") or {}).items() if isinstance(spec, dict)}
    algorithm = config.get("algorithm") if isinstance(config.get("algorithm"), dict) else {}
    central = algorithm.get("central_critic") if algorithm.get("critic") == "centralized" else None
    rows = []
    for group, spec in (config.get("models") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        members = [name for name, role in roles.items() if role.get("model") == group]
        adapters = sorted({str(roles[r]["adapter"]) for r in members if roles[r].get("adapter")})
        if spec.get("trainable", True) is False:
            scheme = "frozen"
        elif group == central:
            scheme = "centralized critic (values every role's turns)"
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


def reward_levels(rewards: list[Any]) -> dict[str, str]:
    """Reward key -> level of each well-formed entry, keyed like ``unimas.algorithms.credit.reward_keys``."""
    names = [r.get("name") if isinstance(r, dict) else None for r in rewards]
    levels = {}
    for index, spec in enumerate(rewards):
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            key = spec["name"] if names.count(spec["name"]) == 1 else f"{spec['name']}#{index}"
            levels[key] = str(spec.get("level", "trajectory"))
    return levels


def _primary_reward(rewards: list[dict[str, Any]]) -> str | None:
    """The first trajectory-level reward, keyed the way ``unimas.algorithms.credit.reward_keys`` names it."""
    names = [r.get("name") if isinstance(r, dict) else None for r in rewards]
    for index, spec in enumerate(rewards):
        if isinstance(spec, dict) and spec.get("level", "trajectory") == "trajectory":
            name = spec.get("name")
            if not isinstance(name, str):
                return None
            return name if names.count(name) == 1 else f"{name}#{index}"
    return None


def _read_episodes(path: Path, primary: str | None,
                   note: Note) -> list[dict[str, Any]]:
    """The drawable episodes of one trajectory file that :func:`select_episodes` may keep, slimmed line by line.

    Each step's candidates are cut back to its picks as they come, so memory follows what is kept, not the
    length of the file (a long run's file holds tens of thousands of episodes).
    """
    if not path.exists():
        return []
    by_step: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    try:
        with open_regular(path) as handle:
            for number, text, whole in json_lines(handle, note):
                try:
                    episode = slim_episode(json.loads(text), primary)
                    candidates = by_step[episode["step"]]
                    candidates.append(episode)
                    if len(candidates) > 4 * PER_OUTCOME:
                        picked = {id(e) for e in step_picks(candidates)}
                        candidates[:] = [e for e in candidates if id(e) in picked]  # in the order they came
                except DamagedEpisode as exc:
                    note(number, f"{exc}; episode skipped")
                except (ValueError, RecursionError):  # not JSON, integers too long, nesting too deep
                    note(number, "not valid JSON; skipped" if whole else "torn last line (run killed?); skipped")
    except OSError as exc:
        note(None, f"cannot be read ({exc.strerror or exc}); its episodes are not shown")
    return [episode for candidates in by_step.values() for episode in candidates]


def finite(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (text, bool, NaN, an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _cut(value: Any) -> str:
    text = value if isinstance(value, str) else "" if value is None else json.dumps(value, default=str)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"… [{len(text) - MAX_TEXT} more characters]"


def _cut_middle(value: Any) -> str:
    """Like :func:`_cut`, but keeps both ends: a rendered prompt's tail holds the new input and the
    template's generation marker, which a reader most wants to see."""
    text = value if isinstance(value, str) else "" if value is None else json.dumps(value, default=str)
    if len(text) <= MAX_TEXT:
        return text
    half = MAX_TEXT // 2
    return text[:half] + f"\n… [{len(text) - 2 * half} characters left out] …\n" + text[-half:]


def conversation(value: Any) -> tuple[list[dict[str, str]], int]:
    """The drawable chat messages of a turn and how many were left out.

    Entries that are not ``{"role": str, "content": str}`` objects are skipped (a wrong-typed
    ``messages`` field gives no messages); contents are cut like other texts. Of a long
    conversation the first message and the latest ``MAX_MESSAGES - 1`` are kept.
    """
    if not isinstance(value, list):
        return [], 0
    good = [{"role": _cut(m["role"]), "content": _cut(m["content"])} for m in value
            if isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)]
    if len(good) <= MAX_MESSAGES:
        return good, 0
    return good[:1] + good[1 - MAX_MESSAGES:], len(good) - MAX_MESSAGES


def _text(value: Any) -> str | None:
    """Short text for a label or an error field, None kept as None."""
    return None if value is None else _cut(value)


def shown_rewards(rewards: Any) -> dict[str, Any]:
    """Reward key -> a number or a flat mapping of numbers (per role or turn), as the viewer shows them.

    Numbers are made finite (or null) and anything deeper than those two levels becomes its JSON cut to
    text: a reward nested a thousand levels deep in the file would exhaust the recursion of the page's own
    JSON encoding and stop the whole report.
    """
    if not isinstance(rewards, dict):
        return {}

    def leaf(value: Any) -> Any:
        return finite(value) if value is None or isinstance(value, (int, float)) else _cut(value)

    return {str(key): {str(k): leaf(v) for k, v in value.items()} if isinstance(value, dict) else leaf(value)
            for key, value in rewards.items()}


def episode_score(episode: dict[str, Any], primary: str | None) -> float | None:
    """The primary trajectory reward, else the mean credit of the episode's turns; None when nothing graded it.

    An episode that ended in an error is not graded: credit gives it 0 by rule, and that 0 would rank it
    above every graded episode of a step whose rewards are negative, so the viewer's "best" would show a
    crash. Ungraded episodes rank after every graded one (``step_picks``, the viewer's sort).
    """
    if episode.get("error") is not None:
        return None
    rewards = episode.get("rewards")
    value = finite(rewards.get(primary)) if primary and isinstance(rewards, dict) else None
    if value is not None:
        return value
    credits = [finite(n.get("reward")) for n in episode["nodes"] if n.get("kind", "turn") == "turn"]
    credits = [c for c in credits if c is not None]
    return sum(credits) / len(credits) if credits else None


def layout(nodes: list[dict[str, Any]], edges: list[list[str]]) -> dict[str, tuple[int, int]]:
    """Node id -> (layer, slot): layer = longest path from a source, slot = order of start time in the layer."""
    graph = nx.DiGraph()
    graph.add_nodes_from(n["id"] for n in nodes)
    graph.add_edges_from((a, b) for a, b in edges if a in graph and b in graph)
    depth: dict[str, int] = {}
    try:
        for node_id in nx.topological_sort(graph):
            depth[node_id] = max((depth[p] + 1 for p in graph.predecessors(node_id)), default=0)
    except nx.NetworkXUnfeasible:
        raise DamagedEpisode("its edges form a cycle") from None
    layers: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for node in nodes:
        layers[depth[node["id"]]].append(node)
    return {n["id"]: (d, slot) for d, members in layers.items()
            for slot, n in enumerate(sorted(members, key=lambda n: (finite(n.get("started")) or 0.0, n["id"])))}


def _check(episode: Any) -> None:
    """Raise :class:`DamagedEpisode` unless ``episode`` has the shape the viewer draws."""
    if not isinstance(episode, dict):
        raise DamagedEpisode(f"not a JSON object ({type(episode).__name__})")
    nodes, edges = episode.get("nodes"), episode.get("edges", [])
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise DamagedEpisode("'nodes' is not a list of objects")
    ids = [n.get("id") for n in nodes]
    if not all(isinstance(i, str) and i for i in ids):
        raise DamagedEpisode("a node has no id (or a non-text one)")
    if len(set(ids)) < len(ids):
        raise DamagedEpisode("two nodes share an id")
    if not isinstance(edges, list) or not all(isinstance(e, list) and len(e) == 2
                                              and all(isinstance(end, str) for end in e) for e in edges):
        raise DamagedEpisode("'edges' is not a list of [from, to] id pairs")
    outcome = episode.get("outcome")
    step = _step_of(episode, dict(outcome) if isinstance(outcome, dict) else {})
    if isinstance(step, bool) or not isinstance(step, int):
        raise DamagedEpisode("its step is not an integer")


def _step_of(episode: dict[str, Any], outcome: dict[str, Any]) -> Any:
    """The episode's ``step``; files written before it moved beside the outcome have it as ``outcome._step``
    (taken out of ``outcome``, which is shown)."""
    step = episode.get("step")
    return outcome.pop("_step", 0) if step is None else step


def slim_episode(episode: dict[str, Any], primary: str | None) -> dict[str, Any]:
    """What the viewer shows of one episode, with each node's grid position.

    Raises :class:`DamagedEpisode` for a record whose graph cannot be drawn; every
    other field is coerced (texts cut, numbers made finite or null).
    """
    _check(episode)
    edges = episode.get("edges", [])
    positions = layout(episode["nodes"], edges)
    nodes = []
    for raw in episode["nodes"]:
        kind = raw.get("kind", "turn")
        node = {"id": raw["id"], "kind": kind if isinstance(kind, str) else _cut(kind),
                "layer": positions[raw["id"]][0], "slot": positions[raw["id"]][1]}
        if node["kind"] == "turn":
            ids = raw.get("response_ids")
            messages, omitted = conversation(raw.get("messages"))
            node.update(role=_text(raw.get("role")), group=_text(raw.get("model_group")),
                        prompt=_cut_middle(raw.get("prompt")), input=_cut(raw.get("input")), messages=messages,
                        messages_omitted=omitted, continued=raw.get("continued") is True,
                        truncated=raw.get("truncated") is True, text=_cut(raw.get("text")),
                        parsed=_text(raw.get("parsed")), parse_error=_text(raw.get("parse_error")),
                        reward=finite(raw.get("reward")), advantage=finite(raw.get("advantage")),
                        tokens=len(ids) if isinstance(ids, list) else 0)
        else:
            node.update(tool=_text(raw.get("tool")), arguments=_cut(raw.get("arguments")),
                        result=_cut(raw.get("result")), error=_text(raw.get("error")))
        nodes.append(node)
    task = episode.get("task")
    dataset_id = task.get("id") if isinstance(task, dict) else None
    outcome = dict(episode["outcome"]) if isinstance(episode.get("outcome"), dict) else {}
    step = _step_of(episode, outcome)
    rewards = episode.get("rewards")
    problems = episode.get("error") is not None or any(n.get("parse_error") or n.get("error") for n in nodes)
    return {
        "id": _text(episode.get("episode_id")), "task_id": _text(episode.get("task_id")), "step": step,
        # What a reader knows the task by: the dataset's own id; the internal uid only as a fallback.
        "task_label": _cut(dataset_id) if dataset_id is not None else _text(episode.get("task_id")),
        "task": _cut(task), "outcome": _cut(outcome), "rewards": shown_rewards(rewards),
        "error": _text(episode.get("error")), "failed": problems, "score": episode_score(episode, primary),
        "wall_s": finite((finite(episode.get("ended")) or 0.0) - (finite(episode.get("started")) or 0.0)) or 0.0,
        "nodes": nodes, "edges": [list(e) for e in edges],
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
    return [episode for step in steps for episode in step_picks(by_step[step])]


def step_picks(episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One step's best and worst graded few, its failed few and its ungraded few (``PER_OUTCOME`` each, ties in
    the order given), once each."""
    graded = sorted((e for e in episodes if e["score"] is not None), key=lambda e: -e["score"])
    picks = (graded[:PER_OUTCOME] + graded[-PER_OUTCOME:] + [e for e in episodes if e["failed"]][:PER_OUTCOME]
             + [e for e in episodes if e["score"] is None][:PER_OUTCOME])
    return list({id(e): e for e in picks}.values())
