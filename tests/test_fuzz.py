"""Property tests: whatever a config file or a workflow graph holds, the answer is success or a UserError.

Anything else (a KeyError, a RecursionError, a hang) would reach the user as a traceback. The
examples are derandomized so that CI sees the same inputs on every run.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.conftest import EXAMPLES
from unimas.config.loading import load_config
from unimas.config.schema import GraphConfig, RoleConfig
from unimas.contract.registry import build_registry
from unimas.errors import UserError
from unimas.preflight.validate import validate
from unimas.workflow.graph import check_graph, make_graph_workflow

FUZZ = settings(derandomize=True, deadline=2000, max_examples=150, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
QUICKSTART = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
REGISTRY = build_registry()
_unique = itertools.count()

# -- the config loader ------------------------------------------------------------------------------

YAML_PIECES = ["{", "}", "[", "]", ": ", "- ", ", ", "\n", "  ", "&a ", "*a", "<<: ", "!!binary ", "!!set ",
               "!!python/object ", "? ", "|", ">", "'", '"', "#", "name", "models", "roles", "trainer", "seed",
               "1e400", "-.inf", ".nan", "0x1F", "2020-13-45", "null", "~", "true", "\t", "\\u0000", "%YAML 1.1",
               "---", "...", "é", "\x85"]
yaml_ish = st.lists(st.sampled_from(YAML_PIECES), max_size=40).map("".join)
values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16)
PLACES = ["name", "plugins", "models", "models.shared", "models.shared.options", "models.shared.options.tiny",
          "models.shared.options.tiny.alphabet", "models.shared.optim", "models.shared.lora", "roles",
          "roles.speaker", "roles.speaker.template", "roles.speaker.generation", "roles.listener.parser",
          "workflow", "workflow.params", "workflow.graph", "data", "data.params", "data.params.targets",
          "rewards", "algorithm", "algorithm.group_size", "trainer", "trainer.seed", "trainer.stop_when",
          "runtime", "logging", "logging.wandb", "extra.key"]


def _set(tree: dict, dotted: str, value: Any) -> dict:
    *parents, last = dotted.split(".")
    node = tree
    for key in parents:
        child = node.get(key)
        node[key] = child = child if isinstance(child, dict) else {}
        node = child
    node[last] = value
    return tree


def _config_file(folder: Path, text: str) -> Path:
    path = folder / f"fuzz{next(_unique)}.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def _load_and_validate(path: Path) -> None:
    """Success or UserError: any other exception fails the property."""
    try:
        validate(load_config(path), REGISTRY)
    except UserError as exc:
        assert str(exc).strip()


@FUZZ
@given(text=st.one_of(yaml_ish, st.text(max_size=200)))
def test_any_text_loads_or_is_a_user_error(text: str, tmp_path):
    _load_and_validate(_config_file(tmp_path, text))


@pytest.mark.slow
@FUZZ
@given(place=st.sampled_from(PLACES), value=values)
def test_any_value_anywhere_validates_or_is_a_user_error(place: str, value: Any, tmp_path):
    tree = _set(yaml.safe_load(yaml.safe_dump(QUICKSTART)), place, value)
    _load_and_validate(_config_file(tmp_path, yaml.safe_dump(tree, allow_unicode=True)))


@FUZZ
@given(place=st.sampled_from(PLACES), value=values)
def test_any_override_validates_or_is_a_user_error(place: str, value: Any):
    override = f"{place}={yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()}"
    try:
        validate(load_config(EXAMPLES / "quickstart.yaml", [override]), REGISTRY)
    except UserError:
        pass


# -- the graph compiler -----------------------------------------------------------------------------

NODE_NAMES = ["speak", "listen", "calc", "task", "visits", "x y", "__init__", "", "9lives"]
ROLES = {"speaker": RoleConfig(model="shared", template="S:{target}"),
         "listener": RoleConfig(model="shared", template="L:{message}")}
names = st.sampled_from(NODE_NAMES + ["task", "visits", "failed", "nobody"])
atoms = names | st.integers(-5, 5).map(str) | st.sampled_from(["'a'", "''", "None", "True", "1.5", "[1, 2]"])
expressions = st.recursive(atoms, lambda e: st.one_of(
    st.tuples(e, st.sampled_from([" == ", " != ", " < ", " and ", " or ", " + ", " * ", " in ", " // ", " is "]),
              e).map("".join),
    st.tuples(st.sampled_from(["len", "lower", "contains", "max", "eval", "open", "x.y"]), e).map(
        lambda p: f"{p[0]}({p[1]})"),
    e.map(lambda x: f"not {x}"), e.map(lambda x: f"({x})"), e.map(lambda x: f"{x}[0]"),
    st.tuples(e, e, e).map(lambda p: f"{p[0]} if {p[1]} else {p[2]}")), max_leaves=12)
conditions = st.none() | expressions | st.text(max_size=30)
nodes = st.fixed_dictionaries({
    "kind": st.sampled_from(["llm", "tool", "other"]),
    "role": st.sampled_from([None, "speaker", "listener", "ghost"]),
    "tool": st.sampled_from([None, "calculator", "nope"]),
    "inputs": st.dictionaries(st.sampled_from(["message", "target", "after", "expr", "role"]), expressions,
                              max_size=2),
    "max_visits": st.integers(0, 3),
})
graphs = st.fixed_dictionaries({
    "start": names,
    "nodes": st.dictionaries(st.sampled_from(NODE_NAMES), nodes, max_size=4),
    "edges": st.lists(st.fixed_dictionaries({"from": names, "to": names, "when": conditions}), max_size=6),
    "outcome": st.dictionaries(st.sampled_from(["answer", "message"]), expressions, max_size=2),
    "max_steps": st.integers(0, 5),
})


@FUZZ
@given(data=graphs, task_keys=st.none() | st.sets(st.sampled_from(["target", "answer", "message"])))
def test_any_graph_compiles_or_is_a_user_error(data: dict, task_keys: set[str] | None):
    try:
        graph = GraphConfig.model_validate(data)
    except ValidationError:
        return  # turned into a UserError naming the field by config_from_dict
    problems = check_graph(graph, ROLES, set(REGISTRY.names("tools")), task_keys)
    assert all(isinstance(path, str) and message for path, message in problems)
    try:
        workflow = make_graph_workflow(graph)
    except UserError:
        assert problems, "make_graph_workflow refused a graph that check_graph passed"
        return
    assert asyncio.iscoroutinefunction(workflow)


@pytest.mark.slow
@FUZZ
@given(data=graphs)
def test_any_graph_in_a_config_validates_or_is_a_user_error(data: dict, tmp_path):
    tree = yaml.safe_load((EXAMPLES / "quickstart_graph.yaml").read_text())
    tree["workflow"] = {"graph": data}
    _load_and_validate(_config_file(tmp_path, yaml.safe_dump(tree)))
