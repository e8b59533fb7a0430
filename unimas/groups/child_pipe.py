"""A child Python process that a model group talks to in JSON lines over two pipes: the rollout-process replica
(``groups/torch/rollout_replica.py``) and the vLLM engine (``groups/vllm_engine.py``).

One place for what both need and must get right the same way: the child gets only the two pipe ends (no pickle,
no socket), its output goes to a file kept for the error a dead child raises, and it is stopped — request pipe
closed, then killed past a timeout — when its owner closes it or is collected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import weakref
from typing import IO, Any, Callable, Mapping


class ChildPipe:
    """``python -m module REQUEST_FD REPLY_FD PARENT_PID`` and its two pipes.

    ``describe`` names the child in errors (e.g. "the vLLM engine of model group 'g' (pid 12)"); ``error`` is the
    exception a dead child raises; ``cleanup`` removes what the owner made for the child (its weight file or
    folder), once the child is gone or failed to start.
    """

    def __init__(self, module: str, env: Mapping[str, str], describe: Callable[[int], str],
                 error: type[Exception], cleanup: Callable[[], None], stop_timeout: float):
        self._describe = describe
        self._error = error
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        self.log: IO[bytes] = tempfile.TemporaryFile(prefix="unimas-child-log-")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, str(request_read), str(reply_write), str(os.getpid())],
                pass_fds=(request_read, reply_write), stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                env=dict(env))
        except OSError:
            os.close(request_write)
            os.close(reply_read)
            cleanup()
            raise
        finally:
            os.close(request_read)
            os.close(reply_write)
        self._requests = os.fdopen(request_write, "wb", buffering=0)
        self._replies = os.fdopen(reply_read, "rb")
        self._finalizer = weakref.finalize(self, _stop, self.process, self._requests, cleanup, stop_timeout)
        self._ready = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._requests.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        except (BrokenPipeError, ValueError, OSError):
            raise self.died("taking a request") from None

    def receive(self, doing: str) -> dict[str, Any]:
        line = self._replies.readline()
        if not line:
            raise self.died(doing)
        return json.loads(line)

    def await_ready(self) -> None:
        """The child's first line says it is built (it reads its start message first)."""
        if not self._ready:
            self._ready = bool(self.receive("starting").get("ready"))

    def died(self, doing: str) -> Exception:
        """The error for a child that exited or closed its pipe while ``doing``: its exit code and last output."""
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", "replace").strip().splitlines()[-15:]
        how = f"exited with code {code}" if code is not None else "closed its pipe"
        return self._error(f"{self._describe(self.pid)} {how} while {doing} (its last output: "
                           f"{tail[-1] if tail else 'none'})" + "".join(f"\n  {t}" for t in tail))

    def close(self) -> None:
        """Stop the child (its request pipe closes: it exits; killed past the timeout) and clean up."""
        self._finalizer()
        self.log.close()


def _stop(process: subprocess.Popen, requests: IO[bytes], cleanup: Callable[[], None], timeout: float) -> None:
    try:
        requests.close()
    except OSError:
        pass
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    cleanup()
