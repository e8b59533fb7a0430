"""Generate ``docs/config.md`` from the pydantic config models.

Run ``python -m unimas.preflight.config_reference > docs/config.md``; ``tests/test_config_docs.py``
fails when the committed file differs from :func:`render`. The walk starts at
:class:`~unimas.config.schema.ExperimentConfig` and follows every field whose type holds
a model (directly, optional, or as the values of a mapping / items of a list),
writing one section per model in tree order. Backend settings under
``models.<group>.options`` are validated by each backend's own options model, so
the built-in backends' models are documented in a section of their own.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from typing import Annotated, Any, Iterator, Literal, Union

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from unimas.config.schema import ExperimentConfig

REGENERATE = "python -m unimas.preflight.config_reference > docs/config.md"

PLACEHOLDERS = {"models": "group", "roles": "role", "nodes": "node"}
"""Mapping fields whose keys are user-chosen names: ``models.<group>``, ..."""


def builtin_backend_options() -> list[tuple[str, type[BaseModel]]]:
    """``(backend name, options model)`` of the backends unimas ships."""
    from unimas.groups.openai import OpenAIOptions  # the backends' modules import torch: only for the docs
    from unimas.groups.torch.options import TorchOptions
    from unimas.groups.verl.options import VerlOptions

    return [("torch", TorchOptions), ("openai", OpenAIOptions), ("verl", VerlOptions)]


# -- types -------------------------------------------------------------------

def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _without_none(tp: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``Optional[X]``; ``(tp, False)`` otherwise."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True
    return tp, False


def type_name(tp: Any) -> str:
    """A readable name: ``X | null``, ``"a" | "b"``, ``dict[str, X]``, ``list[X]``."""
    inner, optional = _without_none(tp)
    if optional:
        return f"{type_name(inner)} | null"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:  # a constrained type inside a container or union, e.g. Optional[PositiveFloat]
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    if origin is list:
        return f"list[{type_name(args[0])}]"
    if origin is tuple:
        return "[" + ", ".join(type_name(a) for a in args) + "]"
    if tp is Any:
        return "any"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def constraints(field: FieldInfo) -> list[str]:
    symbols = ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<"))
    out = []
    for meta in field.metadata:
        for kind, attr, symbol in symbols:
            if isinstance(meta, kind):
                out.append(f"{symbol} {getattr(meta, attr)}")
        if isinstance(meta, MinLen):
            out.append(f"min length {meta.min_length}")
        if isinstance(meta, MaxLen):
            out.append(f"max length {meta.max_length}")
    return out


def children(key: str, tp: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """The models a field of type ``tp`` at ``key`` holds, with the dotted path of each."""
    tp, _ = _without_none(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_model(tp):
        yield key, tp
    elif origin is dict and _is_model(args[1]):
        name = key.rsplit(".", 1)[-1]
        yield f"{key}.<{PLACEHOLDERS.get(name, name.rstrip('s') or 'key')}>", args[1]
    elif origin is list and _is_model(args[0]):
        yield f"{key}[]", args[0]


# -- values ------------------------------------------------------------------

def literal(value: Any) -> str:
    """A YAML-ish literal: ``null``, ``true``, ``"text"``, ``[a, b]``, ``{k: v}``."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section defaults)"
    return f"`{literal(value)}`"


# -- markdown ----------------------------------------------------------------

def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _doc(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__")
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()).replace("``", "`") if doc else ""


def walk(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """``(path, model)`` for ``model`` and every model below it, depth first in field order."""
    yield path, model
    for name, field in model.model_fields.items():
        key = f"{path}.{field.alias or name}" if path else (field.alias or name)
        for child_path, child in children(key, field.annotation):
            yield from walk(child, child_path)


def table(model: type[BaseModel], path: str) -> list[str]:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        key = f"{path}.{field.alias or name}" if path else (field.alias or name)
        kind = f"`{type_name(field.annotation)}`"
        limits = constraints(field)
        if limits:
            kind += " (" + ", ".join(limits) + ")"
        lines.append(f"| `{_cell(key)}` | {_cell(kind)} | {_cell(default_text(field))} | "
                     f"{_cell(field.description or '')} |")
    return lines


def section(model: type[BaseModel], path: str, level: str = "##") -> list[str]:
    title = f"`{path}`" if path else "Top level"
    lines = [f"{level} {title} ({model.__name__})", ""]
    if _doc(model):
        lines += [_doc(model), ""]
    return lines + table(model, path) + [""]


def render() -> str:
    """The whole of ``docs/config.md``."""
    lines = [
        "# Config reference",
        "",
        "<!-- Generated from the pydantic models in unimas/config/schema.py and the built-in backends' options models;",
        f"     do not edit. Regenerate with: {REGENERATE} -->",
        "",
        "This file is generated from the code (`unimas/config/schema.py`); regenerate it with "
        f"`{REGENERATE}`. A test fails when it is stale.",
        "",
        "Keys are YAML paths: `<group>`, `<role>` and `<node>` stand for names you choose, `[]` for each item "
        "of a list. Unknown keys are errors everywhere. `required` marks keys without a default; "
        "`(section defaults)` means the section may be omitted and then takes the defaults listed in its own "
        "table. Any key can be overridden on the command line with `--set key=value`; a list item by its index, as errors name it (`--set rewards.0.weight=2`).",
        "",
    ]
    for path, model in walk(ExperimentConfig, ""):
        lines += section(model, path)
    lines += [
        "## Backend options",
        "",
        "`models.<group>.options` is validated by the group's backend (`models.<group>.backend`), not by "
        "`unimas.config.schema`, so a plugin backend brings its own settings (see its documentation and "
        "`unimas plugins`). The built-in backends:",
        "",
    ]
    for backend, options in builtin_backend_options():
        for path, model in walk(options, "models.<group>.options"):
            heading = f"### backend: {backend}" if path == "models.<group>.options" else None
            if heading:
                lines += [heading, ""]
            lines += section(model, path, level="####")
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(render(), end="")
