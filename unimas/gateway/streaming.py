"""Streamed answers: the text of a turn handed from the generating thread to the web server as it grows.

A streamed request gives its turn a :class:`TurnStream` as the progress
callback (``GenRequest.progress``). The model group calls it on whatever
thread generates — the controller's, while the web server has its own loop —
with the text that may be shown so far (:mod:`unimas.groups.streaming`:
complete characters, nothing that could still become a stop string); the
stream hands each update to the server's loop, where the response sends it
as a chunk. Updates may be merged when the client reads slower than the
model samples. A group that cannot stream (a Ray actor: the callback is not
sent to it) never calls it: the answer then comes in one piece when the turn
is recorded.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable

from unimas.trajectory import TurnNode


class TurnStream:
    """Progress of one streamed turn: ``(turn id, text so far)`` updates, then the recorded turn."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._updates: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._turn: asyncio.Future[TurnNode] | None = None
        self.turn_id: str | None = None
        """The turn's id, known once its sampling began (or it was recorded)."""

    def __call__(self, turn_id: str, text: str) -> None:
        """From the generating thread: the turn's shown text is now ``text``."""
        self._loop.call_soon_threadsafe(self._updates.put_nowait, (turn_id, text))

    async def open(self, work: Awaitable[TurnNode]) -> None:
        """Start the turn; return once its sampling began or it ended. A refusal raises here, before the stream
        sends anything, so it is still answered with its HTTP status."""
        self._turn = asyncio.ensure_future(work)
        self._turn.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved even if unread
        update = await self._next()
        if update is not None:
            self.turn_id = update[0]
        else:
            self.turn_id = self._turn.result().id  # raises the refusal

    async def texts(self) -> AsyncIterator[str]:
        """The shown text each time it grows, until the turn is recorded."""
        while (update := await self._next()) is not None:
            if update[1]:
                yield update[1]

    async def turn(self) -> TurnNode:
        """The recorded turn (raises what the turn raised)."""
        assert self._turn is not None, "open() first"
        return await self._turn

    async def _next(self) -> tuple[str, str] | None:
        """The next update, or None once the turn is done and every update before it was read."""
        assert self._turn is not None, "open() first"
        if not self._updates.empty():
            return self._updates.get_nowait()
        if self._turn.done():
            return None
        getter = asyncio.ensure_future(self._updates.get())
        await asyncio.wait([self._turn, getter], return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        return self._updates.get_nowait() if not self._updates.empty() else None
