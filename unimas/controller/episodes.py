"""The hub of the star: runs many episodes at once and collects their graphs.

Each episode is one asyncio task running the workflow coroutine against its
own :class:`~unimas.controller.context.EpisodeContext`. A workflow that
raises is isolated: its trajectory records the error (with the file and line
of the user's code) and the other episodes carry on; so is one that runs past
``runtime.episode_timeout_s`` or calls ``sys.exit``. Two kinds of exceptions
are not episode-local and stop the step: a config mistake
(:class:`UserError`) and a model group that cannot serve
(:class:`ModelGroupError`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Mapping

from unimas.config.schema import RoleConfig
from unimas.controller.context import EpisodeContext
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.controller.timeouts import Deadlines, cancelled_from_outside
from unimas.errors import ModelGroupError, UserError, describe
from unimas.trajectory import GraphTrajectory

Workflow = Callable[[EpisodeContext, dict], Awaitable[Any]]


class Controller:
    """Runs episodes of one workflow against the roles, tools and router of a run."""

    def __init__(self, workflow: Workflow, roles: Mapping[str, RoleConfig], router: Router,
                 tools: Mapping[str, Callable[..., Any]], max_concurrent: int = 1024,
                 tool_timeout_s: float = 60.0, episode_timeout_s: float = 600.0,
                 parsers: Mapping[str, Callable[[str], Any]] | None = None, workflow_label: str = "the workflow"):
        self.workflow = workflow
        self.workflow_label = workflow_label
        self.roles = roles
        self.router = router
        self.tools = tools
        self.max_concurrent = max_concurrent
        self.tool_timeout_s = tool_timeout_s
        self.episode_timeout_s = episode_timeout_s
        self.parsers = parsers or {}

    async def _run_one(self, spec: EpisodeSpec, greedy: bool, deadlines: Deadlines) -> GraphTrajectory:
        trajectory = GraphTrajectory(episode_id=spec.episode_id, task_id=spec.task_uid, task=spec.task)
        if spec.prefix is not None:
            trajectory.forked_from, trajectory.fork_turn = spec.prefix.parent, spec.prefix.fork_turn
        context = EpisodeContext(trajectory, self.roles, self.router, self.tools, greedy=greedy,
                                 tool_timeout_s=self.tool_timeout_s, parsers=self.parsers, prefix=spec.prefix,
                                 workflow=self.workflow_label)
        trajectory.started = time.perf_counter()
        try:
            outcome = await deadlines.run(self.workflow(context, spec.task))
            trajectory.outcome = dict(outcome) if type(outcome) is dict or isinstance(outcome, Mapping) \
                else {"result": outcome}  # the type test first: isinstance against an ABC costs ~1 µs
        except (UserError, ModelGroupError):
            raise
        except asyncio.CancelledError as exc:
            if cancelled_from_outside():  # the step is being stopped: not this episode's failure
                raise
            trajectory.fail(describe(exc), exc)  # raised by user code itself: its bug, like any other
        except (Exception, SystemExit, GeneratorExit) as exc:  # noqa: BLE001 - one broken episode stops no other
            # SystemExit and GeneratorExit too: user code cannot end the run; KeyboardInterrupt (Ctrl-C) still does.
            trajectory.fail(describe(exc), exc)
        trajectory.ended = time.perf_counter()
        return trajectory

    async def run(self, specs: list[EpisodeSpec], greedy: bool = False) -> list[GraphTrajectory]:
        """Run all episodes, at most ``max_concurrent`` at a time; results in ``specs`` order.

        A fixed pool of workers pulls episodes from one queue. Each worker
        counts as one live episode for the router from start to end, so the
        router's "everyone is waiting" rule sees the true concurrency.
        """
        results: list[GraphTrajectory | None] = [None] * len(specs)
        pending = iter(enumerate(specs))
        deadlines = Deadlines(self.episode_timeout_s, "the episode")  # one timer for all episodes' time limits

        async def worker() -> None:
            try:
                for index, spec in pending:
                    results[index] = await self._run_one(spec, greedy, deadlines)
            finally:
                self.router.episode_finished()

        workers = []
        loop = asyncio.get_running_loop()
        for _ in range(min(self.max_concurrent, len(specs))):
            self.router.episode_started()
            workers.append(loop.create_task(worker()))
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        finally:
            deadlines.close()
        return results
