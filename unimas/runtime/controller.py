"""The hub of the star: runs many episodes at once and collects their graphs.

Each episode is one asyncio task running the workflow coroutine against its
own :class:`EpisodeContext`. A workflow that raises is isolated: its
trajectory records the error and the other episodes carry on. Two kinds of
exceptions are not episode-local and stop the step: a config mistake
(:class:`UserError`) and a model group that cannot serve
(:class:`GroupFailure`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from unimas.config import RoleConfig
from unimas.errors import UserError
from unimas.runtime.router import GroupFailure, Router
from unimas.trajectory import GraphTrajectory
from unimas.workflow.context import EpisodeContext

Workflow = Callable[[EpisodeContext, dict], Awaitable[Any]]


@dataclass
class EpisodeSpec:
    episode_id: str
    task_uid: str
    task: dict


async def _run_one(spec: EpisodeSpec, workflow: Workflow, roles, router: Router, tools,
                   greedy: bool) -> GraphTrajectory:
    trajectory = GraphTrajectory(episode_id=spec.episode_id, task_id=spec.task_uid, task=spec.task)
    context = EpisodeContext(trajectory, roles, router, tools, greedy=greedy)
    trajectory.started = time.perf_counter()
    try:
        outcome = await workflow(context, spec.task)
        trajectory.outcome = dict(outcome) if isinstance(outcome, Mapping) else {"result": outcome}
    except (UserError, GroupFailure):
        raise
    except Exception as exc:  # noqa: BLE001 - one broken episode never stops the others
        trajectory.error = f"{type(exc).__name__}: {exc}"
    trajectory.ended = time.perf_counter()
    return trajectory


async def run_episodes(
    specs: list[EpisodeSpec],
    workflow: Workflow,
    roles: Mapping[str, RoleConfig],
    router: Router,
    tools: Mapping[str, Callable[..., Any]],
    greedy: bool = False,
    max_concurrent: int = 1024,
) -> list[GraphTrajectory]:
    """Run all episodes, at most ``max_concurrent`` at a time; results in ``specs`` order.

    A fixed pool of workers pulls episodes from one queue. Each worker counts
    as one live episode for the router from start to end, so the router's
    "everyone is waiting" rule sees the true concurrency at every moment.
    """
    results: list[GraphTrajectory | None] = [None] * len(specs)
    pending = iter(enumerate(specs))

    async def worker() -> None:
        try:
            for index, spec in pending:
                results[index] = await _run_one(spec, workflow, roles, router, tools, greedy)
        finally:
            router.episode_finished()

    workers = []
    for _ in range(min(max_concurrent, len(specs))):
        router.episode_started()
        workers.append(asyncio.ensure_future(worker()))
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    return results
