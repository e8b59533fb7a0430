"""What every config section shares: strict checking of its values, and names that are safe as paths.

:class:`Strict` is the base of each model in :mod:`unimas.config.schema`: a
typo in a key, a NaN, an infinity or a YAML boolean where a number belongs is
an error naming the field, never a value read as something else.
"""

from __future__ import annotations

import re
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""Names that become path components (run, model group, adapter): no separators, no `..`, no leading dot."""


def safe_name(value: str, what: str) -> str:
    if not SAFE_NAME.fullmatch(value) or ".." in value:
        raise ValueError(f"{what} {value!r} must be 1-64 letters, digits, '_', '.' or '-' (no '/', no '..', not "
                         "starting with '.'): it names a directory in the run")
    return value


def takes_a_number_not_a_bool(annotation: Any) -> bool:
    """Whether a field of this type (``Optional`` unwrapped) holds an int or float but not a bool."""
    choices = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else (annotation,)
    return bool not in choices and any(choice in (int, float) for choice in choices)


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, NaN and infinity are rejected, and so is a
    boolean where a number belongs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads ``true`` as 1: ``save_every: true`` would checkpoint every step, ``lr: yes`` train at 1.0."""
        if isinstance(value, bool) and takes_a_number_not_a_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got the boolean {str(value).lower()} (YAML reads true, false, "
                             "yes, no, on and off as booleans)")
        return value
