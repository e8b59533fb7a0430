"""The structure docs/architecture.md describes, checked: no import cycles, no upward imports, short modules.

Every import is an edge: at module level, inside a function, or under ``if TYPE_CHECKING:`` (an annotation is a
dependency too). The table's rows are layers (``training``) and, where a row names one, sub-layers
(``groups.torch``): the torch and verl backends are layers of their own, so the table can say that both may
import ``groups`` (the model-group contract and the backend-neutral kit) and neither may import the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import unimas

PACKAGE = Path(unimas.__file__).resolve().parent
MAX_LINES = 500
"""A guard against runaway growth, not a layout rule: modules split by what they own, never to get under a count."""

ARCHITECTURE_DOC = PACKAGE.parent / "docs" / "architecture.md"
"""Holds the table of allowed import edges (between ``<!-- import-edges -->`` markers): one place, shown to readers."""
NONE = "nothing in unimas"


def allowed_edges() -> dict[str, set[str]]:
    """Layer -> the layers it may import, read from docs/architecture.md's table (layer: first column, edges: last)."""
    text = ARCHITECTURE_DOC.read_text()
    table = text.split("<!-- import-edges -->")[1].split("<!-- /import-edges -->")[0]
    rows = [line.strip().strip("|").split("|") for line in table.splitlines() if line.startswith("| `")]
    edges = {}
    for cells in rows:
        may = cells[-1].strip()
        edges[cells[0].strip().strip("`")] = set() if may == NONE else {n.strip().strip("`") for n in may.split(",")}
    return edges


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path, type_only: bool = False) -> set[str]:
    """unimas modules imported anywhere in ``path`` (function-local too); ``if TYPE_CHECKING`` blocks with ``type_only``."""
    tree = ast.parse(path.read_text())
    skip = set() if type_only else {id(n) for block in ast.walk(tree) if _type_checking_only(block)
                                    for n in ast.walk(block)}
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


def import_graph(type_only: bool = False) -> nx.DiGraph:
    graph = nx.DiGraph()
    for name, path in MODULES.items():
        if name == "unimas":  # the facade re-exports the public surface; nothing inside imports it
            continue
        graph.add_node(name)
        graph.add_edges_from((name, target) for target in imports_of(path, type_only))
    return graph


def sublayers() -> set[str]:
    """The table's rows that name a package inside a layer (``groups.torch``)."""
    return {name for name in allowed_edges() if "." in name}


def layer(module: str) -> str:
    """``unimas.training.trainer`` -> ``training``; ``unimas.groups.torch.group`` -> ``groups.torch`` (a row of
    its own); a top-level module is its own layer (``errors``, ``api``)."""
    parts = module.split(".")
    inner = ".".join(parts[1:3])
    return inner if len(parts) >= 3 and inner in sublayers() else parts[1]


def layer_graph() -> nx.DiGraph:
    """Modules collapsed to layers, type-only imports included: an annotation is a dependency too. A sub-layer
    is a layer inside its parent only: from another layer, ``groups.torch`` is ``groups``."""
    graph = nx.DiGraph()
    for source, target in import_graph(type_only=True).edges:
        outer, inner = layer(source), layer(target)
        if inner.split(".")[0] != outer.split(".")[0]:
            inner = inner.split(".")[0]
        if outer != inner:
            graph.add_edge(outer, inner)
    return graph


def test_modules_import_without_cycles_every_edge_counted():
    """No module cycle anywhere under unimas/, type-only and function-local imports included."""
    cycles = list(nx.simple_cycles(import_graph(type_only=True)))
    assert cycles == [], f"import cycles: {cycles}"


def test_the_two_backends_never_import_each_other():
    """groups.torch and groups.verl share only what groups/ holds (base, kit): neither reaches into the other."""
    graph = import_graph(type_only=True)
    crossing = sorted((source, target) for source, target in graph.edges
                      if {layer(source), layer(target)} == {"groups.torch", "groups.verl"})
    assert crossing == [], f"imports between the torch and verl backends: {crossing}"
    assert "groups.verl" not in allowed_edges()["groups.torch"] and "groups.torch" not in allowed_edges()["groups.verl"]


def test_packages_import_without_cycles_type_only_imports_included():
    assert list(nx.simple_cycles(layer_graph())) == []


def test_each_layer_imports_only_what_the_table_allows():
    allowed = allowed_edges()
    graph = layer_graph()
    assert set(graph.nodes) <= set(allowed), f"layers missing from docs/architecture.md: {set(graph.nodes) - set(allowed)}"
    forbidden = sorted((source, target) for source, target in graph.edges if target not in allowed[source])
    assert forbidden == [], f"imports the table in docs/architecture.md does not allow: {forbidden}"


def test_the_table_of_allowed_edges_is_itself_acyclic():
    table = nx.DiGraph([(source, target) for source, targets in allowed_edges().items() for target in targets])
    assert list(nx.simple_cycles(table)) == []
    assert set(table.nodes) <= set(allowed_edges()), "an allowed target that is not a layer"


@pytest.mark.parametrize("package", sorted({name.split(".")[1] for name, path in MODULES.items()
                                            if name.count(".") == 1 and path.name == "__init__.py"} | sublayers()))
def test_package_docstring_states_its_allowed_imports(package):
    """Each package (and sub-layer) says what it owns and what it may import; the line matches the table."""
    doc = ast.get_docstring(ast.parse(MODULES[f"unimas.{package}"].read_text())) or ""
    lines = [line for line in doc.splitlines() if line.startswith("May import:")]
    assert lines, f"unimas/{package.replace('.', '/')}/__init__.py: no 'May import:' line"
    stated = lines[0].removeprefix("May import:").strip().rstrip(".")
    assert (set() if stated == NONE else {n.strip() for n in stated.split(",")}) == allowed_edges()[package]


def test_top_level_holds_little_more_than_the_public_surface():
    top = sorted(name for name, path in MODULES.items() if name.count(".") == 1 and path.name != "__init__.py")
    assert len(top) <= 12, top


def test_the_checker_sees_a_cycle(tmp_path):
    """The walk above would miss nothing: a planted function-local import shows up as an edge."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from unimas.training.trainer import Trainer\n")
    assert "unimas.training.trainer" in imports_of(planted)


def test_the_cycle_check_sees_a_cycle_closed_by_a_type_only_import(tmp_path):
    """A cycle whose closing edge is an ``if TYPE_CHECKING:`` import is a cycle (the torch backend had one)."""
    planted = tmp_path / "planted.py"
    planted.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from unimas.groups.torch.group import TorchModelGroup\n")
    graph = nx.DiGraph([("unimas.groups.torch.group", "planted")])
    graph.add_edges_from(("planted", target) for target in imports_of(planted, type_only=True))
    assert nx.find_cycle(graph)


def test_a_backend_row_is_a_layer_of_its_own():
    assert layer("unimas.groups.torch.group") == "groups.torch" and layer("unimas.groups.verl.critic") == "groups.verl"
    assert layer("unimas.groups.torch") == "groups.torch" and layer("unimas.groups.base") == "groups"


def test_the_layer_check_sees_type_only_imports(tmp_path):
    """A TYPE_CHECKING import is an edge for the layer checks, and only for them."""
    planted = tmp_path / "planted.py"
    planted.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from unimas.training.trainer import Trainer\n")
    assert "unimas.training.trainer" in imports_of(planted, type_only=True)
    assert "unimas.training.trainer" not in imports_of(planted)


def test_no_module_over_500_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_public_surface_is_importable_from_unimas():
    for name in unimas.__all__:
        assert getattr(unimas, name) is not None, name
    assert callable(unimas.train)
