"""Typed parameters of algorithm plugins, checked before anything runs.

A rollout control, replay buffer, update order or credit shaper is a factory
called as ``factory(**params)`` with ``algorithm.<key>.params``; an estimator or
policy loss is called by unimas with verl's inputs and, besides them, the
keyword-only arguments after ``*`` (``algorithm.estimator_params``,
``algorithm.loss_params``). Either way the parameters are a pydantic model, so
``unimas validate`` can reject a misspelt name, a string where a number is
needed, a negative size or a NaN, naming the field, before a model loads:

* a factory (or function) with a ``params`` attribute that is a pydantic model
  uses it as it is (cross-field checks go in its validators);
* otherwise the model is made from the signature: each annotated parameter is
  a field of its type and default, strictly checked (no "0.9" for a float, no
  2.0 for an int, no NaN or infinity, no unknown names); ``Annotated[...,
  Field(description=...)]`` documents it.

Untyped parameters are passed through unchecked, and so are unknown names
when a factory takes ``**kwargs``: third-party plugins written before types
keep working, and ``unimas plugins --verbose`` says which parameters are
unchecked.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from unimas.errors import UserError

EXPONENT_NUMBER = re.compile(r"[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+")
"""``1e-3``, ``1.0e5``: numbers to the user, strings to YAML 1.1 (PyYAML), which wants ``1.0e-3``, ``1.0e+5``."""

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
"""How a model made from a signature checks values: exact types, finite numbers, no unknown names."""


@dataclass(frozen=True)
class ParamsSpec:
    """What a plugin accepts as parameters."""

    model: type[BaseModel]
    untyped: tuple[str, ...] = ()
    """Parameters without an annotation: any value passes."""
    open: bool = False
    """The factory takes ``**kwargs``: names beyond the model's pass through unchecked."""

    def check(self, params: dict[str, Any], where: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """``(keyword arguments to call with, problems)``; each problem is ``(dotted field, message)``.

        Untyped and extra parameters are handed on exactly as the config holds them.
        """
        try:
            validated = self._validate(params)
        except ValidationError as exc:
            return {}, [(_dotted(where, err["loc"]), self._message(err)) for err in exc.errors()]
        kwargs = {name: params[name] if name in self.untyped and name in params else getattr(validated, name)
                  for name in type(validated).model_fields}
        kwargs.update({name: params[name] for name in validated.model_extra or {}})
        return kwargs, []

    def _validate(self, params: dict[str, Any]) -> BaseModel:
        """Config values are YAML data, so they are checked as JSON: strict about numbers and booleans, while a
        string still makes a ``Path``, an enum member or a literal, and a list a tuple."""
        try:
            text = json.dumps(params)
        except (TypeError, ValueError):  # values JSON cannot hold (a YAML date, an object from a Python caller)
            return self.model.model_validate(params)
        return self.model.model_validate_json(text)

    def _message(self, error: dict[str, Any]) -> str:
        if error["type"] == "extra_forbidden":
            known = ", ".join(self.model.model_fields) or "none"
            return f"unknown parameter (check spelling); known: {known}"
        if error["type"] == "missing" or not error["loc"]:
            return error["msg"]
        hint = ""
        if (error["type"] == "float_type" and isinstance(error["input"], str)
                and EXPONENT_NUMBER.fullmatch(error["input"]) and math.isfinite(float(error["input"]))):
            hint = (f" (YAML reads {error['input']} as text: it wants a dot and a signed exponent; write it as "
                    f"{float(error['input']):.1e} or {float(error['input'])!r})")
        return f"{error['msg']}, got {_shown(error['input'])}{hint}"


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _dotted(where: str, loc: tuple[Any, ...]) -> str:
    return ".".join([where, *(str(part) for part in loc)])


def explicit_model(obj: Any) -> type[BaseModel] | None:
    declared = getattr(obj, "params", None)
    return declared if isinstance(declared, type) and issubclass(declared, BaseModel) else None


def params_spec(obj: Callable[..., Any], name: str, *, keyword_only: bool = False, inputs: int = 0) -> ParamsSpec:
    """The parameters ``obj`` takes: its explicit ``params`` model, or one made from its signature.

    ``keyword_only`` (estimators, policy losses): only the arguments after
    ``*`` are parameters; the others are verl's inputs, and ``**kwargs`` does
    not open the model (verl's functions use it to ignore inputs).
    ``inputs``: the first this many positional arguments are what the caller
    passes (a reward's trajectory and task, a workflow's ctx and task), not parameters.
    """
    declared = explicit_model(obj)
    if declared is not None:
        return ParamsSpec(declared, open=declared.model_config.get("extra") == "allow")
    try:
        signature = inspect.signature(obj)
    except TypeError as exc:
        raise UserError(f"cannot read the parameter types of '{name}': {type(exc).__name__}: {exc}",
                        where=_location(obj)) from None
    except ValueError:  # builtins without a signature take no parameters unimas can check
        return ParamsSpec(create_model(f"{name}_params", __config__=STRICT))
    fields: dict[str, Any] = {}
    untyped: list[str] = []
    is_open = False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    passed = [p.name for p in signature.parameters.values() if p.kind in positional][:inputs]
    for parameter in signature.parameters.values():
        if parameter.name in passed:
            continue
        if parameter.kind is parameter.VAR_KEYWORD:
            is_open = not keyword_only
            continue
        if parameter.kind is parameter.VAR_POSITIONAL:
            continue
        if keyword_only and parameter.kind is not parameter.KEYWORD_ONLY:
            continue
        annotation = _evaluated(parameter.annotation, obj, name)
        if annotation is parameter.empty:
            untyped.append(parameter.name)
            annotation = Any
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    config = ConfigDict(STRICT, extra="allow") if is_open else STRICT
    try:
        model = create_model(f"{name}_params", __config__=config, **fields)
    except (TypeError, ValueError, NameError) as exc:  # pydantic cannot check such a type
        raise UserError(f"the parameter types of '{name}' cannot be checked: {exc}", where=_location(obj)) from None
    return ParamsSpec(model, tuple(untyped), is_open)


def _evaluated(annotation: Any, obj: Callable[..., Any], name: str) -> Any:
    """A string annotation (``from __future__ import annotations``) evaluated in the module that defines ``obj``.

    Only the parameters that count are evaluated (what ``inspect.signature(eval_str=True)`` does for all of
    them): verl's inputs and the return type may name types, such as ``torch.Tensor``, that a plugin imports
    only under ``TYPE_CHECKING`` so that listing it does not import torch.
    """
    if not isinstance(annotation, str):
        return annotation
    holder = types.SimpleNamespace(__annotations__={"value": annotation})
    try:
        return typing.get_type_hints(holder, globalns=_namespace(obj), include_extras=True)["value"]
    except (NameError, SyntaxError, TypeError, AttributeError) as exc:  # the plugin's bug
        raise UserError(f"cannot read the parameter types of '{name}': {type(exc).__name__}: {exc}",
                        where=_location(obj)) from None


def _namespace(obj: Any) -> dict[str, Any]:
    """The globals of the function (or of the class's module) whose signature ``obj`` has."""
    target = inspect.unwrap(obj.func if isinstance(obj, functools.partial) else obj)
    if hasattr(target, "__globals__"):
        return target.__globals__
    module = sys.modules.get(getattr(target, "__module__", None) or "")
    return vars(module) if module is not None else {}


def _location(obj: Any) -> str:
    try:
        return f"{inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]}"
    except (TypeError, OSError):
        return f"plugin object {obj!r}"


def bind(obj: Callable[..., Any], name: str, params: dict[str, Any], where: str,
         *, keyword_only: bool = False) -> dict[str, Any]:
    """Checked keyword arguments for ``obj``; raises one UserError listing every bad field."""
    kwargs, problems = params_spec(obj, name, keyword_only=keyword_only).check(params, where)
    if problems:
        lines = "\n".join(f"  {field}: {message}" for field, message in problems)
        raise UserError(f"invalid parameters of '{name}':\n{lines}")
    return kwargs
