"""Time limits for user code the hub runs: tools and whole episodes.

Async code is bounded with asyncio's cancellation. A plain ``def`` tool
cannot be cancelled from the event loop, so it runs under a ``SIGALRM`` timer
that raises :class:`TimeoutError` inside it: the call stays in the event-loop
thread, which keeps batch composition — and so sampling — deterministic.
The timer needs the main thread of a POSIX process; elsewhere plain tools run
without a limit. Code that blocks the event loop inside ``async def`` (a
``time.sleep`` in a workflow or async tool) cannot be interrupted at all —
see docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import threading
from typing import Any, Awaitable, Callable, Iterator, Mapping, TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def _alarm(seconds: float, what: str) -> Iterator[None]:
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or signal.getitimer(signal.ITIMER_REAL)[0] > 0:  # no timer, or somebody else's is running
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} did not return within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


async def bounded(awaitable: Awaitable[T], seconds: float, what: str) -> T:
    """``await awaitable`` for at most ``seconds``; a ``TimeoutError`` naming ``what`` after that."""
    if not hasattr(asyncio, "timeout"):  # Python 3.10
        return await asyncio.wait_for(awaitable, seconds)
    # asyncio.timeout cancels the current task instead of wrapping the awaitable in a new one, so the
    # order in which episodes reach the router — and so batch composition — is what it is without a limit.
    scope = asyncio.timeout(seconds)
    try:
        async with scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            raise TimeoutError(f"{what} did not finish within {seconds:g} s") from None
        raise


class Deadlines:
    """One time limit for many tasks (the episodes of a step) on one timer, not one timer per task.

    ``bounded`` arms and cancels an event-loop timer per episode (~5 µs each,
    profiled in ``benchmarks/overhead.py``). Here every task gets the same
    limit, and deadlines are taken in time order, so the earliest deadline
    still pending is the oldest entry: one timer armed at it is enough. An
    expired task is cancelled and its ``run`` raises the same ``TimeoutError``
    as ``bounded``. Call :meth:`close` when done. Without ``Task.uncancel``
    (Python 3.10) each task falls back to ``bounded``.
    """

    def __init__(self, seconds: float, what: str):
        self.seconds = seconds
        self.what = what
        self._pending: dict[asyncio.Task, float] = {}
        """Task -> deadline, oldest first (insertion order is deadline order)."""
        self._expired: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def run(self, awaitable: Awaitable[T]) -> T:
        task = asyncio.current_task()
        if task is None or not hasattr(task, "uncancel"):
            return await bounded(awaitable, self.seconds, self.what)
        loop = asyncio.get_running_loop()
        self._pending[task] = loop.time() + self.seconds
        if self._timer is None:
            self._timer = loop.call_at(self._pending[task], self._expire, self._pending[task])
        cancelling = task.cancelling()
        try:
            result = await awaitable
            if task in self._expired:  # user code caught the cancellation and went on: it still ran past the limit
                task.uncancel()
                raise self._timed_out()
            return result
        except asyncio.CancelledError:
            # ours only when nobody else cancelled the task as well (as asyncio.timeout decides)
            if task in self._expired and task.uncancel() <= cancelling:
                raise self._timed_out() from None
            raise
        finally:
            self._pending.pop(task, None)
            self._expired.discard(task)

    def _timed_out(self) -> TimeoutError:
        return TimeoutError(f"{self.what} did not finish within {self.seconds:g} s")

    def _expire(self, armed_for: float) -> None:
        loop = asyncio.get_running_loop()
        now = max(loop.time(), armed_for)  # the loop may fire a timer up to its clock resolution early
        self._timer = None
        for task, deadline in list(self._pending.items()):
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire, deadline)
                break
            del self._pending[task]
            self._expired.add(task)
            task.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def cancelled_from_outside() -> bool:
    """Whether the current task is being cancelled (``Task.cancel``), as opposed to user code having raised
    ``asyncio.CancelledError`` itself, which is that code's bug. Called only once a ``CancelledError`` is caught.
    Python 3.10 cannot tell the two apart (no ``Task.cancelling``): every ``CancelledError`` counts as a cancel."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0


async def call_with_timeout(function: Callable[..., Any], arguments: Mapping[str, Any], seconds: float) -> Any:
    """Call a plain or async tool with ``arguments``; its synchronous part and its awaiting both bounded."""
    name = getattr(function, "__name__", "tool")
    with _alarm(seconds, f"tool {name!r}"):
        result = function(**arguments)
    if inspect.isawaitable(result):
        return await bounded(result, seconds, f"tool {name!r}")
    return result
