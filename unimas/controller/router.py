"""Micro-batching of generation requests per model group.

Every ``ctx.act`` in every in-flight episode becomes one request here. A
group's queue is flushed as one batch when it reaches ``max_batch_size``,
when *every* live episode is waiting on a model (nothing else can make
progress, so waiting longer only adds latency), or after ``max_wait_s``
otherwise (e.g. some episodes are in a slow tool call). The second rule makes
batch composition — and so sampling — deterministic whenever no real-time
waits are involved. Local and Ray runs then match exactly for lock-step
workflows (see docs/runtime.md for when Ray's completion order can differ).

"Waiting" is counted per episode, not per request, and the check runs one
event-loop turn after the request that triggered it: an episode that fans
out with ``asyncio.gather`` has its other branches already queued to run by
then, so they join the same batch.

The router does not know how a batch reaches a model: a
:class:`~unimas.groups.base.Transport` does that (in-process call, or a
Ray actor call). One routing code path, several transports.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from unimas.errors import ModelGroupError, UserError
from unimas.groups.base import GenRequest, GenResult

if TYPE_CHECKING:  # the transport module builds model groups (torch); the router only calls one
    from unimas.groups.base import Transport


class Router:
    def __init__(self, transport: Transport, max_batch_size: int = 256, max_wait_s: float = 0.005):
        self.transport = transport
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._queues: dict[str, list[tuple[GenRequest, asyncio.Future, str]]] = defaultdict(list)
        self._live_episodes = 0
        self._pending: Counter[str] = Counter()
        """Outstanding requests per episode; an episode with any is blocked on a model."""
        self._check_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._inflight: set[asyncio.Task] = set()
        self.batches: list[tuple[str, int]] = []
        """(group, batch size) of every flushed batch: for metrics and tests."""

    def episode_started(self) -> None:
        self._live_episodes += 1

    def episode_finished(self) -> None:
        self._live_episodes -= 1
        self._maybe_flush()

    def submit(self, group: str, request: GenRequest, episode: str = "") -> asyncio.Future[GenResult]:
        """Queue ``request``; ``await`` the returned future for its result.

        A plain function, not a coroutine: the request is queued when called, and the
        awaiting episode waits on the future itself, without a coroutine frame per turn.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        queue = self._queues[group]
        queue.append((request, future, episode))
        self._pending[episode] += 1
        if len(queue) >= self.max_batch_size:
            self._flush(group)
        elif not self._check_scheduled:  # the queue holds this request: schedule the check
            self._check_scheduled = True
            loop.call_soon(self._check)
        return future

    def _maybe_flush(self) -> None:
        if not self._check_scheduled and any(self._queues.values()):
            self._check_scheduled = True
            asyncio.get_running_loop().call_soon(self._check)

    def _check(self) -> None:
        self._check_scheduled = False
        if not any(self._queues.values()):
            return
        if len(self._pending) >= self._live_episodes:
            self._flush_all()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._flush_all)

    def _flush_all(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for group in sorted(self._queues):
            if self._queues[group]:
                self._flush(group)

    def _flush(self, group: str) -> None:
        batch = self._queues[group][: self.max_batch_size]
        del self._queues[group][: self.max_batch_size]
        self.batches.append((group, len(batch)))
        task = asyncio.ensure_future(self._serve(group, batch))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _serve(self, group: str, batch: list[tuple[GenRequest, asyncio.Future, str]]) -> None:
        try:
            results = await self.transport.generate(group, [request for request, _, _ in batch])
            if len(results) != len(batch):
                raise ValueError(f"returned {len(results)} results for {len(batch)} requests")
            error = None
        except (ModelGroupError, UserError) as exc:  # surfaced to every waiting episode
            results, error = None, exc
        except Exception as exc:  # noqa: BLE001 - a transport without its own wrapping
            results, error = None, ModelGroupError(group, "generate", exc)
        for _, _, episode in batch:
            self._pending[episode] -= 1
            if not self._pending[episode]:
                del self._pending[episode]
        for index, (_, future, _) in enumerate(batch):
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(results[index])
        if self._queues[group]:
            self._maybe_flush()
