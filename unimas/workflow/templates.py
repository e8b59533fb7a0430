"""Prompt templates: ``str.format`` syntax restricted to plain names.

Templates come from config, values may be model output. Only ``{name}``
fields are allowed (no attribute or index access, no conversions), so a
template can be checked statically and a value is never interpreted.
"""

from __future__ import annotations

import functools
import string
from typing import Any, Mapping

_FORMATTER = string.Formatter()


def template_fields(template: str) -> list[str]:
    """Names a template needs; raises ValueError for anything but ``{name}``."""
    names = []
    for _, field, spec, conversion in _FORMATTER.parse(template):
        if field is None:
            continue
        if not field.isidentifier() or conversion or spec:
            raise ValueError(f"template field '{{{field}}}' must be a plain name like {{question}}")
        names.append(field)
    return names


@functools.lru_cache(maxsize=256)
def _pieces(template: str) -> tuple[tuple[str, str | None], ...]:
    """(literal, field) pairs of a template, parsed once: a run renders its few role templates every turn."""
    return tuple((literal, field) for literal, field, _, _ in _FORMATTER.parse(template))


def render(template: str, values: Mapping[str, Any]) -> str:
    parts = []
    for literal, field in _pieces(template):
        parts.append(literal)
        if field is not None:
            if field not in values:
                raise KeyError(field)
            parts.append(str(values[field]))
    return "".join(parts)
