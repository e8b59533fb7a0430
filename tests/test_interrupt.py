"""Ctrl-C ends a run whatever SIGINT handler a library left behind (``unimas.process.until_interrupted``).

Ray 2.60's driver defers SIGINT around some of its calls (``DeferSigint``); two such sections nested leave
its deferring handler installed, and a ``runtime: ray`` run then went on training after Ctrl-C. These
scripts put that handler in place first, then get SIGINT.
"""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

pytest.importorskip("ray")

SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from ray._private.utils import DeferSigint
    from unimas.process import until_interrupted

    async def work():
        with DeferSigint():
            with DeferSigint():  # nested: Ray's deferring handler stays installed after both
                pass
        print("ready", flush=True)
        try:
            await asyncio.sleep(120)
        finally:
            print("cleanup started", flush=True)
            if sys.argv[1] == "slow-cleanup":
                await asyncio.sleep(120)
            print("cleanup done", flush=True)

    try:
        asyncio.run(until_interrupted(work()))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


def next_line(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """The script's next stdout line; a bound so that a script which never prints it fails, not hangs."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else "<nothing within the bound>"


def interrupted(tmp_path, cleanup: str, signals: int) -> tuple[int, str]:
    script = tmp_path / "work.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), cleanup], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert next_line(proc) == "ready"
        proc.send_signal(signal.SIGINT)
        if signals == 2:
            assert next_line(proc) == "cleanup started"
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # a bound so the test stops by itself; it exits at once
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out + err


def test_ctrl_c_cancels_the_work_and_runs_its_cleanup_after_ray_swapped_the_handler(tmp_path):
    code, out = interrupted(tmp_path, "quick-cleanup", signals=1)
    assert code == 130, out
    assert "cleanup done" in out and "interrupted" in out


def test_a_second_ctrl_c_stops_a_cleanup_that_hangs(tmp_path):
    code, out = interrupted(tmp_path, "slow-cleanup", signals=2)
    assert code == 130, out
    assert "cleanup done" not in out and "interrupted" in out
