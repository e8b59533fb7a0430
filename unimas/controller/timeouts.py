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


async def call_with_timeout(function: Callable[..., Any], arguments: Mapping[str, Any], seconds: float) -> Any:
    """Call a plain or async tool with ``arguments``; its synchronous part and its awaiting both bounded."""
    name = getattr(function, "__name__", "tool")
    with _alarm(seconds, f"tool {name!r}"):
        result = function(**arguments)
    if inspect.isawaitable(result):
        return await bounded(result, seconds, f"tool {name!r}")
    return result
