"""Built-in tools. Tools receive model text as arguments: none of them executes it."""

from __future__ import annotations

import math

import unimas
from unimas import ExpressionError, compile_expression


def calculator(expression: str) -> float | int:
    """Arithmetic on numbers only (+ - * / // % and parentheses), via the safe evaluator.

    The evaluator also knows strings, lists and comparisons (graph conditions need them), so the result is
    checked: a finite int or float, else an error the model reads as the tool's answer.
    """
    compiled = compile_expression(str(expression))
    if compiled.names:
        raise ValueError(f"calculator accepts numbers only, got names {sorted(compiled.names)}")
    try:
        value = compiled.evaluate({})
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except ExpressionError as exc:
        raise ValueError(str(exc)) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"calculator computes numbers only, not a {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the result is not a finite number ({value})")
    return value


@unimas.hookimpl
def unimas_tools():
    return {"calculator": calculator}
