"""Loading an experiment config: YAML file, ``--set`` overrides, readable validation errors.

``--set a.b=c`` overrides are applied to the raw YAML tree before
validation, so they get the same checks as the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from unimas.config import ExperimentConfig
from unimas.errors import UserError

PATH_OPTIONS = ("path", "init_from")
"""Backend options that name files: relative values are relative to the config file."""


def _parse_scalar(text: str) -> Any:
    """Interpret a ``--set`` value the way YAML would (numbers, bools, null, lists)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(tree: dict, assignment: str) -> None:
    if "=" not in assignment:
        raise UserError(f"override '{assignment}' must look like key.path=value", where="--set")
    path, value = assignment.split("=", 1)
    keys = path.strip().split(".")
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise UserError(f"'{key}' in '{path}' is not a mapping", where="--set")
        node = child
    node[keys[-1]] = _parse_scalar(value)


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check spelling; unknown keys are errors)"
        lines.append(f"  {loc}: {msg}")
    return f"invalid config {source}:\n" + "\n".join(lines)


def config_from_dict(tree: dict, source: str = "<dict>") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(tree)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, source)) from None


def load_config(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    path = Path(path)
    try:
        tree = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError("config file not found", where=str(path)) from None
    except yaml.YAMLError as exc:
        raise UserError(f"not valid YAML: {exc}", where=str(path)) from None
    if not isinstance(tree, dict):
        raise UserError("the config must be a YAML mapping", where=str(path))
    for assignment in overrides:
        apply_override(tree, assignment)
    config = config_from_dict(tree, str(path))
    return _resolve_relative_paths(config, path.parent)


def _resolve_relative_paths(config: ExperimentConfig, base: Path) -> ExperimentConfig:
    """Model paths in a config are relative to the config file, not the cwd."""
    for group in config.models.values():
        for key in PATH_OPTIONS:
            value = group.options.get(key)
            if isinstance(value, str) and not Path(value).is_absolute() and (base / value).exists():
                group.options[key] = str((base / value).resolve())
    return config


def dump_config(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)
