"""Process-wide set-up that every unimas process doing model work applies once (driver and Ray actors):
torch threads and seed, the priority of the Ray workers it starts, Ctrl-C that always ends a run."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


def torch_setup(threads: int, seed: int) -> None:
    """Thread count, the global torch seed (only LoRA dropout draws from it), no HF progress bars."""
    import torch  # heavy: imported by processes that load models, not by `import unimas`
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)


RAY_WORKER_NICENESS = "RAY_worker_niceness"


def ray_workers_at_normal_priority() -> None:
    """Ray workers that a Ray instance started from here spawns run at the driver's priority, not niced.

    Ray starts its worker processes at niceness 15 so that an interactive driver stays responsive. Here the
    workers do the run's work (model groups, verl ranks, rollout servers) while the driver mostly waits on
    them, and at niceness 15 any other busy process on the machine starves them: a kill-and-restart test
    took 85 s beside other jobs and 13-20 s alone (docs/testing.md). The raylet reads the variable at start,
    so this applies to instances started after it; a value the user set is kept.
    """
    os.environ.setdefault(RAY_WORKER_NICENESS, "0")


async def until_interrupted(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work``; Ctrl-C (SIGINT) ends it with :class:`KeyboardInterrupt`, whatever SIGINT handler is set.

    ``asyncio.run`` turns Ctrl-C into a cancellation through the Python-level SIGINT handler, and libraries
    swap that handler: Ray's driver defers SIGINT around some of its calls, and two such sections nested
    leave Ray's deferring handler installed for good (ray 2.60, ``ray._private.utils.DeferSigint``). A run
    then went on training after its Ctrl-C (tests/test_ray_runtime.py). The event loop's own signal
    handler is fed by the wakeup fd, which the C-level handler writes whichever Python handler is in
    place. The first SIGINT cancels ``work`` (its ``finally`` blocks run); a second one stops at once.
    Outside the main thread (or without signals) ``work`` is awaited as it is.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    interrupts = 0

    def interrupt() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            raise KeyboardInterrupt  # out of the event loop: the cleanup of the first one is not awaited
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, interrupt)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        return await task
    try:
        return await task
    except asyncio.CancelledError:
        if interrupts:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
