"""The built-in plugins and workflows are written against the public surface only, as a third party's must be.

``docs/plugins.md`` promises that the built-ins register exactly like a
plugin of yours; these tests make that true of their imports too. A plugin
or workflow module under ``plugins/`` or ``workflows/`` may import from
unimas only:

* ``unimas`` itself: the names in ``unimas.__all__`` (workflows, rewards,
  tools, datasets, parsers, estimators, losses, backends);
* ``unimas.methods``: the names in its ``__all__`` (the four algorithm hooks);
* ``unimas.sandbox`` and ``unimas.sandbox.runner``: the bubblewrap sandbox the
  code tools run model-written programs in (named here: nothing else needs it).

Hooks, capability flags and the stable/experimental split are checked here
too: the hookspecs are annotated with the protocols, the flags are read only
through ``capability``, and ``docs/plugins.md`` says what ``hookspecs.py`` says.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import unimas
import unimas.methods
from tests.conftest import REPO
from unimas.contract import hookspecs, protocols

CHECKED = [REPO / "plugins", REPO / "workflows"]
PUBLIC = {"unimas": set(unimas.__all__), "unimas.methods": set(unimas.methods.__all__)}
SANDBOX = {"unimas.sandbox", "unimas.sandbox.runner"}
"""The code tools (``unimas_plugins.sandbox``, ``unimas_workflows.code_team``) run untrusted code through it."""
SUBMODULES = {"methods", "sandbox"}
"""``from unimas import methods`` and ``unimas.sandbox.runner`` reach the two namespaces above."""

ALGORITHM_HOOKS = {"unimas_rollout_controls": "RolloutControl", "unimas_replay_buffers": "ReplayBuffer",
                   "unimas_update_orders": "UpdateOrder", "unimas_credit_shapers": "CreditShaper"}


def instead(name: str) -> str:
    """What to write in place of an internal import of ``name``."""
    if name in PUBLIC["unimas"]:
        return f"`from unimas import {name}` (or `unimas.{name}`)"
    if name in PUBLIC["unimas.methods"]:
        return f"`from unimas.methods import {name}`"
    return (f"nothing: {name} is not public. Use what `unimas.__all__` or `unimas.methods.__all__` list "
            "(docs/plugins.md, 'What is stable'); if a plugin truly needs it, add it to unimas/__init__.py "
            "or unimas/methods.py (with its docs) instead of importing the internal module")


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    """``unimas.training.replay.x`` -> ['unimas', 'training', 'replay', 'x']; None if it does not start at a name."""
    parts = [node.attr]
    while isinstance(node.value, ast.Attribute):
        node = node.value
        parts.append(node.attr)
    return [node.value.id, *reversed(parts)] if isinstance(node.value, ast.Name) else None


def violations(path: Path) -> list[str]:
    """Each use of an internal unimas module in ``path`` (function-local and ``TYPE_CHECKING`` imports included)."""
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    found = []
    inner: set[int] = set()  # ``unimas.a`` inside ``unimas.a.b``: judged as part of the outer chain
    for node in ast.walk(ast.parse(path.read_text(), str(path))):  # outer nodes come before inner ones
        at = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = alias.name
                if module.startswith("unimas.") and module not in PUBLIC and module not in SANDBOX:
                    found.append(f"{at}: `import {module}` is internal; import from `unimas` or `unimas.methods` "
                                 "instead")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "unimas" or node.module.startswith("unimas.")):
            if node.module in SANDBOX:
                continue
            for alias in node.names:
                if node.module in PUBLIC and (alias.name in PUBLIC[node.module]
                                              or node.module == "unimas" and alias.name in SUBMODULES):
                    continue
                found.append(f"{at}: `from {node.module} import {alias.name}` is internal; write "
                             f"{instead(alias.name)}")
        elif isinstance(node, ast.Attribute):
            outer = id(node) not in inner
            inner.add(id(node.value))
            chain = _attribute_chain(node) if outer else None
            if chain and chain[0] == "unimas" and chain[1] not in PUBLIC["unimas"] | SUBMODULES:
                found.append(f"{at}: `{'.'.join(chain)}` reaches past the public surface; write "
                             f"{instead(chain[-1])}")
    return found


def checked_files() -> list[Path]:
    return sorted(p for root in CHECKED for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_plugins_and_workflows_import_only_the_public_surface():
    """New modules under plugins/ or workflows/ included: the message says what to import instead."""
    assert checked_files(), "no plugin or workflow modules found"
    found = [line for path in checked_files() for line in violations(path)]
    assert found == [], ("plugins/ and workflows/ may import from unimas only `unimas`, `unimas.methods` and "
                         "`unimas.sandbox` (tests/test_public_surface.py):\n" + "\n".join(found))


@pytest.mark.parametrize("source, expected", [
    ("from unimas.training.session import by_task\n", "`from unimas.methods import by_task`"),
    ("def f():\n    from unimas.trajectory import GraphTrajectory\n", "`from unimas import GraphTrajectory`"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from unimas.algorithms.credit import CreditedTurn\n",
     "`from unimas.methods import CreditedTurn`"),
    ("import unimas.controller.router\n", "`import unimas.controller.router` is internal"),
    ("import unimas\nx = unimas.training.replay.replayed_copy\n", "`from unimas.methods import replayed_copy`"),
    ("from unimas.controller.router import Router\n", "Router is not public"),
])
def test_the_check_sees_each_way_of_reaching_inside(tmp_path, source, expected):
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    found = violations(planted)
    assert len(found) == 1 and expected in found[0], found


def test_the_check_lets_the_public_surface_through(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import unimas\nfrom unimas import GraphTrajectory, UserError, methods\n"
                       "from unimas.methods import RolloutSession, by_task\nfrom unimas.sandbox import runner\n"
                       "from unimas.sandbox.runner import run_python\nx = unimas.UserError\n"
                       "y = unimas.methods.by_task\n")
    assert violations(planted) == []


@pytest.mark.parametrize("module", [unimas, unimas.methods], ids=["unimas", "unimas.methods"])
def test_every_public_name_resolves(module):
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_the_algorithm_hooks_are_annotated_with_their_protocols():
    for hook, protocol in ALGORITHM_HOOKS.items():
        annotation = inspect.signature(getattr(hookspecs, hook)).return_annotation
        assert annotation == f"dict[str, Callable[..., {protocol}]]", (hook, annotation)
        assert protocol in unimas.methods.__all__


def test_capability_flags_are_declared_with_defaults_and_read_only_when_declared():
    assert protocols.capability(object(), protocols.RolloutControl, "uses_forks") is False
    assert protocols.capability(object(), protocols.UpdateOrder, "needs_ratios") is False
    assert protocols.capability(object(), protocols.Backend, "can_train") is True

    class Forking:
        uses_forks = True

    assert protocols.capability(Forking, protocols.RolloutControl, "uses_forks") is True
    with pytest.raises(AttributeError, match="declares no capability flag 'uses_forks'"):
        protocols.capability(Forking, protocols.UpdateOrder, "uses_forks")  # a typo or a wrong protocol: loud


def test_no_capability_flag_is_read_by_getattr():
    """The flags are read through ``capability`` only, so the list in contract/protocols.py is the whole list."""
    flags = ("uses_forks", "needs_ratios", "rescales_advantages", "can_train", "supports_critic", "can_score_turns",
             "can_host_adapters", "can_save_weights")
    pattern = re.compile(r"getattr\([^)]*[\"'](%s)[\"']" % "|".join(flags))
    found = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in sorted((REPO / "unimas").rglob("*.py"))
             if p.name != "protocols.py" for m in pattern.finditer(p.read_text())]
    assert found == []


def _hook_names(text: str) -> set[str]:
    return set(re.findall(r"unimas_[a-z_]+", text))


def test_docs_and_hookspecs_agree_on_what_is_stable():
    every = {name for name in dir(hookspecs) if name.startswith("unimas_")}
    assert set(hookspecs.STABLE_HOOKS) | set(hookspecs.EXPERIMENTAL_HOOKS) == every
    assert set(hookspecs.EXPERIMENTAL_HOOKS) == set(ALGORITHM_HOOKS)
    section = (REPO / "docs" / "plugins.md").read_text().split("## What is stable")[1].split("\n## ")[0]
    stable, experimental = section.split("**Experimental or internal**")
    assert _hook_names(stable) == set(hookspecs.STABLE_HOOKS)
    assert _hook_names(experimental) == set(hookspecs.EXPERIMENTAL_HOOKS)
    assert "unimas.methods" in experimental
