"""Who a request belongs to: one :class:`Episode` per running episode, or a serving session.

During training the gateway's web server has its own thread and event loop;
an episode's context lives on the controller's loop. Each turn runs on the
loop that owns the context, so the router batches gateway turns with every
other turn of the step exactly as it batches native ``ctx.act`` calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import secrets
import sys
import threading
from collections import Counter
from typing import Any, Callable, Coroutine, Mapping

from unimas.algorithms.credit import clip_reward, is_finite_number
from unimas.config.schema import RoleConfig
from unimas.controller.context import METRIC_NAME, EpisodeContext, PromptTooLong, RequestRefused, UnsupportedControl
from unimas.controller.router import Router
from unimas.gateway.protocol import IGNORED, ChatCall, GatewayError, answer_parts, format_error
from unimas.gateway.responses import IGNORED_HERE, ResponseHistory
from unimas.gateway.tool_calls import called_turn_ids, split_calls
from unimas.output.checkpoints import notice
from unimas.trajectory import GraphTrajectory, TurnNode


def consumed_turns(trajectory: GraphTrajectory, messages: list[dict[str, Any]]) -> list[TurnNode]:
    """Earlier turns whose output the request's messages contain as a whole (not inside a longer word),
    or whose tool calls they send back.

    This is how a gateway turn gets the "consumed" edges a native workflow
    states by passing a node as a template variable: the agent pasted that
    output into this prompt.
    """
    called = called_turn_ids(messages)
    return [turn for turn in trajectory.turns() if is_consumed(turn, messages, called)]


def is_consumed(turn: TurnNode, messages: list[dict[str, Any]], called: set[str]) -> bool:
    """Whether ``messages`` send back ``turn``'s tool calls (``called``: their turn ids) or hold its whole output."""
    if turn.id in called:
        return True
    text = turn.text.strip()
    if not text:
        return False
    pattern = re.compile(r"(?<!\w)" + re.escape(text) + r"(?!\w)")
    return any(pattern.search(message["content"]) for message in messages)


def turn_options(call: ChatCall) -> dict[str, Any]:
    """The generation controls of a request, as ``EpisodeContext.chat`` keywords."""
    return {"tools": call.tools, "stop": call.stop, "response_prefix": call.forced, "token_texts": call.logprobs}


def check_answer(turn: TurnNode, call: ChatCall) -> TurnNode:
    """Record on the turn how its answer misses the request's ``response_format`` or forced ``tool_choice``.

    Nothing is re-sampled: the miss is data for the rewards (``turn.format_error``) and is named in the
    response's ``unimas.format_error``.
    """
    content, calls, _ = answer_parts(turn, bool(call.tools))
    if call.tool_choice is not None and not calls:
        turn.format_error = "tool_choice forced a call, but the answer is not a well-formed <tool_call> block"
    elif call.single_call and len(calls) > 1:
        turn.format_error = (f"parallel_tool_calls is false, but the answer made {len(calls)} calls: only the first "
                             "was returned")
    else:
        turn.format_error = format_error(content, call.response_format)
    return turn


def sampling_overrides(call: ChatCall, role: str, spec: RoleConfig) -> dict[str, float]:
    """The request's ``temperature`` / ``top_p`` as generation overrides of a training episode's turn.

    A role whose turns are never trained (``trainable: false``) samples as each request asks. A trained role's
    update assumes its turns were sampled from its own settings: a value equal to them is applied (it changes
    nothing), any other is refused by name rather than silently replaced.
    """
    if not call.sampling:
        return {}
    if not spec.trainable:
        return dict(call.sampling)
    for name, value in call.sampling.items():
        own = getattr(spec.generation, name)
        if abs(value - own) > 1e-9:
            raise GatewayError(400, f"'{name}' is {value:g}, but role '{role}' is trained on turns sampled at its own "
                                    f"{name} {own:g} (roles.{role}.generation.{name}): send {own:g} or leave '{name}' "
                                    f"out, or set roles.{role}.trainable: false to sample each request as it asks",
                               param=name)
    return {}


def _call_key(call: dict[str, Any]) -> tuple[str, str]:
    """A tool call as a chat template renders it: its name and its arguments as a JSON value (not their spacing,
    key order or call id, which are the client's encoding, not the model's words)."""
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass  # not JSON: compared as the text it is
    return str(function.get("name")), json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def edited_answer(turn: TurnNode, message: dict[str, Any]) -> str | None:
    """What differs between the assistant ``message`` an agent sent in place of ``turn``'s answer and what ``turn``
    sampled ("its tool calls", "its text"), or None when it is that answer.

    Compared as the chat template would render them: the tool calls by name and arguments (:func:`_call_key`), the
    text without surrounding whitespace (the gateway strips it off an answer with calls; clients and templates often
    trim it). Only then may the sampled ids stand for the message in a continued prompt.
    """
    content, calls = split_calls(turn.text, turn.id) if turn.tools else (turn.text, [])
    if [_call_key(c) for c in message.get("tool_calls") or []] != [_call_key(c) for c in calls]:
        return "its tool calls"
    if (message.get("content") or "").strip() != (content or "").strip():
        return "its text"
    return None


def rerender_reason(trajectory: GraphTrajectory, call: ChatCall) -> str:
    """Why the role's previous turn must not be continued although the messages extend its conversation: the
    agent changed that turn's answer (empty: it did not, or the messages do not extend it, which the group sees)."""
    own = trajectory.turns(call.role)
    previous = own[-1] if own and own[-1].prompt_ids and own[-1].messages else None
    if previous is None:
        return ""
    at = len(previous.messages)
    messages = call.messages
    if not (len(messages) > at + 1 and messages[at].get("role") == "assistant"
            and list(messages[:at]) == list(previous.messages)):
        return ""
    what = edited_answer(previous, messages[at])
    if what is None:
        return ""
    return (f"messages[{at}] differs from what {previous.id} sampled ({what}): the agent's version is rendered, "
            "not replaced by the sampled ids")


class IgnoredFields:
    """Per run: the request fields the gateway accepted without effect, each (role, field) printed once.

    Counted per episode (:meth:`Episode.chat`) as the metric ``gateway.ignored.<role>.<field>`` (logged as
    ``workflow/...``: docs/gateway.md); fields the gateway does not know share the name ``unknown_fields``, so a
    client sending many odd names makes one metric and one console line per role, not one per name.
    """

    def __init__(self) -> None:
        self._printed: set[str] = set()
        self._lock = threading.Lock()

    @staticmethod
    def metric(role: str, name: str) -> str:
        known = name if name in IGNORED or name in IGNORED_HERE else "include" if name.startswith("include[") \
            else "unknown_fields"
        return f"gateway.ignored.{re.sub(r'[^A-Za-z0-9_.-]', '_', role)[:24]}.{known}"

    def report(self, role: str, ignored: Mapping[str, str]) -> list[str]:
        """The metric names of ``ignored``; prints each (role, metric) the first time the run sees it."""
        names = []
        for name, why in ignored.items():
            metric = self.metric(role, name)
            names.append(metric)
            with self._lock:
                first = metric not in self._printed
                self._printed.add(metric)
            if first:
                notice(f"gateway: requests for role '{role}' set '{name}', which has no effect ({why}); counted "
                       f"per step as workflow/{metric} (printed once per run)")
        return names


Progress = Callable[[str, str], None]
"""``(turn id, text so far)`` while a streamed turn is sampled (:class:`~unimas.gateway.streaming.TurnStream`)."""


def refused_messages(exc: RequestRefused) -> GatewayError:
    return GatewayError(400, f"the request's messages cannot be rendered: {exc}", param="messages",
                        code="invalid_messages")


def refused_control(exc: UnsupportedControl) -> GatewayError:
    field = "tool_choice" if exc.control == "response_prefix" else exc.control
    return GatewayError(400, f"'{field}' cannot be honoured: {exc}; leave '{field}' out for this role",
                        param=field)


class Episode:
    """One episode's door: its context, the rewards its agent posted, and whether it is still open."""

    def __init__(self, context: EpisodeContext, roles: Mapping[str, RoleConfig], loop: asyncio.AbstractEventLoop,
                 ignored: IgnoredFields | None = None):
        """``ignored``: the run's record of ignored fields (a fresh one when None)."""
        readable = re.sub(r"[^A-Za-z0-9_.-]", "_", context.trajectory.episode_id)[:48]
        self.key = f"{readable}-{secrets.token_hex(6)}"
        """The path segment of its base URL: unguessable, so one episode cannot address another."""
        self.context = context
        self.roles = roles
        self.loop = loop
        self.open = True
        self.rewards: dict[str, int | float] = {}
        """Turn id -> reward the agent posted for it (a finite number, not yet clipped)."""
        self.metrics: list[tuple[str, float]] = []
        """(name, value) of each metric the agent posted, in order (``POST .../v1/metrics``)."""
        self.responses = ResponseHistory()
        """The conversations of this episode's Responses API answers, for ``previous_response_id``."""
        self.ignored_fields = ignored or IgnoredFields()
        self.ignored: Counter[str] = Counter()
        """Metric name (:meth:`IgnoredFields.metric`) -> how often this episode's requests set that field."""
        self.fatal: BaseException | None = None
        """A failure that is not the agent's request's fault (a model group error): re-raised by the workflow."""
        self._inflight: set[concurrent.futures.Future] = set()

    def close(self) -> None:
        """No more requests; turns still generating are cancelled, so nothing is added to a finished episode."""
        self.open = False
        for future in list(self._inflight):
            future.cancel()

    async def _on_episode_loop(self, work: Coroutine[Any, Any, TurnNode]) -> TurnNode:
        """Run ``work`` on the controller's loop (the web server has its own thread and loop)."""
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        self._inflight.add(future)
        if not self.open:  # closed on the controller's thread since chat() looked: close() may have missed it
            future.cancel()
        try:
            return await asyncio.wrap_future(future)
        finally:
            self._inflight.discard(future)

    async def chat(self, call: ChatCall, progress: Progress | None = None) -> TurnNode:
        if not self.open:
            raise GatewayError(404, "this episode has finished; its base URL takes no more requests",
                               code="episode_finished")
        self.ignored.update(self.ignored_fields.report(call.role, call.ignored))
        spec = self.roles[call.role]
        limit = spec.generation.max_new_tokens
        overrides = {"max_new_tokens": min(call.overrides.get("max_new_tokens", limit), limit),
                     **sampling_overrides(call, call.role, spec)}
        try:
            return check_answer(await self._on_episode_loop(self._turn(call, overrides, progress)), call)
        except UnsupportedControl as exc:
            raise refused_control(exc) from None
        except PromptTooLong as exc:
            self.fatal = self.fatal or exc
            raise GatewayError(400, str(exc), code="context_length_exceeded") from None
        except RequestRefused as exc:  # the episode fails with the message; the run and the other episodes go on
            self.fatal = self.fatal or exc
            raise refused_messages(exc) from None
        except asyncio.CancelledError:
            if self.open:  # this request itself was cancelled (the server stops): there is nobody to answer
                raise
            raise GatewayError(404, "this episode finished while its turn was generated (its agent returned or ran "
                                    "out of time): the turn was dropped", code="episode_finished") from None
        except Exception as exc:  # noqa: BLE001 - reported to the agent, raised again by the episode's workflow
            self.fatal = self.fatal or exc
            raise GatewayError(500, f"the turn could not be generated: {type(exc).__name__}: {exc}",
                               code="generation_failed") from None

    async def _turn(self, call: ChatCall, overrides: dict[str, Any], progress: Progress | None) -> TurnNode:
        """On the episode's loop, so the graph is read and extended by one thread only.

        The loop is every episode's: each earlier turn costs a scan of the messages (up to the body limit), so the
        loop is handed back after each one, and an agent with many turns and huge messages slows the others
        rather than stalling them until all its scans are done.
        """
        called = called_turn_ids(call.messages)
        after = []
        for turn in self.context.trajectory.turns():
            if is_consumed(turn, call.messages, called):
                after.append(turn)
            await asyncio.sleep(0)
        return await self.context.chat(call.role, call.messages, after=after, progress=progress,
                                       fresh=rerender_reason(self.context.trajectory, call), **turn_options(call),
                                       **overrides)

    def post_reward(self, body: dict[str, Any]) -> dict[str, Any]:
        """Record ``{"turn": <turn or completion id>, "reward": <number>}`` for one of this episode's turns."""
        if not self.open:
            raise GatewayError(404, "this episode has finished; rewards must be posted while it runs",
                               code="episode_finished")
        turn = str(body.get("turn", "")).removeprefix("chatcmpl-").removeprefix(f"{self.key}:")
        reward = body.get("reward")
        if not is_finite_number(reward):
            raise GatewayError(400, "'reward' must be a finite number (values beyond ±1e6 are clipped when "
                                    "credited)", param="reward")
        known = {t.id for t in self.context.trajectory.turns()}
        if turn not in known:
            raise GatewayError(400, f"'turn' must be the id of one of this episode's turns (the completion id also "
                                    f"works): one of {', '.join(sorted(known)) or 'none yet'}", param="turn")
        self.rewards[turn] = reward  # as posted: credit clips it, counts it and records the original
        counted, clipped = clip_reward(reward)
        return {"turn": turn, "reward": counted, "clipped": clipped}

    def post_metric(self, body: dict[str, Any]) -> dict[str, Any]:
        """Record ``{"name": <metric name>, "value": <number>}``: the agent's ``ctx.metric`` (``workflow/<name>``).

        Checked here, by the rules of :meth:`EpisodeContext.metric`, so that a bad name or value is a 400 for
        this request rather than a failed episode; kept on the episode and handed to its context when the agent
        is done (this runs on the web server's thread, not the controller's).
        """
        if not self.open:
            raise GatewayError(404, "this episode has finished; metrics must be posted while it runs",
                               code="episode_finished")
        name, value = body.get("name"), body.get("value")
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            raise GatewayError(400, "'name' must be 1 to 64 letters, digits, '_', '.' or '-' (it is logged as "
                                    "workflow/<name>)", param="name")
        if not is_finite_number(value) or abs(value) > sys.float_info.max:  # an int past float range is no metric
            raise GatewayError(400, "'value' must be a finite number", param="value")
        self.metrics.append((name, float(value)))
        return {"name": name, "value": float(value)}


class Serving:
    """``unimas serve``: every request is a one-turn episode of its own, sampled as the request asks."""

    def __init__(self, roles: Mapping[str, RoleConfig], router: Router):
        self.roles = roles
        self.router = router
        self.served = 0
        self.responses = ResponseHistory()
        self.ignored_fields = IgnoredFields()

    async def chat(self, call: ChatCall, progress: Progress | None = None) -> TurnNode:
        self.served += 1
        self.ignored_fields.report(call.role, call.ignored)
        trajectory = GraphTrajectory(episode_id=f"serve-{self.served}", task_id="serve")
        context = EpisodeContext(trajectory, self.roles, self.router, tools={})
        limit = self.roles[call.role].generation.max_new_tokens  # a request may lower it, never raise it
        overrides = {**call.overrides, "max_new_tokens": min(call.overrides.get("max_new_tokens", limit), limit)}
        try:
            return check_answer(await context.chat(call.role, call.messages, progress=progress, **turn_options(call),
                                                   **overrides), call)
        except UnsupportedControl as exc:
            raise refused_control(exc) from None
        except PromptTooLong as exc:
            raise GatewayError(400, str(exc), code="context_length_exceeded") from None
        except RequestRefused as exc:
            raise refused_messages(exc) from None
        except Exception as exc:  # noqa: BLE001 - one failed request never stops the server
            raise GatewayError(500, f"the turn could not be generated: {type(exc).__name__}: {exc}",
                               code="generation_failed") from None
