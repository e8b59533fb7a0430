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
BRACE = re.compile(r"[{}]")
JSON_OPENING = re.compile(r'\{(?=\s*["}])')
FENCE_LANGUAGE = re.compile(r"[\w+-]*")
MAX_JSON_ATTEMPTS = 64
"""Most ``{`` positions the ``json`` parser decodes from before it gives up."""


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


def last_balanced(text: str, marker: str) -> str | None:
    """The stripped content of the last ``marker`` (ending in ``{``) whose brace is closed; None when none is.

    One pass pairs every brace with a stack, so a text full of unclosed markers costs linear time rather
    than one scan to the end per marker.
    """
    closing: dict[int, int] = {}
    opened: list[int] = []
    for found in BRACE.finditer(text):
        if found.group() == "{":
            opened.append(found.start())
        elif opened:
            closing[opened.pop()] = found.start()
    start = text.rfind(marker)
    while start != -1:
        brace = start + len(marker) - 1
        if brace in closing:
            return text[brace + 1:closing[brace]].strip()
        start = text.rfind(marker, 0, start)  # unbalanced: try an earlier one
    return None


def boxed() -> Callable[[str], str]:
    """The content of the last ``\\boxed{...}`` with balanced braces (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``)."""

    def parse(text: str) -> str:
        content = last_balanced(text, "\\boxed{")
        if content is None:
            raise ParseError("no complete \\boxed{...} in the output")
        return content

    return parse


def json_object(required: list[str] | None = None) -> Callable[[str], dict[str, Any]]:
    """The first JSON object in the output that parses and has every ``required`` key.

    Only a ``{`` followed by a key or ``}`` can open an object, and at most :data:`MAX_JSON_ATTEMPTS` of
    them are decoded: each attempt may read to the end of the text, so trying every ``{`` of a long text
    took quadratic time. Nesting past Python's recursion limit and integers past its digit limit are parse
    errors.
    """
    keys = list(required or [])
    decoder = json.JSONDecoder()

    def parse(text: str) -> dict[str, Any]:
        problem = "no JSON object in the output"
        for attempt, opening in enumerate(JSON_OPENING.finditer(text)):
            if attempt == MAX_JSON_ATTEMPTS:
                raise ParseError(f"{problem} (gave up after {MAX_JSON_ATTEMPTS} candidate objects)")
            try:
                value, _ = decoder.raw_decode(text, opening.start())
            except json.JSONDecodeError as exc:
                problem = f"JSON object is not valid: {exc.msg}"
                continue
            except RecursionError:
                problem = "JSON object is nested too deeply"
                continue
            except ValueError as exc:  # e.g. an integer longer than Python's digit limit
                problem = f"JSON object is not valid: {exc}"
                continue
            missing = [key for key in keys if key not in value]
            if not missing:
                return value
            problem = f"JSON object lacks required keys {missing}"
        raise ParseError(problem)

    return parse


def code_block(language: str | None = None) -> Callable[[str], str]:
    """The body of the first fenced code block (```lang ... ```), of ``language`` when given.

    Fences are found with ``str.find`` (the opening line, then the next fence), not one regex, whose
    backtracking over a long fence line without a newline took quadratic time.
    """

    def parse(text: str) -> str:
        position = 0
        while (opening := text.find("```", position)) != -1:
            line_end = text.find("\n", opening + 3)
            closing = text.find("```", line_end + 1) if line_end != -1 else -1
            if closing == -1:
                break
            info = FENCE_LANGUAGE.match(text, opening + 3).group()
            if language is None or info.lower() == language.lower():
                return text[line_end + 1:closing]
            position = closing + 3
        if "```" in text:
            raise ParseError("code fence is not terminated" if text.count("```") % 2 else
                             f"no ```{language} block in the output" if language else
                             "no complete fenced code block in the output")
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
