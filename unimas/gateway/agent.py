"""The ``agent`` workflow kind: an existing program plays the episode through the gateway.

Per episode the agent gets the task and its own base URL; each request it
sends becomes a turn (see :mod:`unimas.gateway.sessions`). What it returns
is the episode's outcome, for the reward plugins, with the rewards it posted
for its turns under ``agent_rewards`` (read by the ``agent_reward`` reward).
A program that hangs, crashes or prints no JSON object fails its episode
with the reason and the end of its stderr; the run goes on per
``trainer.failure_budget``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import signal
from typing import Any, Awaitable, Callable, Mapping

from unimas.config import AgentConfig, RoleConfig
from unimas.controller.context import EpisodeContext
from unimas.controller.timeouts import bounded
from unimas.errors import UserError
from unimas.gateway.server import GatewayServer

STDERR_KEPT = 4000
"""Characters of a failed agent's stderr kept in the episode's error."""


class AgentFailed(RuntimeError):
    """The agent program did not produce an outcome: its episode fails with this message."""


def load_function(spec: str) -> Callable[[dict, str], Awaitable[dict]]:
    """``pkg.module:run`` -> the coroutine function it names (a config mistake is a UserError)."""
    module_name, _, attr = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load agent function {spec!r}: {exc}", where="workflow.agent.function") from None
    if not inspect.iscoroutinefunction(function):
        raise UserError(f"agent function {spec!r} must be `async def run(task, base_url) -> dict` (a plain def "
                        "would block the episodes' event loop)", where="workflow.agent.function")
    return function


def _outcome(stdout: str) -> dict:
    """The last non-empty line of stdout, which must be a JSON object (earlier lines may be the agent's log)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        outcome = json.loads(lines[-1]) if lines else None
    except ValueError:
        outcome = None
    if not isinstance(outcome, dict):
        raise AgentFailed(f"the agent's last line of stdout is not a JSON object: {(lines or [''])[-1][:200]!r}")
    return outcome


async def run_command(command: list[str], task: dict, env: Mapping[str, str], timeout_s: float) -> dict:
    """Run ``command`` with the task on stdin; its whole process group is killed on timeout or cancellation."""
    try:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **env}, start_new_session=True)
    except OSError as exc:
        raise UserError(f"cannot start the agent {command}: {exc}", where="workflow.agent.command") from None
    try:
        stdout, stderr = await bounded(process.communicate(json.dumps(task).encode()), timeout_s, "the agent")
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it may have exited a moment ago
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    if process.returncode != 0:
        tail = stderr.decode(errors="replace")[-STDERR_KEPT:]
        raise AgentFailed(f"the agent exited with code {process.returncode}; its stderr ends:\n{tail}")
    return _outcome(stdout.decode(errors="replace"))


class AgentWorkflow:
    """``async (ctx, task) -> outcome`` like any workflow; owns the run's gateway server."""

    def __init__(self, config: AgentConfig, roles: Mapping[str, RoleConfig]):
        self.config = config
        self.gateway = GatewayServer(roles, config.host, config.port)
        self.function = load_function(config.function) if config.function else None
        self.__name__ = "agent"

    async def __call__(self, ctx: EpisodeContext, task: dict) -> dict[str, Any]:
        with self.gateway.episode(ctx) as episode:
            try:
                outcome = await self._run_agent(task, self.gateway.base_url(episode))
            except Exception:
                if episode.fatal is None:
                    raise
                outcome = {}  # the agent gave up on a failed turn: that failure is the episode's error
        if episode.fatal is not None:
            raise episode.fatal
        return {**outcome, "agent_rewards": episode.rewards}

    async def _run_agent(self, task: dict, base_url: str) -> Mapping[str, Any]:
        if self.function is None:
            env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": self.gateway.token}
            return await run_command(self.config.command, task, env, self.config.timeout_s)
        outcome = await bounded(self.function(dict(task), base_url), self.config.timeout_s, "the agent")
        if not isinstance(outcome, Mapping):
            raise AgentFailed(f"the agent function returned {type(outcome).__name__}, not a dict")
        return outcome
