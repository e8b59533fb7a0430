"""Declarative workflow graphs (``workflow.graph`` in the config).

A graph workflow is run through the same ``ctx.act`` / ``ctx.tool`` calls as a
Python workflow, so both produce the same graph trajectory. Semantics:

* Execution starts at ``graph.start``. Running an ``llm`` node calls
  ``await ctx.act(node.role, after=consumed, **inputs)``; a ``tool`` node calls
  ``await ctx.tool(node.tool, after=consumed, **inputs)``. ``inputs`` maps
  template variables / tool arguments to expressions (see ``safe_expr``),
  evaluated just before the node runs. The role template also sees the task's
  keys directly (``ctx.act`` merges the task), so inputs only add extra vars.
* The environment of every expression: ``task`` (the task dict); each node
  name -> that node's latest output (llm: parsed text, or the raw text when
  parsing failed; tool: its result, None on error) or None before it has run;
  ``visits`` (node -> times run); ``failed`` (node -> True when its latest run
  had a parse error / tool error).
* ``consumed`` is the latest trajectory node of every graph node named in the
  node's input expressions (not yet run: skipped); these are the trajectory's
  edges.
* After a node runs, its outgoing edges are tried in declaration order; the
  first whose target has ``visits < max_visits`` and whose ``when`` is absent
  or truthy is followed (a saturated target's condition is not evaluated). No
  such edge: the episode ends. A ``when`` that raises ``ExpressionError`` counts
  as false and its message is appended to ``outcome["_condition_errors"]``.
* At most ``graph.max_steps`` nodes run; if the cap stops a chosen transition,
  ``outcome["_max_steps_reached"] = True``.
* An input expression that fails raises ``ExpressionError`` (the episode
  fails): a node must not run on garbage arguments.
* The returned outcome: each ``graph.outcome`` expression evaluated at the end
  (a failing one gives None and its message in ``outcome["_outcome_errors"]``),
  plus ``"last"`` -> the output of the last node run, unless already set.

:func:`check_graph` finds config mistakes before any model is loaded;
:func:`make_graph_workflow` compiles every expression once and refuses graphs
the runner could not execute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Optional

import networkx as nx

from unimas.config.schema import GraphConfig, RoleConfig
from unimas.errors import UserError
from unimas.workflow.safe_expr import Expression, ExpressionError, compile_expression
from unimas.workflow.templates import template_fields

PREFIX = "workflow.graph"
RESERVED = ("task", "visits", "failed")
# keyword parameters of ctx.act / ctx.tool that an input of that name would clash with
_CALL_PARAMS = {"llm": ("role", "after"), "tool": ("name", "after")}

GraphWorkflow = Callable[[Any, dict], Awaitable[dict]]


@dataclass
class _Node:
    name: str
    kind: str
    target: str  # role or tool name
    inputs: dict[str, Expression]
    refs: list[str]  # graph nodes named in the inputs, in declaration order
    max_visits: int


@dataclass
class _Edge:
    path: str
    target: str
    when: Optional[Expression]


def _names(items: Any) -> str:
    return ", ".join(items) or "(none)"


def _expression(text: str, path: str, allowed: set[str], errors: list) -> Optional[Expression]:
    """Compile ``text``; on failure or an unknown name append an error and return None."""
    try:
        expr = compile_expression(text)
    except ExpressionError as exc:
        errors.append((path, f"{exc}; see the allowed syntax in unimas/workflow/safe_expr.py"))
        return None
    unknown = sorted(expr.names - allowed)
    if unknown:
        errors.append((path, f"unknown name {', '.join(repr(n) for n in unknown)}; expressions can use "
                             f"{_names(sorted(RESERVED))} and node names: {_names(sorted(allowed - set(RESERVED)))}"))
        return None
    return expr


def _check_nodes(graph: GraphConfig, roles: Optional[Mapping[str, RoleConfig]], tool_names: Optional[set[str]],
                 task_keys: Optional[set[str]], allowed: set[str], errors: list) -> None:
    for name, node in graph.nodes.items():
        path = f"{PREFIX}.nodes.{name}"
        if name in RESERVED:
            errors.append((path, f"node name '{name}' is reserved for expressions; rename the node"))
        elif not name.isidentifier() or name.startswith("__"):
            errors.append((path, f"node name '{name}' must be a plain identifier (letters, digits, _) "
                                 "so expressions can refer to it; rename the node"))
        field, other = ("role", "tool") if node.kind == "llm" else ("tool", "role")
        target = getattr(node, field)
        if getattr(node, other) is not None:
            errors.append((f"{path}.{other}", f"a {node.kind} node takes no '{other}'; remove it or set "
                                              f"kind: {other if other == 'tool' else 'llm'}"))
        known = roles if field == "role" else tool_names
        if target is None:
            hint = f"; known: {_names(sorted(known))}" if known is not None else ""
            errors.append((f"{path}.{field}", f"a {node.kind} node needs '{field}:'{hint}"))
        elif known is not None and target not in known:
            errors.append((f"{path}.{field}", f"unknown {field} '{target}'; known: {_names(sorted(known))}"))
        for key, text in node.inputs.items():
            if key in _CALL_PARAMS[node.kind]:
                errors.append((f"{path}.inputs.{key}", f"input name '{key}' clashes with a parameter of "
                                                       f"ctx.{'act' if node.kind == 'llm' else 'tool'}; rename it"))
            _expression(text, f"{path}.inputs.{key}", allowed, errors)
        if node.kind == "llm" and roles is not None and target in roles:
            _check_template(name, node.inputs, target, roles[target], task_keys, errors)


def _check_template(name: str, inputs: Mapping[str, str], role: str, spec: RoleConfig,
                    task_keys: Optional[set[str]], errors: list) -> None:
    try:
        fields = template_fields(spec.template)
    except ValueError as exc:
        errors.append((f"roles.{role}.template", str(exc)))
        return
    for field in dict.fromkeys(fields):
        if field in inputs or task_keys is None or field in task_keys:
            continue
        errors.append((f"{PREFIX}.nodes.{name}.inputs",
                       f"the template of role '{role}' needs {{{field}}}, which is neither an input nor a task key "
                       f"(task keys: {_names(sorted(task_keys))}); add '{field}: <expression>' under inputs"))


def _check_edges(graph: GraphConfig, allowed: set[str], errors: list) -> None:
    nodes = _names(graph.nodes)
    if graph.start not in graph.nodes:
        errors.append((f"{PREFIX}.start", f"unknown node '{graph.start}'; nodes are: {nodes}"))
    for index, edge in enumerate(graph.edges):
        path = f"{PREFIX}.edges[{index}]"
        for field, value in (("from", edge.source), ("to", edge.target)):
            if value not in graph.nodes:
                errors.append((f"{path}.{field}", f"unknown node '{value}'; nodes are: {nodes}"))
        if edge.when is not None:
            _expression(edge.when, f"{path}.when", allowed, errors)
    for key, text in graph.outcome.items():
        _expression(text, f"{PREFIX}.outcome.{key}", allowed, errors)


def _check_shape(graph: GraphConfig, errors: list) -> None:
    """Reachability, a designed exit, and cycles that can actually repeat."""
    if graph.start not in graph.nodes:
        return
    digraph = nx.DiGraph()
    digraph.add_nodes_from(graph.nodes)
    edges = [e for e in graph.edges if e.source in graph.nodes and e.target in graph.nodes]
    digraph.add_edges_from((e.source, e.target) for e in edges)
    reachable = nx.descendants(digraph, graph.start) | {graph.start}
    for name in graph.nodes:
        if name not in reachable:
            errors.append((f"{PREFIX}.nodes.{name}", f"node '{name}' cannot be reached from start "
                                                     f"'{graph.start}'; add an edge to it or remove it"))
    unconditional = {e.source for e in edges if e.when is None}
    if all(name in unconditional for name in reachable):
        errors.append((f"{PREFIX}.edges", "no reachable node can end the episode: each has an unconditional "
                                          "outgoing edge; add 'when:' to an edge or a node with no outgoing edges"))
    order = list(graph.nodes)
    for component in nx.strongly_connected_components(digraph):
        members = sorted(component, key=order.index)
        if len(members) == 1 and not digraph.has_edge(members[0], members[0]):
            continue
        if all(graph.nodes[n].max_visits <= 1 for n in members):
            errors.append((f"{PREFIX}.nodes.{members[0]}.max_visits",
                           f"nodes {', '.join(members)} form a cycle, but none has max_visits > 1, so it can "
                           "never repeat; set max_visits on one of them (e.g. max_visits: 3)"))


def check_graph(graph: GraphConfig, roles: Mapping[str, RoleConfig], tool_names: set[str],
                task_keys: set[str] | None = None) -> list[tuple[str, str]]:
    """Every mistake in ``graph`` as (config path, message saying how to fix it); empty when fine."""
    errors: list[tuple[str, str]] = []
    allowed = set(RESERVED) | set(graph.nodes)
    _check_nodes(graph, roles, tool_names, task_keys, allowed, errors)
    _check_edges(graph, allowed, errors)
    _check_shape(graph, errors)
    return errors


def _compile(graph: GraphConfig) -> tuple[dict[str, _Node], dict[str, list[_Edge]], dict[str, Expression]]:
    errors: list[tuple[str, str]] = []
    allowed = set(RESERVED) | set(graph.nodes)
    _check_nodes(graph, None, None, None, allowed, errors)
    _check_edges(graph, allowed, errors)
    if errors:
        raise UserError("invalid workflow graph:\n" + "\n".join(f"  {p}: {m}" for p, m in errors), where=PREFIX)
    nodes: dict[str, _Node] = {}
    for name, spec in graph.nodes.items():
        inputs = {k: compile_expression(v) for k, v in spec.inputs.items()}
        used = set().union(*(e.names for e in inputs.values()))
        refs = [n for n in graph.nodes if n in used]
        target = spec.role if spec.kind == "llm" else spec.tool
        nodes[name] = _Node(name, spec.kind, target, inputs, refs, spec.max_visits)
    edges: dict[str, list[_Edge]] = {name: [] for name in graph.nodes}
    for index, edge in enumerate(graph.edges):
        when = compile_expression(edge.when) if edge.when is not None else None
        edges[edge.source].append(_Edge(f"{PREFIX}.edges[{index}]", edge.target, when))
    outcome = {k: compile_expression(v) for k, v in graph.outcome.items()}
    return nodes, edges, outcome


def make_graph_workflow(graph: GraphConfig) -> GraphWorkflow:
    """Compile ``graph`` once into an ``async (ctx, task) -> outcome`` workflow; UserError if it cannot run."""
    nodes, edges, outcome_exprs = _compile(graph)

    async def graph_workflow(ctx: Any, task: dict) -> dict:
        outputs: dict[str, Any] = dict.fromkeys(nodes)
        visits = dict.fromkeys(nodes, 0)
        failed = dict.fromkeys(nodes, False)
        latest: dict[str, Any] = {}
        outcome: dict[str, Any] = {}
        condition_errors: list[str] = []
        current: Optional[str] = graph.start
        last, steps = None, 0

        def env() -> dict[str, Any]:
            return {**outputs, "task": task, "visits": visits, "failed": failed}

        while current is not None:
            if steps >= graph.max_steps:
                outcome["_max_steps_reached"] = True
                break
            node = nodes[current]
            scope = env()
            inputs = {}
            for key, expr in node.inputs.items():
                try:
                    inputs[key] = expr.evaluate(scope)
                except ExpressionError as exc:
                    raise ExpressionError(f"{PREFIX}.nodes.{current}.inputs.{key}: {exc}") from None
            after = [latest[r] for r in node.refs if r in latest]
            if node.kind == "llm":
                record = await ctx.act(node.target, after=after, **inputs)
                value = record.parsed if record.parsed is not None else record.text
                failed[current] = record.parse_error is not None
            else:
                record = await ctx.tool(node.target, after=after, **inputs)
                value = record.result
                failed[current] = record.error is not None
            outputs[current], latest[current], last = value, record, value
            visits[current] += 1
            steps += 1
            current = _next_node(edges[current], nodes, visits, env(), condition_errors)

        scope = env()
        for key, expr in outcome_exprs.items():
            try:
                outcome[key] = expr.evaluate(scope)
            except ExpressionError as exc:
                outcome[key] = None
                outcome.setdefault("_outcome_errors", {})[key] = str(exc)
        outcome.setdefault("last", last)
        if condition_errors:
            outcome["_condition_errors"] = condition_errors
        return outcome

    graph_workflow.graph = graph  # type: ignore[attr-defined]
    return graph_workflow


def _next_node(edges: list[_Edge], nodes: Mapping[str, _Node], visits: Mapping[str, int],
               scope: Mapping[str, Any], condition_errors: list[str]) -> Optional[str]:
    for edge in edges:
        if visits[edge.target] >= nodes[edge.target].max_visits:
            continue
        if edge.when is None:
            return edge.target
        try:
            value = edge.when.evaluate(scope)
            taken = bool(value)
        except Exception as exc:  # noqa: BLE001 - a failing condition is false, and recorded
            message = f"{edge.path}.when: {exc}"
            if message not in condition_errors:
                condition_errors.append(message)
            continue
        if taken:
            return edge.target
    return None
