"""Checks of the config against the first rows of its dataset: graph inputs they lack, characters a tiny model
cannot read. They run once the config itself passed (:func:`unimas.preflight.validate.validate`)."""

from __future__ import annotations

from unimas.config.schema import ExperimentConfig, RoleConfig
from unimas.contract.registry import Registry
from unimas.preflight.problems import Problem, group_options
from unimas.workflow.graph import check_graph
from unimas.workflow.templates import render, template_fields


def check_tasks(config: ExperimentConfig, registry: Registry, tasks: list[dict]) -> list[Problem]:
    """What the first tasks reveal: graph inputs the rows lack, characters a tiny model cannot read."""
    problems: list[Problem] = []
    graph = config.workflow.graph
    if graph is not None:
        task_keys = set().union(*(task.keys() for task in tasks))
        problems += check_graph(graph, config.roles, set(registry.names("tools")), task_keys)
        problems += _rows_missing_inputs(config, tasks)
    for name, role in config.roles.items():
        alphabet = getattr(group_options(config, registry, role.model), "alphabet", None)
        if alphabet is not None:
            problems += _outside_alphabet(name, role, set(alphabet), tasks, config.data.name)
    return problems


def _rows_missing_inputs(config: ExperimentConfig, tasks: list[dict]) -> list[Problem]:
    """Template fields a graph node takes from the task that some rows lack (all rows lacking: check_graph)."""
    problems = []
    for node_name, node in config.workflow.graph.nodes.items():
        role = config.roles.get(node.role or "")
        if node.kind != "llm" or role is None:
            continue
        for field in dict.fromkeys(template_fields(role.template)):
            rows = [i for i, task in enumerate(tasks) if field not in task]
            if field not in node.inputs and rows and len(rows) < len(tasks):
                problems.append((f"workflow.graph.nodes.{node_name}.inputs", f"row {rows[0]} of dataset "
                                 f"'{config.data.name}' has no field '{field}', which the template of role "
                                 f"'{node.role}' needs; add it to every row or pass it under inputs"))
    return problems


def _outside_alphabet(name: str, role: RoleConfig, alphabet: set[str], tasks: list[dict],
                      dataset: str) -> list[Problem]:
    """Prompt characters a char-level model would read as <unk>: literal text first, then task values."""
    def shown(chars: set[str]) -> str:
        return ", ".join(repr(c) for c in sorted(chars))

    hint = f"add them to models.{role.model}.options.tiny.alphabet"
    problems = []
    fields = dict.fromkeys(template_fields(role.template or ""))
    literal = {"system": role.system, "template": render(role.template or "", dict.fromkeys(fields, ""))}
    for key, text in literal.items():
        if set(text) - alphabet:
            problems.append((f"roles.{name}.{key}", f"characters outside the alphabet of model group '{role.model}': "
                                                    f"{shown(set(text) - alphabet)}; {hint} or change the text"))
    for field in fields:
        row = next((i for i, task in enumerate(tasks) if field in task and set(str(task[field])) - alphabet), None)
        if row is not None:
            bad = set(str(tasks[row][field])) - alphabet
            problems.append((f"roles.{name}.template", f"{{{field}}} of row {row} of dataset '{dataset}' has "
                                                       f"characters outside the alphabet: {shown(bad)}; {hint}"))
    return problems
