"""Built-in tools. Tools receive model text as arguments: none of them executes it."""

from __future__ import annotations

import unimas
from unimas.workflow.safe_expr import ExpressionError, compile_expression


def calculator(expression: str) -> float | int | str:
    """Arithmetic on numbers only (+ - * / // % and parentheses), via the safe evaluator."""
    compiled = compile_expression(str(expression))
    if compiled.names:
        raise ValueError(f"calculator accepts numbers only, got names {sorted(compiled.names)}")
    try:
        return compiled.evaluate({})
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except ExpressionError as exc:
        raise ValueError(str(exc)) from None


@unimas.hookimpl
def unimas_tools():
    return {"calculator": calculator}
