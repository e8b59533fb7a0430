"""Math rewards: symbolic answer equivalence (``math-verify``), verdict credit, per-role format, fix/break.

Every function here reads model output, which is data: nothing is evaluated,
and no input — garbage, empty, huge, ``None`` — makes a reward raise; what
cannot be read scores 0.0. Registered by :mod:`unimas_workflows.math_team`.

Equivalence (:func:`equivalent`) first tries exact rational arithmetic on
plain numbers (``1/2``, ``0.5``, ``1,234``, ``-3``), which is instant and
covers synthetic tasks, then ``math_verify``'s parse + verify
(``\\frac{1}{2}``, ``\\boxed{...}``, ``$...$``, ``2\\sqrt{2}``, sets, ...).
``math_verify`` bounds its sympy work with ``SIGALRM``; that is only
possible on the main thread with no other timer running (e.g. a unimas tool
timer). Elsewhere nothing could stop sympy on a short hostile answer
(``2^{10^{10}}``, ``(10^{10})!``, a product of a dozen binomials), so there
only plain numbers and identical strings are compared.
"""

from __future__ import annotations

import re
import signal
import threading
from fractions import Fraction
from typing import Any

from unimas import GraphTrajectory

MAX_CHARS = 256
"""Longest answer string handed to the symbolic checker (the end is kept: final answers come last)."""

TIMEOUT_S = 2
MAX_DEPTH = 12
"""Deepest brace nesting handed to the symbolic checker (deeper is not a final answer, and slow to parse)."""
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/[-+]?\d+(?:\.\d*)?)?")
_WRAPPERS = re.compile(r"^\$+|\$+$|^\\\(|\\\)$|^\\\[|\\\]$")


def _text(value: Any) -> str:
    if value is None:
        return ""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # noqa: BLE001 - an object whose str() fails is unreadable, not an error
        return ""
    return text.strip()[-MAX_CHARS:]


def plain_number(text: str) -> Fraction | None:
    """``text`` as an exact rational when it is a plain number (thousands commas allowed), else None."""
    cleaned = _WRAPPERS.sub("", text.strip()).strip().replace(",", "").replace(" ", "")
    if not cleaned or len(cleaned) > 64 or not _PLAIN_NUMBER.fullmatch(cleaned):
        return None
    try:
        if "/" in cleaned:
            top, bottom = cleaned.split("/")
            return Fraction(top) / Fraction(bottom)
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError, ArithmeticError):
        return None


def _timeout() -> int | None:
    usable = (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
              and signal.getitimer(signal.ITIMER_REAL)[0] == 0)
    return TIMEOUT_S if usable else None


def _too_deep(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"{": 1, "}": -1, "(": 1, ")": -1}.get(char, 0)
        if depth > MAX_DEPTH:
            return True
    return text.count("^") > 4


def _symbolic(text: str) -> list:
    timeout = _timeout()
    if timeout is None or _too_deep(text):
        return []
    try:
        from math_verify import parse
        # math_verify reads LaTeX inside $...$ or \boxed{}: a bare answer ("1/2", "\frac12") is wrapped first.
        delimited = "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text
        candidates = [text] if delimited else [f"${text}$", text]
        for candidate in candidates:
            parsed = parse(candidate, parsing_timeout=timeout)
            if parsed:
                return parsed
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
    return []


def readable(value: Any) -> bool:
    """The answer is a number or an expression the symbolic checker can read.

    ``math_verify.parse`` returns the bare string when it reads nothing (``$???$`` -> ``['???']``): that is
    not an expression, or any garbage would earn the format reward.
    """
    text = _text(value)
    return bool(text) and (plain_number(text) is not None
                           or any(not isinstance(item, str) for item in _symbolic(text)))


def equivalent(produced: Any, expected: Any) -> bool:
    """Mathematical equivalence of two answers: ``1/2`` == ``0.5`` == ``\\frac{1}{2}``; never raises."""
    got, want = _text(produced), _text(expected)
    if not got or not want:
        return False
    got_number, want_number = plain_number(got), plain_number(want)
    if got_number is not None and want_number is not None:
        return got_number == want_number
    if got == want:
        return True
    gold, answer = _symbolic(want), _symbolic(got)
    if not gold or not answer:
        return False
    try:
        from math_verify import verify
        return bool(verify(gold, answer, timeout_seconds=_timeout()))
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return False


def _outcome(trajectory: GraphTrajectory) -> dict:
    outcome = getattr(trajectory, "outcome", None)
    return outcome if isinstance(outcome, dict) else {}


def math_correct(trajectory: GraphTrajectory, task: dict, field: str = "answer", target: str = "answer") -> float:
    """Trajectory-level: 1.0 when ``outcome[field]`` is mathematically equal to ``task[target]``."""
    return float(equivalent(_outcome(trajectory).get(field), task.get(target)))


def verdict_correct(trajectory: GraphTrajectory, task: dict, target: str = "answer", ok: str = "ok",
                    wrong: str = "wrong") -> dict[str, float]:
    """Turn-level, for the verifier: 1.0 for a verdict that is right about the proposal it judged.

    ``ok`` on a correct proposal or ``wrong`` on an incorrect one earns 1.0; the opposite verdict or
    an unreadable one earns 0.0. Reads ``outcome["checks"]``: ``[{"turn", "proposal", "verdict"}]``.
    """
    rewards: dict[str, float] = {}
    checks = _outcome(trajectory).get("checks")
    known = {turn.id for turn in trajectory.turns()}
    for check in checks if isinstance(checks, list) else []:
        if not isinstance(check, dict) or check.get("turn") not in known:
            continue
        right = equivalent(check.get("proposal"), task.get(target))
        verdict = _text(check.get("verdict")).lower()
        rewards[check["turn"]] = float((verdict == ok and right) or (verdict == wrong and not right))
    return rewards


def math_format(trajectory: GraphTrajectory, task: dict,
                answer_roles: tuple[str, ...] | list[str] = ("solver", "refiner"),
                ) -> dict[str, float]:
    """Turn-level format, by role: an answer role's turn must parse to a readable number or expression;
    any other role's turn (the verifier's verdict) must parse."""
    rewards = {}
    for turn in trajectory.turns():
        ok = turn.parse_error is None and turn.parsed is not None
        if ok and turn.role in answer_roles:
            ok = readable(turn.parsed)
        rewards[turn.id] = float(ok)
    return rewards


def math_fix_or_break(trajectory: GraphTrajectory, task: dict, role: str = "refiner", proposal: str = "proposal",
                      field: str = "answer", target: str = "answer") -> dict[str, float]:
    """Role-level, like ``fix_or_break`` but with math equivalence: +1 to ``role`` for turning a wrong first
    proposal into a right final answer, -1 for breaking a right one, 0 otherwise."""
    outcome = _outcome(trajectory)
    was_right = equivalent(outcome.get(proposal), task.get(target))
    is_right = equivalent(outcome.get(field), task.get(target))
    return {role: float(is_right and not was_right) - float(was_right and not is_right)}


REWARDS = {"math_correct": math_correct, "verdict_correct": verdict_correct, "math_format": math_format,
           "math_fix_or_break": math_fix_or_break}
