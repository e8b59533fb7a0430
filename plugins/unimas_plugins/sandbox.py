"""The ``run_python`` tool: runs model-written Python in the bubblewrap sandbox of :mod:`unimas.sandbox.runner`.

Workflows call ``await ctx.tool("run_python", code=..., stdin=..., timeout_s=...)``
and get the JSON object of :meth:`unimas.sandbox.runner.SandboxResult.to_json`
(``status``, ``exit_code``, ``stdout``, ``stderr``, ``duration_s``, ``notes``).
The tool never falls back to running without namespaces: a machine without
bubblewrap gets status ``refused``. Workflow validation can check ahead with
:func:`unimas.sandbox.runner.require_available`.
"""

from __future__ import annotations

import asyncio

import unimas
from unimas.sandbox.runner import SandboxLimits, run_python

MAX_TIMEOUT_S = 60.0


async def run_python_tool(code: str, stdin: str = "", timeout_s: float = 10.0) -> dict:
    """Run ``code`` (with ``stdin``) in the sandbox for at most ``timeout_s`` seconds (capped at 60)."""
    timeout = min(float(timeout_s), MAX_TIMEOUT_S)
    if not timeout > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    result = await asyncio.to_thread(run_python, str(code), stdin=str(stdin or ""),
                                     limits=SandboxLimits(timeout_s=timeout))
    return result.to_json()


run_python_tool.__name__ = "run_python"


@unimas.hookimpl
def unimas_tools():
    return {"run_python": run_python_tool}
