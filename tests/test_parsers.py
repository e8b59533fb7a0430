"""Built-in output parsers on well-formed and malformed outputs: the documented answer or a recorded reason."""

import pytest
from unimas_plugins.parsers import boxed, code_block, first_line, json_object, last_number, regex, tagged

from unimas import ParseError

CASES = [
    # parser, text, expected answer (or the ParseError reason it must give)
    (regex(r"=(\d+)"), "3+4=7", "7"),
    (regex(r"\d+"), "no digits", ParseError("does not match")),
    (tagged(), "think... <answer> 42 </answer>", "42"),
    (tagged(), "<answer>1</answer> then <answer>2</answer>", "2"),  # the last complete one
    (tagged(), "<answer>outer <answer>inner</answer> tail</answer>", "inner"),  # nested: the innermost
    (tagged(), "<answer>never closed", ParseError("no complete <answer>")),
    (tagged("final"), "<final>x</final>", "x"),
    (boxed(), r"so \boxed{3} or rather \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # the last of two
    (boxed(), r"\boxed{a{b}c}", "a{b}c"),
    (boxed(), r"\boxed{5} and \boxed{unbalanced", "5"),  # an unterminated last box falls back to the earlier one
    (boxed(), "no box", ParseError("no complete \\boxed")),
    (json_object(["answer"]), 'text {"answer": 4, "why": "sum"} more', {"answer": 4, "why": "sum"}),
    (json_object(["answer"]), '{"why": 1} {"answer": 2}', {"answer": 2}),  # the first object with the keys
    (json_object(["answer"]), '{"answer": 4, "why": "tru', ParseError("not valid")),  # truncated
    (json_object(["answer"]), '{"why": 1}', ParseError("lacks required keys ['answer']")),
    (json_object(), "plain text", ParseError("no JSON object")),
    (code_block(), "look:\n```python\nprint(1)\n```\n", "print(1)\n"),
    (code_block("python"), "```bash\nls\n```\n```python\nx = 1\n```", "x = 1\n"),
    (code_block(), "```python\nprint(1)\n", ParseError("not terminated")),  # unterminated fence
    (code_block(), "no code", ParseError("no fenced code block")),
    (first_line(), "\n\n  first \nsecond", "first"),
    (first_line(), "  \n ", ParseError("empty")),
    (last_number(), "it is 1,234 or -3/4", "-3/4"),
    (last_number(), "x = 2.50.", "2.50"),
    (last_number(), "none", ParseError("no number")),
]


@pytest.mark.parametrize(("parse", "text", "expected"), CASES)
def test_builtin_parsers(parse, text, expected):
    if isinstance(expected, ParseError):
        with pytest.raises(ParseError, match=str(expected).replace("\\", "\\\\").replace("[", r"\[")):
            parse(text)
    else:
        assert parse(text) == expected


@pytest.mark.parametrize(("factory", "params"), [(regex, {"pattern": "(unclosed"}), (tagged, {"tag": "a b"})])
def test_bad_parser_parameters_are_config_errors(factory, params):
    with pytest.raises(ValueError):
        factory(**params)


def test_parsers_never_evaluate_model_text():
    hostile = '{"answer": "__import__(\'os\').system(\'touch pwned\')"}'
    assert json_object(["answer"])(hostile)["answer"].startswith("__import__")
