"""``python -I -S reaper.py PARENT_PID -- COMMAND...``: run COMMAND and, when it ends, every process it left.

The fallback confinement of an agent program where bubblewrap is missing
(see :mod:`unimas.gateway.confine`). This process makes itself the *child
subreaper* of everything it starts (``prctl(PR_SET_CHILD_SUBREAPER)``), so a
descendant that double-forks, calls ``setsid`` or keeps the agent's stdout
open is re-parented to it rather than to init and can always be found by
walking ``/proc`` parent links from here. When COMMAND exits, or this
process gets SIGTERM / SIGHUP / SIGINT, or its parent (the trainer) dies
(``PR_SET_PDEATHSIG``), it SIGKILLs all its descendants, reaps them, and
exits with COMMAND's status (128 + signal for a signal, as a shell does).

Standard library only, and run with ``-I -S``: it starts once per episode,
so it must start fast, and nothing in the agent's environment may change it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process this user can see."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()  # the command name may hold spaces and ')'
        except OSError:  # it exited while we looked
            continue
        parents[int(name)] = int(fields[1])
    return parents


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, frontier = [], [root]
    while frontier:
        found.extend(kids := [kid for pid in frontier for kid in children.get(pid, [])])
        frontier = kids
    return found


def kill_all() -> None:
    """SIGKILL every descendant until none is left; orphans come to us (the subreaper), so none escapes."""
    while True:
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    parent, separator, command = argv[0], argv[1], argv[2:]
    assert separator == "--" and command, "usage: reaper.py PARENT_PID -- COMMAND..."
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the trainer died before PR_SET_PDEATHSIG took effect
        return 1

    def stop(signum: int, frame: object) -> None:
        kill_all()
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"cannot start the agent {command}: {exc}", file=sys.stderr)
        return 127
    status = child.wait()
    kill_all()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
