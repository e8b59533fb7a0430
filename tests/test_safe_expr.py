"""The safe expression language: what it evaluates, and what it refuses."""

import builtins
import re

import pytest

from unimas.workflow.safe_expr import MAX_LENGTH, ExpressionError, compile_expression


def ev(text, **env):
    return compile_expression(text).evaluate(env)


@pytest.mark.parametrize("text, expected", [
    ("1 + 2 * 3", 7),
    ("7 // 2 + 7 % 2 - 1 / 2", 3.5),
    ("-x + +1", -4),
    ("'ab' + 'c'", "abc"),
    ("task['a'] == 1 and not task['b']", True),
    ("x in [6, 7] or y", "fallback"),
    ("0 < x <= 5 < 6", True),
    ("0 < x < 5", False),
    ("'k' not in task", True),
    ("z is None", True),
    ("z is not None", False),
    ("'yes' if x > 3 else 'no'", "yes"),
    ("{'a': 1, 'b': [x, (1, 2)]}['b'][1][0]", 1),
    ("s[1:3]", "el"),
    ("len(s) + abs(-2) + min(1, 2) + max([3, 4])", 12),
    ("int('42') + float('0.5')", 42.5),
    ("str(x) + lower('AB') + upper('c') + strip('  d ')", "5abCd"),
    ("contains(s, 'ell') and startswith(s, 'he') and endswith(s, 'lo')", True),
    ("'-' * 3", "---"),
    ("[0] * 3", [0, 0, 0]),
])
def test_evaluates(text, expected):
    env = {"task": {"a": 1, "b": False}, "x": 5, "y": "fallback", "z": None, "s": "hello"}
    assert compile_expression(text).evaluate(env) == expected


def test_names_are_free_variables_only():
    expr = compile_expression("len(answer) > 0 and task['k'] == visits['solve']")
    assert expr.names == {"answer", "task", "visits"}


def test_short_circuit_skips_failing_branch():
    assert ev("x is None or int(x) > 3", x=None) is True
    assert ev("1 if ok else int('boom')", ok=True) == 1


MALICIOUS = [
    "__import__('os').system('x')",
    "().__class__.__bases__",
    "().__class__.__bases__[0].__subclasses__()",
    "open('f')",
    "(lambda: 1)()",
    "[x for x in y]",
    "'a' * 10**9",
    "'a' * 1000000000",
    "[[0] * 10000] * 10000",
    "[''] * 100000",
    "'%*d' % (1000000000, 1)",
    "eval('1')",
    "exec('1')",
    "getattr(x, 'y')",
    "__builtins__",
    "x.y",
    "f'{x}'",
    "f'{open(1)}'",
    "len(*x)",
    "max(x, key=len)",
    "(y := 1)",
    "{**x}",
    "{1, 2}",
    "x ** 2",
    "x is 3",
    "b'bytes'",
    "1j",
    "...",
    "len",
    "a; b",
    "import os",
    "x" * (MAX_LENGTH + 1),
    "-" * 200 + "1",
    "",
]


@pytest.mark.parametrize("text", MALICIOUS)
def test_rejects_malicious(text, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(builtins, "eval", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(builtins, "exec", lambda *a, **k: calls.append(a))
    env = {"x": [1], "y": [2], "a": 1, "b": 2}
    with pytest.raises(ExpressionError):
        compile_expression(text).evaluate(env)
    assert calls == []
    assert list(tmp_path.iterdir()) == []


def test_error_messages_name_the_construct():
    cases = {
        "().__class__": "attribute access",
        "(lambda: 1)()": "function by name",
        "[a for a in b]": "comprehension",
        "open('f')": "calling 'open'",
        "'a' * 10**9": "operator **",
        "'a' * 20000": "more than 10000",
        "len(1, 2)": "takes 1 argument",
    }
    for text, fragment in cases.items():
        with pytest.raises(ExpressionError, match=re.escape(fragment)):
            compile_expression(text).evaluate({"b": []})


@pytest.mark.parametrize("text, env", [
    ("int(x)", {"x": "not a number"}),
    ("float(x)", {"x": "nope"}),
    ("int(x)", {"x": None}),
    ("task['missing']", {"task": {}}),
    ("x[3]", {"x": [1]}),
    ("1 / x", {"x": 0}),
    ("x < 1", {"x": "a"}),
    ("lower(x)", {"x": 3}),
    ("unknown == 1", {}),
    ("min(x)", {"x": []}),
])
def test_runtime_failures_are_expression_errors(text, env):
    with pytest.raises(ExpressionError):
        compile_expression(text).evaluate(env)
