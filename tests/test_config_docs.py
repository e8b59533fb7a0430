"""docs/config.md is generated from the config models, is up to date, and every field is described; so is the
parameters section of docs/algorithms.md, from the built-in algorithm plugins."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel

from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import build_registry
from unimas.preflight import algorithm_reference as algorithm_docs
from unimas.preflight.config_reference import REGENERATE, builtin_backend_options, render

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
ALGORITHMS_DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
ROW = re.compile(r"^\| `([^`]+)` \| (.+) \| (.+) \| (.*) \|$")
NAMES = {"models": "<group>", "roles": "<role>", "nodes": "<node>"}


def _models_in(tp: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """Models inside an annotation, with the path suffix they sit at: '' (direct), '.<name>' (dict value), '[]'."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        yield "", tp
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict:
        for suffix, model in _models_in(args[1]):
            yield ".{key}" + suffix, model
    elif origin is list:
        for suffix, model in _models_in(args[0]):
            yield "[]" + suffix, model
    else:  # Optional / Union
        for arg in args:
            yield from _models_in(arg)


def fields(model: type[BaseModel], path: str = "") -> Iterator[tuple[str, type[BaseModel], str, Any]]:
    """(dotted key, owning model, field name, FieldInfo) for every field below ``model``, independently of the
    generator's own walk."""
    for name, info in model.model_fields.items():
        key = f"{path}.{info.alias or name}" if path else (info.alias or name)
        yield key, model, name, info
        for suffix, child in _models_in(info.annotation):
            yield from fields(child, key + suffix.replace("{key}", NAMES.get(name, "<key>")))


def all_fields() -> list[tuple[str, type[BaseModel], str, Any]]:
    found = list(fields(ExperimentConfig))
    for _backend, options in builtin_backend_options():
        found += list(fields(options, "models.<group>.options"))
    return found


def documented_rows(text: str) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match and match.group(1) != "key":
            rows.setdefault(match.group(1), []).append(line)
    return rows


def test_docs_config_md_is_up_to_date():
    assert DOC.exists(), f"docs/config.md is missing; run `{REGENERATE}`"
    assert DOC.read_text() == render(), f"docs/config.md is stale; run `{REGENERATE}`"


def test_render_is_deterministic():
    assert render() == render()


def test_every_field_has_a_description():
    missing = [f"{model.__name__}.{name} ({key})" for key, model, name, info in all_fields()
               if not (info.description or "").strip()]
    assert not missing, "config fields without description=: " + ", ".join(missing)


def test_every_model_has_a_docstring():
    models = {ExperimentConfig} | {model for _key, model, _name, _info in all_fields()}
    missing = sorted(m.__name__ for m in models if not (m.__dict__.get("__doc__") or "").strip())
    assert not missing, f"config models without a class docstring: {missing}"


def test_every_key_is_documented_once_with_its_description():
    rows = documented_rows(render())
    for key, _model, _name, info in all_fields():
        if key.startswith("roles.<role>.eval_generation") or key.startswith("models.<group>.options"):
            assert key in rows, f"{key} is not documented"
        else:
            assert len(rows.get(key, [])) == 1, f"{key} should be documented exactly once"
        described = " ".join(info.description.split()).replace("|", "\\|")
        # backends share option names (dtype, path): each backend's row carries its own description
        assert any(described in line for line in rows[key]), f"{key}: description not in {rows[key]}"


def test_known_paths_types_and_defaults():
    text = render()
    rows = {key: lines[0] for key, lines in documented_rows(text).items()}
    for key in ("trainer.steps", "trainer.stop_when.metric", "models.<group>.optim.lr",
                "roles.<role>.generation.max_new_tokens", "rewards[].weight", "workflow.graph.nodes.<node>.kind",
                "workflow.graph.edges[].from", "models.<group>.options.tiny.alphabet",
                "models.<group>.options.endpoint"):
        assert key in rows, f"{key} missing from docs/config.md"
    assert rows["trainer.steps"].startswith("| `trainer.steps` | `int` (>= 0) | `100` |")
    assert '`"local" \\| "ray"`' in rows["runtime.kind"]
    assert "`str \\| null`" in rows["runtime.address"]
    assert "| required |" in rows["roles.<role>.model"]  # template: optional since agent workflows (gateway)
    assert '`["q_proj", "k_proj", "v_proj", "o_proj"]`' in rows["models.<group>.lora.target_modules"]
    assert "`null`" in rows["trainer.stop_when.at_least"]
    assert "### backend: torch" in text and "### backend: openai" in text
    assert "#### `models.<group>.options` (TorchOptions)" in text
    assert "#### `models.<group>.options.tiny` (TinyModelConfig)" in text
    assert "#### `models.<group>.options` (OpenAIOptions)" in text
    assert any(REGENERATE in line and "generated" in line for line in text.splitlines()[:8])


def test_docs_algorithms_md_parameters_are_up_to_date():
    """The generated section of docs/algorithms.md lists every built-in method's parameters as the code declares."""
    text = ALGORITHMS_DOC.read_text()
    section = algorithm_docs.render_section()
    assert section in text, f"docs/algorithms.md is stale; run `{algorithm_docs.REGENERATE}`"
    assert algorithm_docs.updated(text, section) == text
    assert "## Typed parameters" in text  # the hand-written part stays
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert "| `roots` | `int (> 0)` | `4` | episodes per task run from scratch |" in rows
    assert "| `tau` | `float \\| null` | `null` |" in section
    registry = build_registry()
    for kind, name, obj in algorithm_docs.builtin_entries(registry):
        assert f"### `{name}` (" in section
        for field, info in algorithm_docs.spec_of(kind, name, obj).model.model_fields.items():
            assert (info.description or "").strip(), f"{name}.{field} has no description"
            assert f"| `{field}` |" in section
    assert {kind for kind, _name, _obj in algorithm_docs.builtin_entries(registry)} == set(algorithm_docs.PARAMS_KEYS)


def test_no_machine_specific_paths():
    text = render()
    assert "/home/" not in text and "/work/" not in text and "/tmp/" not in text
