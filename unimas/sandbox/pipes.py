"""The pipes and process group of one sandboxed run: capped capture, stdin feeding, killing the group.

Kept apart from :mod:`unimas.sandbox.runner` (which decides *how* code is isolated)
because these parts only move bytes and signals.
"""

from __future__ import annotations

import os
import signal
import threading


class Capture(threading.Thread):
    """Reads one pipe to its end, keeping the first ``cap`` bytes and a short tail for the status heuristics."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.head = bytearray()
        self.tail = b""
        self.total = 0

    def run(self):
        try:
            while chunk := self.stream.read1(65536):
                self.total += len(chunk)
                room = self.cap - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                self.tail = (self.tail + chunk)[-4096:]
        except (OSError, ValueError):
            pass

    def text(self, label: str, notes: list[str]) -> str:
        text = bytes(self.head).decode("utf-8", "replace")
        if self.total > self.cap:
            dropped = self.total - len(self.head)
            text += f"\n[unimas sandbox: {label} truncated, {dropped} more bytes dropped]"
            notes.append(f"{label} truncated to {self.cap} of {self.total} bytes")
        return text


def feed(stream, data: bytes) -> None:
    try:
        if data:
            stream.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
