"""Graph trajectories: the record of one episode.

An episode is a DAG in time. Turn nodes hold what a role saw and said (text,
token ids, log-probs, parse result); tool nodes hold calls and results; an
edge ``a -> b`` says that ``b`` consumed the output of ``a``. Rewards and
advantages are written onto the nodes, so the report can show exactly what
each turn was credited with. networkx holds the graph; JSON is the wire and
disk format and round-trips losslessly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Iterable, Iterator, Optional

import networkx as nx


@dataclass
class TurnNode:
    id: str
    role: str
    model_group: str
    prompt: str
    """The prompt as the model saw it (with the chat template's role markers when one is used)."""
    text: str = ""
    input: str = ""
    """This turn's new input: the role's rendered template (the last user message)."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The chat messages the prompt was rendered from (system, earlier turns per ``memory``, the input)."""
    continued: bool = False
    """The prompt ids extend the role's previous turn's prompt + response ids exactly (no re-tokenising)."""
    rerendered: Optional[str] = None
    """Why a later turn of the role was rendered afresh instead of continued (None: continued, or a first turn)."""
    tools: Optional[list[dict[str, Any]]] = None
    """The function definitions the prompt was rendered with (gateway turns with ``tools``)."""
    forced_ids: list[int] = field(default_factory=list)
    """Ids forced at the start of the answer (the gateway's ``tool_choice``): the last ids of ``prompt_ids``,
    so they are context, never trained as sampled; ``text`` starts with their text."""
    stop: Optional[str] = None
    """The request's stop string that ended sampling: ``response_ids`` end with the token that completed it,
    ``text`` ends before it."""
    format_error: Optional[str] = None
    """Why the answer does not meet the request's ``response_format`` (None: met, or none asked)."""
    token_texts: list[str] = field(default_factory=list)
    """Each response token as text (recorded only when the request asked for ``logprobs``)."""
    truncated: bool = False
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    logprobs_exact: bool = False
    """The group's word that ``logprobs`` are its training distribution (see ``GenResult``)."""
    weight_version: Optional[int] = None
    """How many updates the group had made when it sampled this turn (None: the backend does not say)."""
    finished: bool = True
    parsed: Any = None
    """The role parser's answer (a string, or e.g. a dict for the json parser); None on a parse error."""
    parse_error: Optional[str] = None
    role_turn_index: int = 0
    started: float = 0.0
    ended: float = 0.0
    reward: Optional[float] = None
    advantage: Optional[float] = None
    replayed: bool = False
    """Copied token for token from the parent episode of a fork (not sampled; never trained twice)."""
    staleness: int = 0
    """Steps between sampling this turn and training on it (0 = this step; >0 = mixed in from replay)."""
    kind: str = "turn"


@dataclass
class ToolNode:
    id: str
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    error: Optional[str] = None
    started: float = 0.0
    ended: float = 0.0
    kind: str = "tool"


Node = TurnNode | ToolNode


@dataclass
class GraphTrajectory:
    """One episode: a DAG of turn and tool nodes plus the task and outcome."""

    episode_id: str
    task_id: str
    task: dict[str, Any] = field(default_factory=dict)
    outcome: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    rewards: dict[str, Any] = field(default_factory=dict)
    """Per reward name: the value the plugin returned (trajectory/role/turn level), clipped to ±1e6
    (``unimas.algorithms.credit.REWARD_BOUND``)."""
    unclipped_rewards: dict[str, Any] = field(default_factory=dict)
    """Per reward name, only where clipping changed something: what the plugin returned (a number, or for role
    and turn levels a dict of the clipped entries)."""
    started: float = 0.0
    ended: float = 0.0
    forked_from: Optional[str] = None
    """Episode id of the parent when this episode was forked from a recorded one (see unimas.controller.forking)."""
    fork_turn: Optional[str] = None
    """Id of the first freshly sampled turn of a fork; the turns before it were replayed from the parent."""
    metrics: dict[str, list[float]] = field(default_factory=dict)
    """What the workflow logged with ``ctx.metric(name, value)``: per name, the values in call order."""
    step: Optional[int] = None
    """The training step a trajectory file records the episode at (set when it is written there), kept beside the
    workflow's ``outcome`` so the outcome stays exactly what the workflow returned."""
    exception: Optional[BaseException] = field(default=None, repr=False, compare=False)
    """The exception behind ``error`` (not serialised): ``--debug`` shows its traceback."""
    _in_order: list[Node] = field(default_factory=list, repr=False, compare=False)
    _turns: list[TurnNode] = field(default_factory=list, repr=False, compare=False)
    """The turn nodes of ``_in_order``: ``turns()`` runs ~5 times per episode per step (context, credit, metrics)."""
    _by_id: dict[str, Node] = field(default_factory=dict, repr=False, compare=False)
    _edges: list[tuple[str, str]] = field(default_factory=list, repr=False, compare=False)
    _graph: Optional[nx.DiGraph] = field(default=None, repr=False, compare=False)

    @property
    def graph(self) -> nx.DiGraph:
        """The episode as a networkx graph (node attribute ``data``: the node), built on first use.

        Training never needs it, so recording a turn is a list append, not
        networkx insertions (~4 µs per turn, profiled in ``benchmarks/overhead.py``);
        once built, the graph is kept up to date and is the record of the edges.
        """
        if self._graph is None:
            self._graph = nx.DiGraph()
            self._graph.add_nodes_from((node.id, {"data": node}) for node in self._in_order)
            self._graph.add_edges_from(self._edges)
        return self._graph

    def add_node(self, node: Node, consumed: Iterable[str] = ()) -> Node:
        self._by_id[node.id] = node
        self._in_order.append(node)
        if isinstance(node, TurnNode):
            self._turns.append(node)
        if self._graph is not None:
            self._graph.add_node(node.id, data=node)
        for source in consumed:
            if source not in self._by_id:
                raise KeyError(f"node {source!r} is not part of episode {self.episode_id}")
            self.add_edge(source, node.id)
        return node

    def add_edge(self, source: str, target: str) -> None:
        if self._graph is None:
            self._edges.append((source, target))
        else:
            self._graph.add_edge(source, target)

    def node(self, node_id: str) -> Node:
        return self._by_id[node_id]

    def nodes(self) -> Iterator[Node]:
        """Nodes in the order they happened.

        ``add_node`` only accepts edges from nodes already present, so
        insertion order is a topological order: no sort (and no networkx
        view) on this hot path — credit and metrics walk every episode's
        nodes several times per step.
        """
        return iter(self._in_order)

    def turns(self, role: str | None = None) -> list[TurnNode]:
        if role is None:
            return self._turns.copy()
        return [n for n in self._turns if n.role == role]

    def tool_calls(self) -> list[ToolNode]:
        return [n for n in self.nodes() if isinstance(n, ToolNode)]

    def fail(self, message: str, exception: BaseException | None = None) -> None:
        """Mark the episode failed; the first failure is the one reported."""
        if self.error is None:
            self.error, self.exception = message, exception

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_dict(self) -> dict[str, Any]:
        """A deep copy as plain data (``unimas.training.replay`` copies an episode through it)."""
        return self._as_data([asdict(node) for node in self._in_order])

    def _as_data(self, nodes: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "task_id": self.task_id,
            "task": self.task,
            "outcome": self.outcome,
            "error": self.error,
            "rewards": self.rewards,
            "unclipped_rewards": self.unclipped_rewards,
            "started": self.started,
            "ended": self.ended,
            "forked_from": self.forked_from,
            "fork_turn": self.fork_turn,
            "metrics": self.metrics,
            "step": self.step,
            "nodes": nodes,
            "edges": self._edge_list(),
        }

    def _edge_list(self) -> list[list[str]]:
        """The edges as ``graph.edges`` lists them (by source in node order, each once), without building the
        networkx graph when it was never asked for (~30 µs an episode, for every sampled trajectory written)."""
        if self._graph is not None or any(a not in self._by_id or b not in self._by_id for a, b in self._edges):
            return [[a, b] for a, b in self.graph.edges]
        targets: dict[str, dict[str, None]] = {}
        for a, b in self._edges:
            targets.setdefault(a, {})[b] = None
        return [[node.id, b] for node in self._in_order for b in targets.get(node.id, ())]

    def to_json(self) -> str:
        """The JSON line of this episode, from the nodes' own values.

        No ``to_dict`` deep copy on the way: ``dataclasses.asdict`` recurses
        into every id, log-prob and message (2 ms per step for 4 sampled
        episodes, profiled in ``benchmarks/overhead.py``) only to feed ``json.dumps``,
        which copies nothing. The text is the same, except that a dataclass
        in ``task`` or ``outcome`` is now written as its fields (as in a node)
        rather than as its repr.
        """
        nodes = [{name: getattr(node, name) for name in _FIELD_NAMES[type(node)]} for node in self._in_order]
        data = self._as_data(nodes)
        try:
            return json.dumps(data, separators=(",", ":"), default=_json_default)
        except Exception:  # noqa: BLE001 - what user code returned: a huge integer, a cycle, a tuple key, a bad __str__
            return json.dumps(_printable(data), separators=(",", ":"), default=_json_default)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GraphTrajectory":
        traj = cls(**{k: data[k] for k in ("episode_id", "task_id", "task", "outcome", "error",
                                             "rewards", "started", "ended")},
                   forked_from=data.get("forked_from"), fork_turn=data.get("fork_turn"),
                   unclipped_rewards=data.get("unclipped_rewards", {}), step=recorded_step(data),
                   metrics={name: list(values) for name, values in data.get("metrics", {}).items()})
        for raw in data["nodes"]:
            node_cls = TurnNode if raw["kind"] == "turn" else ToolNode
            known = {f.name for f in fields(node_cls)}
            traj.add_node(node_cls(**{k: v for k, v in raw.items() if k in known}))
        for source, target in data["edges"]:
            traj.add_edge(source, target)
        return traj

    @classmethod
    def from_json(cls, text: str) -> "GraphTrajectory":
        return cls.from_dict(json.loads(text))


def recorded_step(record: dict[str, Any]) -> Any:
    """The step of a trajectory-file record: its ``step``, or in files written before the step moved beside the
    outcome, the outcome's ``_step``; None when neither is there (not checked: readers of damaged files check)."""
    if record.get("step") is not None:
        return record["step"]
    outcome = record.get("outcome")
    return outcome.get("_step") if isinstance(outcome, dict) else None


_FIELD_NAMES = {cls: tuple(f.name for f in fields(cls)) for cls in (TurnNode, ToolNode)}


def _json_default(value: Any) -> Any:
    """Parse results, outcomes and tool results are whatever user code returned: a dataclass is written as its
    fields (as ``asdict`` would), anything else JSON cannot hold as text, or a note when even ``str`` fails."""
    try:
        if is_dataclass(value) and not isinstance(value, type):
            return asdict(value)
        return str(value)
    except Exception as exc:  # noqa: BLE001 - a user's __str__ (or a field asdict cannot copy) raised
        return f"<a {type(value).__name__} that cannot be shown: {type(exc).__name__}>"


PRINTABLE_DEPTH = 200
"""Deepest nesting :func:`_printable` keeps; ``json.dumps`` itself recurses once per level."""


def _printable(value: Any, depth: int = 0, open_containers: frozenset[int] = frozenset()) -> Any:
    """``value`` as JSON can always write it: an integer too long for ``str`` (Python's digit limit) becomes a
    note of its size, a container holding itself a note of the cycle, nesting past :data:`PRINTABLE_DEPTH` a
    note of the depth, a key JSON refuses (a tuple, bytes) its text. What a workflow, tool or parser returned
    may hold any of them, and the episode's line must still be written rather than fail the step that writes
    it. Other objects go to :func:`_json_default`, which never raises."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            str(value)
        except ValueError:
            return f"<an integer of {value.bit_length()} bits>"
        return value
    if is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in fields(value)}
    if not isinstance(value, (dict, list, tuple)):
        return value
    if id(value) in open_containers:
        return "<a cycle: this container holds itself>"
    if depth >= PRINTABLE_DEPTH:
        return f"<nested deeper than {PRINTABLE_DEPTH} levels>"
    inner = open_containers | {id(value)}
    if isinstance(value, dict):
        return {_printable_key(key): _printable(item, depth + 1, inner) for key, item in value.items()}
    return [_printable(item, depth + 1, inner) for item in value]


def _printable_key(key: Any) -> Any:
    """A key JSON writes as it is (a string, a printable number, a boolean, None), else its text."""
    if key is None or isinstance(key, (str, float)):
        return key
    if isinstance(key, int):
        return _printable(key)
    return _json_default(key)


def write_jsonl(path, trajectories: Iterable[GraphTrajectory], mode: str = "a") -> None:
    lines = "".join(traj.to_json() + "\n" for traj in trajectories)
    with open(path, mode) as handle:
        handle.write(lines)


def read_jsonl(path) -> list[GraphTrajectory]:
    with open(path) as handle:
        return [GraphTrajectory.from_json(line) for line in handle if line.strip()]
