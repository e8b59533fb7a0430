"""The error types the CLI turns into exit codes.

* :class:`UserError` — a mistake in user input (config, plugin, workflow or
  reward code, data file): one paragraph naming the field or file and the
  fix, exit code 2, never a traceback without ``--debug``.
* :class:`RunError` — the run cannot go on although the input was fine: one
  line, exit code 1. Its two kinds are :class:`ModelGroupError` (a group's
  process, actor or endpoint failed) and :class:`TrainingFailed`.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path


class UserError(Exception):
    """A mistake in user input: reported as one paragraph, exit code 2."""

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class RunError(RuntimeError):
    """The run cannot go on (not a config mistake): the CLI prints one line and exits 1."""


class ModelGroupError(RunError):
    """A model group failed in ``phase`` (generate, update, save, load, restart, start) with ``cause``.

    The one failure type of every transport: the router, the trainer and the
    CLI read ``group``, ``phase`` and ``cause`` instead of catching one
    exception class per layer. ``note`` says what was tried (a restart, a retry).
    """

    def __init__(self, group: str, phase: str, cause: BaseException, note: str = ""):
        self.group, self.phase, self.cause, self.note = group, phase, cause, note
        detail = (str(cause).strip().splitlines() or [""])[0]
        suffix = f" ({note})" if note else ""
        super().__init__(f"model group '{group}' failed during {phase}: {type(cause).__name__}: {detail}{suffix}")

    def during(self, where: str, note: str) -> "ModelGroupError":
        """The same failure, placed in the run and saying what was tried: ``step 3 (generate)``,
        ``step 0 (evaluation, generate)``."""
        place = f"{where[:-1]}, {self.phase})" if where.endswith(")") else f"{where} ({self.phase})"
        return ModelGroupError(self.group, place, self.cause, note)


class ParseError(ValueError):
    """Raised by an output parser: the text holds no answer. Recorded on the turn, never a crash."""


class TrainingFailed(RunError):
    """Too many episodes failed in one step (see ``trainer.failure_budget``)."""


_FRAMEWORK = (str(Path(__file__).resolve().parent), str(Path(sysconfig.get_paths()["stdlib"]).resolve()))


def user_location(exc: BaseException) -> str | None:
    """``file:line`` of the innermost traceback frame outside unimas and the standard library.

    Installed libraries count only when no other frame is left. Errors in
    workflow and reward plugins are the user's to fix, so the message points
    at their code rather than at the framework that called it.
    """
    outside = [(frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(exc.__traceback__)
               if not frame.f_code.co_filename.startswith("<")  # frozen importlib, exec'd strings
               and not str(Path(frame.f_code.co_filename).resolve()).startswith(_FRAMEWORK)]
    own = [entry for entry in outside if "site-packages" not in entry[0]]  # prefer the user's own files
    chosen = (own or outside or [None])[-1]
    return f"{chosen[0]}:{chosen[1]}" if chosen else None


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of an exception user code raised. When the exception's own ``__str__`` raises (a bug in a
    user's exception class), its type and a note instead: recording a failure must not fail in turn."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception as unshowable:  # noqa: BLE001 - whatever the user's __str__ raised
        return f"{type(exc).__name__} (its message cannot be shown: str() raised {type(unshowable).__name__})"


def describe(exc: BaseException) -> str:
    """One line for a user-code exception: type, message and where it was raised."""
    where = user_location(exc)
    return exception_text(exc) + (f" (at {where})" if where else "")
