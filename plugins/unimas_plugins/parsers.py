"""Built-in output parsers: what a role's answer is, read out of its raw text.

Each entry is a factory: ``factory(**params)`` checks the parameters (so a
bad regex or schema is a config error, found by ``unimas validate``) and
returns ``parse(text) -> value``. A parser raises :class:`unimas.ParseError`
with the reason when the text has no answer; the turn records the reason as
its ``parse_error`` (format rewards see it) and the episode goes on.
Model text is data: parsers only search it, never evaluate it (``json``
uses ``json.loads``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import unimas
from unimas import ParseError

NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:/\d+)?")


def regex(pattern: str) -> Callable[[str], str]:
    """The first match of ``pattern``; its first group when it has groups."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None

    def parse(text: str) -> str:
        match = compiled.search(text)
        if match is None:
            raise ParseError(f"output does not match parser {pattern!r}")
        return match.group(1) if match.groups() else match.group(0)

    return parse


def tagged(tag: str = "answer") -> Callable[[str], str]:
    """The content of the last complete ``<tag>...</tag>``, stripped; with nesting, the innermost of the last."""
    if not re.fullmatch(r"[A-Za-z][\w-]*", tag):
        raise ValueError(f"tag {tag!r} must be a plain name like 'answer'")
    pattern = re.compile(rf"<{tag}>((?:(?!<{tag}>).)*?)</{tag}>", re.DOTALL)

    def parse(text: str) -> str:
        matches = pattern.findall(text)
        if not matches:
            raise ParseError(f"no complete <{tag}>...</{tag}> in the output")
        return matches[-1].strip()

    return parse


def boxed() -> Callable[[str], str]:
    """The content of the last ``\\boxed{...}`` with balanced braces (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``)."""

    def parse(text: str) -> str:
        start = text.rfind("\\boxed{")
        while start != -1:
            depth, begin = 0, start + len("\\boxed{")
            for index in range(begin, len(text)):
                depth += {"{": 1, "}": -1}.get(text[index], 0)
                if depth < 0:
                    return text[begin:index].strip()
            start = text.rfind("\\boxed{", 0, start)  # unbalanced: try an earlier one
        raise ParseError("no complete \\boxed{...} in the output")

    return parse


def json_object(required: list[str] | None = None) -> Callable[[str], dict[str, Any]]:
    """The first JSON object in the output that parses and has every ``required`` key."""
    keys = list(required or [])
    decoder = json.JSONDecoder()

    def parse(text: str) -> dict[str, Any]:
        problem = "no JSON object in the output"
        for start in (i for i, char in enumerate(text) if char == "{"):
            try:
                value, _ = decoder.raw_decode(text, start)
            except json.JSONDecodeError as exc:
                problem = f"JSON object is not valid: {exc.msg}"
                continue
            missing = [key for key in keys if key not in value]
            if not missing:
                return value
            problem = f"JSON object lacks required keys {missing}"
        raise ParseError(problem)

    return parse


def code_block(language: str | None = None) -> Callable[[str], str]:
    """The body of the first fenced code block (```lang ... ```), of ``language`` when given."""
    fence = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)

    def parse(text: str) -> str:
        for match in fence.finditer(text):
            if language is None or match.group(1).lower() == language.lower():
                return match.group(2)
        if "```" in text:
            raise ParseError("code fence is not terminated" if text.count("```") % 2 else
                             f"no ```{language} block in the output")
        raise ParseError("no fenced code block in the output")

    return parse


def first_line() -> Callable[[str], str]:
    """The first non-empty line, stripped."""

    def parse(text: str) -> str:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
        raise ParseError("the output is empty")

    return parse


def last_number() -> Callable[[str], str]:
    """The last number (integer, decimal or fraction like ``-3/4``), as written."""

    def parse(text: str) -> str:
        numbers = NUMBER.findall(text.replace(",", ""))
        if not numbers:
            raise ParseError("no number in the output")
        return numbers[-1]

    return parse


@unimas.hookimpl
def unimas_parsers():
    return {"regex": regex, "tagged": tagged, "boxed": boxed, "json": json_object, "code": code_block,
            "first_line": first_line, "last_number": last_number}
