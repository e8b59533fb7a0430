"""The parameters of algorithm plugins, as ``unimas plugins --verbose`` prints them and docs/algorithms.md lists them.

The part of ``docs/algorithms.md`` between :data:`BEGIN` and :data:`END` is
generated from the built-in plugins' declared parameters
(:mod:`unimas.config.plugin_params`); run ``python -m unimas.preflight.algorithm_reference`` to
rewrite it. ``tests/test_config_docs.py`` fails when it is stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unimas.config.plugin_params import ParamsSpec, params_spec
from unimas.contract.registry import Registry, build_registry, singular
from unimas.preflight.config_reference import constraints, default_text, type_name

REGENERATE = "python -m unimas.preflight.algorithm_reference"
DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
BEGIN = "<!-- BEGIN GENERATED: algorithm parameters -->"
END = "<!-- END GENERATED: algorithm parameters -->"
BUILTIN_PROVIDER = "unimas"
"""The distribution whose entry points are the built-in plugins."""

PARAMS_KEYS = {"rollout_controls": "algorithm.rollout.params", "replay_buffers": "algorithm.replay.params",
               "update_orders": "algorithm.update_order.params", "credit_shapers": "algorithm.credit.params",
               "estimators": "algorithm.estimator_params", "policy_losses": "algorithm.loss_params"}
"""Kind -> the config key its parameters are set under."""

KEYWORD_ONLY = frozenset({"estimators", "policy_losses"})
"""Kinds called with verl's inputs: only their keyword-only arguments are parameters."""

UNCHECKED = "any (unchecked)"


@dataclass(frozen=True)
class ParamRow:
    name: str
    type: str
    default: str
    description: str


def spec_of(kind: str, name: str, obj: Any) -> ParamsSpec:
    return params_spec(obj, name, keyword_only=kind in KEYWORD_ONLY)


def rows(spec: ParamsSpec) -> list[ParamRow]:
    out = []
    for name, field in spec.model.model_fields.items():
        kind = UNCHECKED if name in spec.untyped else type_name(field.annotation)
        limits = constraints(field)
        if limits:
            kind += " (" + ", ".join(limits) + ")"
        out.append(ParamRow(name, kind, default_text(field), " ".join((field.description or "").split())))
    if spec.open:
        out.append(ParamRow("**kwargs", UNCHECKED, "", "any other name is passed to the factory unchecked"))
    return out


def parameter_lines(kind: str, name: str, obj: Any) -> list[str]:
    """Lines for ``unimas plugins --verbose``: one per parameter, or that there are none."""
    spec = spec_of(kind, name, obj)
    lines = [f"{row.name}: {row.type}{_default(row.default)}" + (f"  -- {row.description}" if row.description else "")
             for row in rows(spec)]
    if spec.untyped or spec.open:
        lines.append("untyped parameters are passed through unchecked")
    return lines or ["no parameters"]


def _default(text: str) -> str:
    return "" if not text else " (required)" if text == "required" else f" = {text.strip('`')}"


def builtin_entries(registry: Registry) -> list[tuple[str, str, Any]]:
    """``(kind, name, object)`` of every built-in algorithm plugin, kinds in :data:`PARAMS_KEYS` order."""
    return [(kind, name, registry.get(kind, name)) for kind in PARAMS_KEYS for name in registry.names(kind)
            if registry.provider(kind, name) == BUILTIN_PROVIDER]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_section(registry: Registry | None = None) -> str:
    """The generated part of docs/algorithms.md, markers included."""
    registry = registry or build_registry()
    lines = [BEGIN, f"<!-- Generated from the built-in plugins' parameters; do not edit. Regenerate with: "
             f"{REGENERATE} -->", ""]
    for kind, name, obj in builtin_entries(registry):
        key = PARAMS_KEYS[kind]
        lines += [f"### `{name}` ({singular(kind)}, `{key}`)", ""]
        table = rows(spec_of(kind, name, obj))
        if not table:
            lines += ["No parameters.", ""]
            continue
        lines += ["| parameter | type | default | description |", "| --- | --- | --- | --- |"]
        lines += [f"| `{row.name}` | `{_cell(row.type)}` | {_cell(row.default)} | {_cell(row.description)} |"
                  for row in table]
        lines.append("")
    return "\n".join(lines) + END


def updated(text: str, section: str) -> str:
    """``text`` with the part between the markers replaced by ``section``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"docs/algorithms.md lacks the markers {BEGIN!r} ... {END!r}")
    return text[:start] + section + text[end + len(END):]


if __name__ == "__main__":
    DOC.write_text(updated(DOC.read_text(), render_section()))
