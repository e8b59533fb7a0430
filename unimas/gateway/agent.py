"""The ``agent`` workflow kind: an existing program plays the episode through the gateway.

Per episode the agent gets the task and its own base URL; each request it
sends becomes a turn (see :mod:`unimas.gateway.sessions`). What it returns
is the episode's outcome, for the reward plugins, with the rewards it posted
for its turns under ``agent_rewards`` (read by the ``agent_reward`` reward);
the metrics it posted (``POST .../v1/metrics``) are logged as its workflow's
own (``workflow/<name>``, as ``ctx.metric``).
A program that hangs, crashes or prints no JSON object fails its episode
with the reason and the end of its stderr; the run goes on per
``trainer.failure_budget``.

A ``command`` agent is confined (:mod:`unimas.gateway.confine`): its whole
process tree ends with its episode, only the end of its output is kept, and
its ``OPENAI_API_KEY`` is a token of its own episode, which the gateway
requires on that episode's routes — the episode key in the URL alone admits
nobody.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import shutil
import sys
from typing import Any, Awaitable, Callable, Mapping

from unimas.config.schema import AgentConfig, RoleConfig
from unimas.controller.context import EpisodeContext
from unimas.controller.timeouts import bounded
from unimas.errors import UserError
from unimas.gateway.confine import READ_CHUNK, STOP_GRACE_S, Confinement, Tail, confinement, feed, read_tail
from unimas.gateway.guard import is_loopback
from unimas.gateway.server import GatewayServer
from unimas.gateway.sessions import Episode
from unimas.output.checkpoints import notice

STDERR_KEPT = 4000
"""Characters of a failed agent's stderr kept in the episode's error (only that much of stderr is kept)."""
OUTCOME_LIMIT = 1 << 20
"""Bytes of an agent's stdout kept: its last line, the outcome, must fit (more is the episode's error)."""
NO_TURNS = ("an agent episode ({episode}) made no model request through the gateway, so it has nothing to train on. "
            "The likely cause: a client-side cache answering repeated prompts (DSPy caches every call by default, "
            "keyed without the base URL: dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)), "
            "or a client that does not use OPENAI_BASE_URL. Counted per step as episode/no_turns; a step where more "
            "than trainer.no_turn_budget of the episodes made none skips its update (printed once per run)")
"""The warning printed the first time an agent episode ends without a turn."""


class AgentFailed(RuntimeError):
    """The agent program did not produce an outcome: its episode fails with this message."""


def _importable(module_name: str) -> bool:
    """Whether the module's top-level package is found on the current Python path."""
    try:
        return importlib.util.find_spec(module_name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def load_function(spec: str, config_dir: str | None = None) -> Callable[[dict, str], Awaitable[dict]]:
    """``pkg.module:run`` -> the coroutine function it names (a config mistake is a UserError).

    The module is imported from the Python path and, failing that, from the
    config file's directory (``config_dir``, appended to ``sys.path``), so a
    module next to the config works without installing it.
    """
    module_name, _, attr = spec.partition(":")
    if config_dir is not None and config_dir not in sys.path and not _importable(module_name):
        sys.path.append(config_dir)
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        looked = "the Python path" + (f" and the config's directory {config_dir}" if config_dir else "")
        raise UserError(f"cannot load agent function {spec!r}: {type(exc).__name__}: {exc} (looked in {looked}; "
                        "a module in a package needs its top-level directory there)",
                        where="workflow.agent.function") from None
    if not inspect.iscoroutinefunction(function):
        raise UserError(f"agent function {spec!r} must be `async def run(task, base_url) -> dict` (a plain def "
                        "would block the episodes' event loop)", where="workflow.agent.function")
    return function


def _outcome(stdout: Tail) -> dict:
    """The last non-empty line of stdout, which must be a JSON object (earlier lines may be the agent's log)."""
    kept = bytes(stdout.data).rstrip()
    start = kept.rfind(b"\n") + 1
    if start == 0 and stdout.dropped:
        raise AgentFailed(f"the agent's last line of stdout is longer than the outcome limit of {OUTCOME_LIMIT} "
                          "bytes: print the outcome as one compact JSON line")
    line = kept[start:].decode(errors="replace").strip()
    try:
        outcome = json.loads(line) if line else None
    except RecursionError:  # a RuntimeError, not a ValueError: it would have left the reason unsaid
        raise AgentFailed(f"the agent's last line of stdout is JSON nested too deeply to read: {line[:200]!r}") \
            from None
    except ValueError as exc:  # also an integer longer than Python's digit limit, which the error names
        raise AgentFailed(f"the agent's last line of stdout is not a JSON object ({exc}): {line[:200]!r}") from None
    if not isinstance(outcome, dict):
        raise AgentFailed(f"the agent's last line of stdout is not a JSON object: {line[:200]!r}")
    return outcome


async def run_command(command: list[str], task: dict, env: Mapping[str, str], timeout_s: float,
                      confined: Confinement) -> dict:
    """Run ``command`` with the task on stdin, confined; its whole process tree ends when this returns.

    Its output is read as it comes, keeping only the last ``OUTCOME_LIMIT``
    bytes of stdout and ``STDERR_KEPT`` characters of stderr.
    """
    if shutil.which(command[0], path=env.get("PATH", os.environ.get("PATH"))) is None:
        raise UserError(f"cannot start the agent {command}: {command[0]!r} is not an executable file or on PATH",
                        where="workflow.agent.command")
    try:
        process = await asyncio.create_subprocess_exec(
            *confined.argv(command), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **env}, start_new_session=True, limit=READ_CHUNK)
    except OSError as exc:
        raise UserError(f"cannot start the agent {command}: {exc}", where="workflow.agent.command") from None
    stdout = asyncio.ensure_future(read_tail(process.stdout, OUTCOME_LIMIT))
    stderr = asyncio.ensure_future(read_tail(process.stderr, 4 * STDERR_KEPT))  # UTF-8: at most 4 bytes a character
    writer = asyncio.ensure_future(feed(process.stdin, json.dumps(task).encode()))
    try:
        # asyncio.wait leaves the readers running when the time is up: their end of file says the tree is gone
        await bounded(asyncio.wait([asyncio.ensure_future(process.wait()), stdout, stderr]), timeout_s, "the agent")
    finally:
        await confined.stop(process)
        await asyncio.wait([stdout, stderr], timeout=STOP_GRACE_S)
        for reader in (writer, stdout, stderr):
            reader.cancel()
    if process.returncode != 0:
        tail = bytes(stderr.result().data).decode(errors="replace")[-STDERR_KEPT:]
        raise AgentFailed(f"the agent exited with code {process.returncode}; its stderr ends:\n{tail}")
    return _outcome(stdout.result())


class AgentWorkflow:
    """``async (ctx, task) -> outcome`` like any workflow; owns the run's gateway server."""

    def __init__(self, config: AgentConfig, roles: Mapping[str, RoleConfig]):
        self.config = config
        # a program gets a token of its own episode; an in-process function is the trainer's own code
        self.gateway = GatewayServer(roles, config.host, config.port, sealed=config.command is not None)
        self.function = load_function(config.function, config._config_dir) if config.function else None
        self.warned_no_turns = False
        if self.function is not None and not is_loopback(config.host):
            raise UserError("a `function` agent cannot present its episode's token, which a gateway listening beyond "
                            "loopback requires: keep the default host 127.0.0.1, or run the agent as a `command`",
                            where="workflow.agent.host")
        self.__name__ = "agent"

    async def __call__(self, ctx: EpisodeContext, task: dict) -> dict[str, Any]:
        with self.gateway.episode(ctx) as episode:
            try:
                outcome = await self._run_agent(task, episode)
            except Exception:
                if episode.fatal is None:
                    raise
                outcome = {}  # the agent gave up on a failed turn: that failure is the episode's error
        if episode.fatal is not None:
            raise episode.fatal
        for name, value in episode.metrics:  # checked when posted; recorded here, on the controller's loop
            ctx.metric(name, value)
        for name, count in sorted(episode.ignored.items()):
            ctx.metric(name, count)
        if not ctx.trajectory.turns() and not self.warned_no_turns:
            self.warned_no_turns = True
            notice(NO_TURNS.format(episode=ctx.trajectory.episode_id))
        return {**outcome, "agent_rewards": episode.rewards}

    async def _run_agent(self, task: dict, episode: Episode) -> Mapping[str, Any]:
        base_url = self.gateway.base_url(episode)
        if self.function is None:
            env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": self.gateway.token(episode)}
            return await run_command(self.config.command, task, env, self.config.timeout_s, confinement())
        outcome = await bounded(self.function(dict(task), base_url), self.config.timeout_s, "the agent")
        if not isinstance(outcome, Mapping):
            raise AgentFailed(f"the agent function returned {type(outcome).__name__}, not a dict")
        return outcome
