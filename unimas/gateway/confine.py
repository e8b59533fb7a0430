"""One agent, one episode, one process tree: how an agent program is started, read and stopped.

Every agent program runs in a process tree of its own that ends as a whole
with its episode — its children in the same process group, ``setsid``
grandchildren and any process still holding its stdout or stderr included.
Two ways, chosen once per trainer process (:func:`confinement`):

* **bubblewrap** (``bwrap`` on ``PATH`` and able to make a PID namespace,
  checked by running it once): ``bwrap --unshare-pid --die-with-parent
  --dev-bind / / --proc /proc``. The filesystem, network and user stay the
  trainer's; the program is alone in a new PID namespace with a /proc of its
  own. When the program exits, the namespace's init exits and the kernel
  kills everything left in the namespace before the trainer sees bwrap
  exit; when the trainer kills bwrap (timeout, cancellation) or dies,
  ``--die-with-parent`` takes the namespace down the same way. The fresh
  /proc also hides the other episodes' agents, so no agent can read a
  sibling's ``OPENAI_API_KEY`` from ``/proc/<pid>/environ``.
* **otherwise, a subreaper launcher** (:mod:`unimas.gateway.reaper`, a
  stdlib-only script started with ``python -I -S``): it makes itself child
  subreaper, runs the program, and on its exit, on SIGTERM or on the
  trainer's death SIGKILLs every descendant it finds through ``/proc``
  parent links (orphans are re-parented to it, so none escapes). The tree is
  ended as reliably, but all agents share the trainer's PID namespace:
  an agent running as the trainer's user can read its siblings'
  environment, so the per-episode tokens are secret only from other users.
  A warning says so once.

Output is read into bounded buffers (:class:`Tail`): an agent may print
without limit, the trainer keeps only the end of each stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BWRAP_FLAGS = ("--unshare-pid", "--die-with-parent", "--dev-bind", "/", "/", "--proc", "/proc")
REAPER = Path(__file__).with_name("reaper.py")
READ_CHUNK = 1 << 20
STOP_GRACE_S = 5.0
"""How long a stopped agent's tree may take to go (the launcher's clean-up, the namespace's teardown)."""


@dataclass(frozen=True)
class Confinement:
    """How to wrap an agent's command so that its process tree ends with it."""

    bwrap: str | None
    """Path of a working bubblewrap; None: the subreaper launcher."""

    @property
    def hides_siblings(self) -> bool:
        """Whether an agent cannot see the other agents' processes (their /proc entries, environment)."""
        return self.bwrap is not None

    def argv(self, command: list[str]) -> list[str]:
        if self.bwrap is not None:
            return [self.bwrap, *BWRAP_FLAGS, "--chdir", os.getcwd(), "--", *command]
        return [sys.executable, "-I", "-S", str(REAPER), str(os.getpid()), "--", *command]

    async def stop(self, process: asyncio.subprocess.Process) -> None:
        """End a still-running agent and its whole tree.

        bwrap is killed outright (``--die-with-parent`` takes the namespace
        with it); the launcher gets SIGTERM so that it can kill the tree, and
        SIGKILL if it has not gone within ``STOP_GRACE_S``.
        """
        if process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # it may have exited a moment ago
            os.kill(process.pid, signal.SIGKILL if self.bwrap is not None else signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()


@functools.lru_cache(maxsize=None)
def confinement() -> Confinement:
    """bubblewrap when it works here, else the subreaper launcher (with a warning, once)."""
    bwrap = shutil.which("bwrap")
    if bwrap is not None:
        try:
            probe = subprocess.run([bwrap, *BWRAP_FLAGS, "--", "true"], capture_output=True, timeout=30)
            if probe.returncode == 0:
                return Confinement(bwrap)
            reason = f"bwrap cannot make a PID namespace here: {probe.stderr.decode(errors='replace').strip()}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            reason = f"bwrap does not run: {exc}"
    else:
        reason = "bwrap (bubblewrap) is not installed"
    log.warning("%s; agent programs run under a subreaper instead, which ends their process trees but lets an "
                "agent running as your user read its sibling agents' environment (their gateway tokens). "
                "Install bubblewrap to isolate episodes (docs/gateway.md, Isolation).", reason)
    return Confinement(None)


class Tail:
    """The last ``size`` bytes written to a stream, and whether anything before them was dropped."""

    def __init__(self, size: int):
        self.size = size
        self.data = bytearray()
        self.dropped = False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.size:
            del self.data[: len(self.data) - self.size]  # cheap: bytearray drops its head in place
            self.dropped = True


async def read_tail(stream: asyncio.StreamReader, size: int) -> Tail:
    """Read ``stream`` to its end, keeping only its last ``size`` bytes."""
    tail = Tail(size)
    while chunk := await stream.read(READ_CHUNK):
        tail.add(chunk)
    return tail


async def feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data`` and close; an agent that exits without reading it is not an error."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
        stdin.close()
