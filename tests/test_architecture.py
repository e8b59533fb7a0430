"""The structure docs/architecture.md describes, checked: no import cycles, no upward imports, short modules."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import unimas

PACKAGE = Path(unimas.__file__).resolve().parent
MAX_LINES = 500
"""A guard against runaway growth, not a layout rule: modules split by what they own, never to get under a count."""

SPOKES_MUST_NOT_IMPORT = ("unimas.controller", "unimas.credit", "unimas.trainer", "unimas.metrics",
                          "unimas.experiment", "unimas.validate", "unimas.api", "unimas.commands", "unimas.cli")
"""The spokes (model groups, transports) know nothing of the hub or the loop above them."""
WORKFLOW_MUST_NOT_IMPORT = ("unimas.controller", "unimas.groups", "unimas.trainer", "unimas.credit")
"""Declarative graphs are data plus an evaluator: they drive a context, they do not import it."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path) -> set[str]:
    """unimas modules imported anywhere in ``path`` (function-local too), except ``if TYPE_CHECKING`` blocks."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for block in ast.walk(tree) if _type_checking_only(block) for n in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
    return {name for name in found if name in MODULES and name != "unimas"}


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for name, path in MODULES.items():
        if name == "unimas":  # the facade re-exports the public surface; nothing inside imports it
            continue
        graph.add_node(name)
        graph.add_edges_from((name, target) for target in imports_of(path))
    return graph


def test_modules_import_without_cycles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], f"import cycles: {cycles}"


def test_packages_import_without_cycles():
    """Collapsed to packages (controller, groups, workflow, report, top-level modules), still a DAG."""
    def package(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:2])

    graph = nx.DiGraph()
    for source, target in import_graph().edges:
        if package(source) != package(target):
            graph.add_edge(package(source), package(target))
    assert list(nx.simple_cycles(graph)) == []


@pytest.mark.parametrize(("prefix", "forbidden"), [("unimas.groups", SPOKES_MUST_NOT_IMPORT),
                                                   ("unimas.workflow", WORKFLOW_MUST_NOT_IMPORT)])
def test_no_upward_imports(prefix, forbidden):
    upward = [(source, target) for source, target in import_graph().edges
              if source.startswith(prefix) and target.startswith(forbidden)]
    assert upward == []


def test_the_checker_sees_a_cycle(tmp_path):
    """The walk above would miss nothing: a planted function-local import shows up as an edge."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from unimas.trainer import Trainer\n")
    assert "unimas.trainer" in imports_of(planted)


def test_no_module_over_500_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_public_surface_is_importable_from_unimas():
    for name in unimas.__all__:
        assert getattr(unimas, name) is not None, name
    assert callable(unimas.train)
