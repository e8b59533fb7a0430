"""The README's examples are the real code and config, and its two commands stay as CI and users know them.

The README shows the quickstart's workflow, reward and config side by side; a copy that drifted from
``workflows/unimas_workflows/signalling.py``, ``plugins/unimas_plugins/rewards.py`` or
``examples/quickstart.yaml`` would teach a newcomer something that does not run.
"""

from __future__ import annotations

import ast
import inspect
import re

import yaml
from unimas_plugins import rewards
from unimas_workflows.signalling import signalling

from tests.conftest import REPO

README = (REPO / "README.md").read_text()
COMMANDS = [
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && "
    "unimas train examples/quickstart.yaml",
    "bash scripts/test.sh",
]


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.MULTILINE | re.DOTALL)


def _without_docstring(function: ast.AST) -> str:
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        function.body = body[1:]
    return ast.dump(function)


def test_the_two_commands_are_unchanged():
    (commands,) = [block for block in blocks("bash") if "scripts/test.sh" in block]
    assert [line for line in commands.splitlines() if line and not line.startswith("#")] == COMMANDS


def test_the_workflow_and_reward_shown_are_the_real_ones():
    (code,) = [block for block in blocks("python") if "async def signalling" in block]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # the block runs as written: a module of definitions
    shown = {node.name: node for node in ast.parse(code).body if isinstance(node, (ast.FunctionDef,
                                                                                   ast.AsyncFunctionDef))}
    real = {"signalling": signalling, "exact_match": rewards.exact_match,
            "_normalise": rewards._normalise}
    assert set(shown) == set(real)
    for name, function in real.items():
        (definition,) = ast.parse(inspect.getsource(function)).body
        assert _without_docstring(shown[name]) == _without_docstring(definition), name


def test_the_config_shown_is_the_quickstart():
    (config,) = [block for block in blocks("yaml") if "name: quickstart" in block]
    assert yaml.safe_load(config) == yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def test_the_readme_stays_short():
    """About 150 lines (issue 41.5): results, benchmarks and limits in detail live in docs/."""
    assert len(README.splitlines()) <= 180
