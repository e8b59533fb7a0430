"""Safe expressions for declarative workflow graphs.

Edge conditions (``when:``), node inputs and outcome values are short
Python-like expressions that live in config files and are evaluated against
model output, so they must never reach ``eval``/``exec``. They are parsed with
``ast.parse(..., mode="eval")``, checked once against a whitelist of node
types, and then interpreted by walking the tree:

* constants (str, int, float, bool, None), names looked up in the caller's
  environment, list / tuple / dict literals, subscripts and slices;
* comparisons (chained, ``in``, ``not in``; ``is`` / ``is not`` only against
  None, True or False), ``and`` / ``or`` / ``not``, ``+ - * / // %``, unary
  ``-``/``+`` and ``a if c else b``;
* calls by bare name to a fixed table of pure helpers (:data:`FUNCTIONS`).

Nothing else parses: no attribute access (so no ``().__class__`` escape), no
lambdas, comprehensions, f-strings, starred arguments, keywords, walrus or
``**``. Resource abuse is bounded: the source is at most
:data:`MAX_LENGTH` characters and :data:`MAX_DEPTH` levels deep, ``*`` may not
build a sequence of more than :data:`MAX_REPEAT` elements (nested elements
count), ``+ - *`` may not build an integer of more than :data:`MAX_INT_BITS`
bits (about 4200 digits: it must stay printable), and ``%`` works on numbers
only (no ``'%*d'`` string formatting).
Every failure, at compile or evaluation time, is an :class:`ExpressionError`.
"""

from __future__ import annotations

import ast
from typing import Any, Callable, Mapping

from unimas.errors import exception_text

MAX_LENGTH = 1000
MAX_DEPTH = 50
MAX_REPEAT = 10_000
MAX_INT_BITS = 14_000


class ExpressionError(ValueError):
    """An expression uses something not allowed, or failed to evaluate."""


def _quote(text: str) -> str:
    """The expression as shown in messages: quoted, long ones shortened."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _string(fn: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ExpressionError(f"{fn}() needs a string, got {type(value).__name__}")
    return value


# name -> (number of arguments, or None for "one or more"; implementation)
FUNCTIONS: dict[str, tuple[int | None, Callable[..., Any]]] = {
    "len": (1, len),
    "int": (1, int),
    "float": (1, float),
    "str": (1, str),
    "abs": (1, abs),
    "lower": (1, lambda s: _string("lower", s).lower()),
    "upper": (1, lambda s: _string("upper", s).upper()),
    "strip": (1, lambda s: _string("strip", s).strip()),
    "contains": (2, lambda a, b: b in a),
    "startswith": (2, lambda a, b: _string("startswith", a).startswith(_string("startswith", b))),
    "endswith": (2, lambda a, b: _string("endswith", a).endswith(_string("endswith", b))),
    "min": (None, min),
    "max": (None, max),
}

_BINOPS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/",
                            ast.FloorDiv: "//", ast.Mod: "%"}
_CMPOPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot)
_CONSTANTS = (str, int, float, bool, type(None))
_DESCRIPTIONS: dict[type, str] = {
    ast.Attribute: "attribute access (a.b)", ast.Lambda: "lambda", ast.ListComp: "comprehension",
    ast.SetComp: "comprehension", ast.DictComp: "comprehension", ast.GeneratorExp: "generator expression",
    ast.JoinedStr: "f-string", ast.FormattedValue: "f-string", ast.Starred: "starred argument (*x)",
    ast.NamedExpr: "assignment expression (:=)", ast.Await: "await", ast.Yield: "yield",
    ast.YieldFrom: "yield", ast.Set: "set literal", ast.Pow: "operator **", ast.BitAnd: "operator &",
    ast.BitOr: "operator |", ast.BitXor: "operator ^", ast.LShift: "operator <<", ast.RShift: "operator >>",
    ast.MatMult: "operator @", ast.Invert: "operator ~",
}


def _describe(node: ast.AST) -> str:
    return _DESCRIPTIONS.get(type(node), type(node).__name__)


class Expression:
    """A validated expression; :meth:`evaluate` may be called many times."""

    def __init__(self, text: str, tree: ast.Expression, names: frozenset[str]):
        self.text = text
        self._tree = tree
        self.names = names
        """Free variable names the expression reads (function names excluded)."""

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        try:
            return _Evaluator(env).visit(self._tree.body)
        except ExpressionError as exc:
            raise ExpressionError(f"{_quote(self.text)}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any runtime failure is the expression's
            raise ExpressionError(f"{_quote(self.text)}: {exception_text(exc)}") from None


def compile_expression(text: str) -> Expression:
    """Parse and validate ``text`` once; raises :class:`ExpressionError`."""
    if not isinstance(text, str):
        raise ExpressionError(f"an expression must be a string, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"expression is {len(text)} characters long; the limit is {MAX_LENGTH}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"{_quote(text)} is not a valid expression: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ExpressionError(f"{_quote(text)} is too deeply nested") from None
    except ValueError as exc:  # e.g. null bytes
        raise ExpressionError(f"{_quote(text)} is not a valid expression: {exc}") from None
    names: set[str] = set()
    try:
        _validate(tree.body, 0, names)
    except ExpressionError as exc:
        raise ExpressionError(f"{_quote(text)}: {exc}") from None
    return Expression(text, tree, frozenset(names))


def _validate(node: ast.AST, depth: int, names: set[str]) -> None:
    if depth > MAX_DEPTH:
        raise ExpressionError(f"nested more than {MAX_DEPTH} levels deep")
    deeper = depth + 1
    kind = type(node)
    children: list[ast.AST] = []
    if kind is ast.Constant:
        if type(node.value) not in _CONSTANTS:
            raise ExpressionError(f"constant {node.value!r} is not allowed (use str, int, float, bool or None)")
    elif kind is ast.Name:
        if node.id.startswith("__"):
            raise ExpressionError(f"name '{node.id}' is not allowed (names starting with '__' are reserved)")
        names.add(node.id)
    elif kind in (ast.List, ast.Tuple):
        children = node.elts
    elif kind is ast.Dict:
        if any(key is None for key in node.keys):
            raise ExpressionError("'**' unpacking is not allowed")
        children = [*node.keys, *node.values]
    elif kind is ast.Subscript:
        children = [node.value, node.slice]
    elif kind is ast.Slice:
        children = [part for part in (node.lower, node.upper, node.step) if part is not None]
    elif kind is ast.BoolOp:
        children = node.values
    elif kind is ast.UnaryOp:
        if not isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            raise ExpressionError(f"{_describe(node.op)} is not allowed")
        children = [node.operand]
    elif kind is ast.BinOp:
        if type(node.op) not in _BINOPS:
            raise ExpressionError(f"{_describe(node.op)} is not allowed (use + - * / // %)")
        children = [node.left, node.right]
    elif kind is ast.Compare:
        for op, right in zip(node.ops, node.comparators):
            if not isinstance(op, _CMPOPS):
                raise ExpressionError(f"comparison {type(op).__name__} is not allowed")
            if isinstance(op, (ast.Is, ast.IsNot)) and not (
                    isinstance(right, ast.Constant) and right.value in (None, True, False)
                    and type(right.value) in (bool, type(None))):
                raise ExpressionError("'is' / 'is not' may only compare with None, True or False")
        children = [node.left, *node.comparators]
    elif kind is ast.IfExp:
        children = [node.test, node.body, node.orelse]
    elif kind is ast.Call:
        _validate_call(node)
        children = node.args
    else:
        raise ExpressionError(f"{_describe(node)} is not allowed in expressions")
    for child in children:
        _validate(child, deeper, names)


def _validate_call(node: ast.Call) -> None:
    allowed = ", ".join(FUNCTIONS)
    if not isinstance(node.func, ast.Name):
        raise ExpressionError(f"method calls like a.b() are not allowed; call a function by name, e.g. lower(x); "
                              f"functions are: {allowed}")
    if node.func.id not in FUNCTIONS:
        raise ExpressionError(f"calling '{node.func.id}' is not allowed; functions are: {allowed}")
    name = node.func.id
    if node.keywords:
        raise ExpressionError(f"{name}() takes no keyword arguments")
    arity, _ = FUNCTIONS[name]
    if arity is None and not node.args:
        raise ExpressionError(f"{name}() needs at least one argument")
    if arity is not None and len(node.args) != arity:
        raise ExpressionError(f"{name}() takes {arity} argument{'s' if arity > 1 else ''}, got {len(node.args)}")


def _size(value: Any, budget: int) -> int:
    """Elements in ``value`` counting nested ones, stopping once past ``budget``."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if not isinstance(value, (list, tuple)):
        return 1
    total = 0
    for item in value:
        total += max(1, _size(item, budget - total))
        if total > budget:
            break
    return total


class _Evaluator:
    """Interprets a validated tree; only node types :func:`_validate` admits occur."""

    def __init__(self, env: Mapping[str, Any]):
        self.env = env

    def visit(self, node: ast.AST) -> Any:
        return getattr(self, "_" + type(node).__name__)(node)

    def _Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _Name(self, node: ast.Name) -> Any:
        if node.id not in self.env:
            raise ExpressionError(f"unknown name '{node.id}'; known names: {', '.join(sorted(self.env))}")
        return self.env[node.id]

    def _List(self, node: ast.List) -> list:
        return [self.visit(e) for e in node.elts]

    def _Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.visit(e) for e in node.elts)

    def _Dict(self, node: ast.Dict) -> dict:
        return {self.visit(k): self.visit(v) for k, v in zip(node.keys, node.values)}

    def _Subscript(self, node: ast.Subscript) -> Any:
        return self.visit(node.value)[self.visit(node.slice)]

    def _Slice(self, node: ast.Slice) -> slice:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else self.visit(p) for p in parts))

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        is_and = isinstance(node.op, ast.And)
        result = None
        for part in node.values:
            result = self.visit(part)
            if bool(result) != is_and:
                return result
        return result

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        return -value if isinstance(node.op, ast.USub) else +value

    def _BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        op = type(node.op)
        if op is ast.Add:
            return _bounded(left + right)
        if op is ast.Sub:
            return _bounded(left - right)
        if op is ast.Mult:
            _check_repeat(left, right)
            return _bounded(left * right)
        if op is ast.Div:
            return left / right
        if not all(isinstance(v, (int, float)) for v in (left, right)):
            raise ExpressionError(f"operator {_BINOPS[op]} needs numbers (string formatting is not allowed)")
        return left // right if op is ast.FloorDiv else left % right

    def _Compare(self, node: ast.Compare) -> bool:
        left = self.visit(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.visit(right_node)
            if not _compare(op, left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def _Call(self, node: ast.Call) -> Any:
        name = node.func.id
        args = [self.visit(a) for a in node.args]
        try:
            return FUNCTIONS[name][1](*args)
        except ExpressionError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise ExpressionError(f"{name}() failed: {exc}") from None


def _bounded(value: Any) -> Any:
    """``value``, unless it is an integer past :data:`MAX_INT_BITS` (``int(answer) + 1`` on a 4300-digit answer):
    such a number cannot be printed (Python's int-to-str digit limit), so a reward or the trajectory file
    reading it would raise far from the expression."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ExpressionError(f"the result has more than {MAX_INT_BITS} bits; integers are limited to about "
                              f"{int(MAX_INT_BITS * 0.30103)} digits")
    return value


def _check_repeat(left: Any, right: Any) -> None:
    sequences = (str, list, tuple)
    if isinstance(left, sequences) and isinstance(right, int):
        seq, count = left, right
    elif isinstance(right, sequences) and isinstance(left, int):
        seq, count = right, left
    else:
        return
    if count > 0 and _size(seq, MAX_REPEAT) * count > MAX_REPEAT:
        raise ExpressionError(f"'*' would build a sequence of more than {MAX_REPEAT} elements")


def _compare(op: ast.cmpop, left: Any, right: Any) -> bool:
    kind = type(op)
    if kind is ast.Eq:
        return left == right
    if kind is ast.NotEq:
        return left != right
    if kind is ast.Lt:
        return left < right
    if kind is ast.LtE:
        return left <= right
    if kind is ast.Gt:
        return left > right
    if kind is ast.GtE:
        return left >= right
    if kind is ast.In:
        return left in right
    if kind is ast.NotIn:
        return left not in right
    if kind is ast.Is:
        return left is right
    return left is not right
