"""``unimas sandbox FILE``: run a file in the sandbox from the command line, for people debugging their tasks.

Kept out of :mod:`unimas.commands`, which imports torch: this command should start in a fraction of a second.
"""

from __future__ import annotations

import json

from unimas.errors import UserError
from unimas.safe_load import read_bytes
from unimas.sandbox.runner import SandboxLimits, run_python


def cli_command(args) -> int:
    """``unimas sandbox FILE``: print the result as one JSON line; exit 0 when ok, 1 otherwise."""
    def read(path, option):
        try:
            return read_bytes(path).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read it: {exc.strerror if isinstance(exc, OSError) else exc}",
                            where=f"{option} {path}") from None

    source = read(args.file, "FILE")
    stdin = read(args.stdin, "--stdin") if args.stdin else ""
    try:
        limits = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb)
    except ValueError as exc:
        raise UserError(str(exc), where="--timeout/--memory-mb") from None
    result = run_python(source, stdin=stdin, limits=limits, allow_fallback=args.allow_fallback)
    print(json.dumps(result.to_json()))
    return 0 if result.status == "ok" else 1
