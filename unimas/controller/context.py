"""The episode context a workflow talks to.

``ctx.act(role, **vars)`` renders the role's template, sends one generation
request to the role's model group through the router, parses the output and
records a turn node; passing an earlier turn or tool node as a variable both
inserts its text and records the "consumed" edge. ``ctx.tool(name, **args)``
runs a registered tool and records a tool node. Python and graph workflows go
through these same two calls, so both produce the same graph trajectory.
``ctx.metric(name, value)`` records a number of the workflow's own, logged per
step as ``workflow/<name>`` (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import functools
import math
import numbers
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from unimas.config.schema import RoleConfig, WorkflowConfig
from unimas.controller.conversation import conversation
from unimas.controller.router import Router
from unimas.controller.timeouts import call_with_timeout, cancelled_from_outside
from unimas.errors import ParseError, UserError, describe, exception_text
from unimas.groups.base import Continuation, GenRequest
from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode
from unimas.workflow.templates import render

if TYPE_CHECKING:
    from unimas.controller.specs import ReplayPrefix

METRIC_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A ``ctx.metric`` name: no ``/``, so ``workflow/<name>`` and ``workflow/<name>/count`` never collide."""


def workflow_label(workflow: WorkflowConfig) -> str:
    """How errors name the run's workflow: ``workflow 'signalling'``, or its kind when it has no name."""
    if workflow.name is not None:
        return f"workflow '{workflow.name}'"
    return "the graph workflow" if workflow.graph is not None else "the agent workflow"


def node_value(value: Any) -> Any:
    """What a node contributes when used as a template variable."""
    if isinstance(value, TurnNode):
        return value.parsed if value.parsed is not None else value.text
    if isinstance(value, ToolNode):
        return value.result if value.error is None else f"error: {value.error}"
    return value


class EpisodeContext:
    """A workflow's handle on its episode: ``act`` for role turns, ``tool`` for tool calls.

    ``trajectory`` is the graph being recorded and ``task`` the dataset row;
    ``workflow`` names the workflow in errors.
    """

    def __init__(
        self,
        trajectory: GraphTrajectory,
        roles: Mapping[str, RoleConfig],
        router: Router,
        tools: Mapping[str, Callable[..., Any]],
        greedy: bool = False,
        tool_timeout_s: float = 60.0,
        parsers: Mapping[str, Callable[[str], Any]] | None = None,
        prefix: "ReplayPrefix | None" = None,
        workflow: str = "the workflow",
    ):
        self.trajectory = trajectory
        self.task = trajectory.task
        self._roles = roles
        self._router = router
        self._tools = tools
        self._greedy = greedy
        self._tool_timeout_s = tool_timeout_s
        self._parsers = parsers or {}
        self._prefix = prefix
        """A fork's recorded turns: ``act`` returns them instead of sampling (token-exact replay)."""
        self._role_counts: dict[str, int] = {}
        self._tool_counts: dict[str, int] = {}
        self._workflow = workflow

    def metric(self, name: str, value: float) -> None:
        """Record one number of the workflow's own for this episode, e.g. ``ctx.metric("rounds", 3)``.

        Each step logs ``workflow/<name>``: the mean over the step's episodes
        that recorded it (an episode that records it several times counts with
        the mean of its values), and ``workflow/<name>/count``: how many episodes
        did (``eval/workflow/...`` for evaluations). A name outside
        :data:`METRIC_NAME` or a value that is not a finite real number raises
        :class:`WorkflowMetricError`, which fails this episode like any bug in
        the workflow, with the metric and the workflow named.
        """
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            raise WorkflowMetricError(f"ctx.metric({_short(name)}, ...) in {self._workflow}: a metric name is 1 to 64 "
                                      "letters, digits, '_', '.' or '-' (no '/'; it is logged as workflow/<name>)")
        try:
            number = float(value) if isinstance(value, numbers.Real) else math.nan
        except OverflowError:  # an int past float range
            number = math.inf
        if not math.isfinite(number):
            raise WorkflowMetricError(f"ctx.metric({name!r}, {_short(value)}) in {self._workflow}: the value must be a "
                                      "finite real number")
        self.trajectory.metrics.setdefault(name, []).append(number)

    def _consumed(self, after: Iterable[Any], values: Mapping[str, Any]) -> list[str]:
        ids = [n.id if isinstance(n, (TurnNode, ToolNode)) else str(n) for n in after]
        ids += [v.id for v in values.values() if isinstance(v, (TurnNode, ToolNode))]
        return list(dict.fromkeys(ids))

    async def act(self, role: str, *, after: Iterable[Any] = (), **variables: Any) -> TurnNode:
        if role not in self._roles:
            raise UserError(f"workflow asked for role '{role}', which the config does not declare", where="roles")
        spec = self._roles[role]
        values = {**self.task, **{k: node_value(v) for k, v in variables.items()}} if variables else self.task
        try:
            user_text = render(spec.template, values)
        except KeyError as missing:
            raise UserError(f"template of role '{role}' needs variable {missing}, which the workflow did not pass",
                            where=f"roles.{role}.template") from None
        earlier = self.trajectory.turns() if spec.memory != "none" else ()  # a one-shot role reads no history
        messages, continuation, seen = conversation(role, spec, user_text, earlier)
        index = self._role_counts.get(role, 0)
        self._role_counts[role] = index + 1
        generation = spec.eval_generation if (self._greedy and spec.eval_generation) else spec.generation
        prompt = "".join([m["content"] for m in messages])
        request = GenRequest(prompt=prompt, generation=generation, adapter=spec.adapter, greedy=self._greedy,
                             messages=messages, continuation=continuation, use_chat_template=spec.chat != "off",
                             allow_truncation=spec.truncation == "left")
        started = time.perf_counter()
        replayed = self._prefix.result_for(f"{role}#{index}", user_text) if self._prefix is not None else None
        result = replayed or await self._router.submit(spec.model, request, episode=self.trajectory.episode_id)
        if result.error:
            raise RequestRefused(f"role '{role}': {result.error}")
        node = TurnNode(
            id=f"{role}#{index}", role=role, model_group=spec.model, prompt=result.prompt_text or prompt,
            text=result.text, input=user_text, messages=messages if spec.memory != "none" else [],
            prompt_ids=result.prompt_ids, response_ids=result.response_ids, logprobs=result.logprobs,
            logprobs_exact=result.logprobs_exact, continued=result.continued, truncated=result.truncated,
            finished=result.finished, role_turn_index=index, started=started, ended=time.perf_counter(),
            weight_version=result.weight_version, replayed=replayed is not None, rerendered=result.rerendered or None,
        )
        self.trajectory.add_node(node, self._consumed([*after, *seen], variables) if after or seen or variables else ())
        if node.truncated and spec.truncation == "error":
            raise PromptTooLong(f"the prompt of role '{role}' ({len(node.prompt_ids)} tokens) does not fit model "
                                f"group '{spec.model}' (roles.{role}.truncation: error)")
        _parse(node, spec, self._parsers.get(role))
        return node

    async def chat(self, role: str, messages: list[dict[str, Any]], *, after: Iterable[Any] = (),
                   tools: list[dict[str, Any]] | None = None, stop: list[str] | None = None,
                   response_prefix: str = "", token_texts: bool = False,
                   progress: Callable[[str, str], None] | None = None, fresh: str = "", **overrides: Any) -> TurnNode:
        """A role turn on chat messages written by someone else (the OpenAI gateway's agents).

        Unlike ``act`` there is no template and no ``memory``: the messages are
        the whole prompt. ``overrides`` replace ``generation`` fields for this
        turn (e.g. ``max_new_tokens``); ``after`` names the turns it consumed;
        ``tools``: function definitions for the chat template. ``stop``: stop
        strings; ``response_prefix``: text forced at the start of the answer
        (prompt-side ids, recorded as ``forced_ids``); ``token_texts``: record
        each response token's text. A group that does not apply ``stop`` or
        ``response_prefix`` raises :class:`UnsupportedControl`. ``progress``:
        called as ``progress(turn_id, text_so_far)`` while the answer is sampled
        (``GenRequest.progress``; never by a group that cannot stream). Messages
        the group cannot render raise :class:`RequestRefused`.
        The role's previous turn is offered as the continuation, which the
        group uses only when these messages extend that conversation under
        the same tool list (otherwise the turn says why in ``rerendered``).
        ``fresh``: why it must not be offered although the messages extend it
        (the gateway found the previous answer edited); recorded as ``rerendered``.
        """
        if role not in self._roles:
            raise UserError(f"a request asked for role '{role}', which the config does not declare", where="roles")
        spec = self._roles[role]
        index = self._role_counts.get(role, 0)
        self._role_counts[role] = index + 1
        generation = spec.eval_generation if (self._greedy and spec.eval_generation) else spec.generation
        generation = generation.model_copy(update=overrides) if overrides else generation
        own = self.trajectory.turns(role)
        previous = own[-1] if own and own[-1].prompt_ids and own[-1].messages and not fresh else None
        continuation = None if previous is None else Continuation(
            messages=previous.messages, prompt_ids=previous.prompt_ids, response_ids=previous.response_ids,
            finished=previous.finished, tools=previous.tools)
        prompt = "".join(m["content"] for m in messages)
        request = GenRequest(prompt=prompt, generation=generation, adapter=spec.adapter, greedy=self._greedy,
                             messages=messages, continuation=continuation, use_chat_template=spec.chat != "off",
                             allow_truncation=spec.truncation == "left", tools=tools, stop=stop,
                             response_prefix=response_prefix, token_texts=token_texts,
                             progress=None if progress is None else functools.partial(progress, f"{role}#{index}"))
        started = time.perf_counter()
        result = await self._router.submit(spec.model, request, episode=self.trajectory.episode_id)
        if result.error:
            raise RequestRefused(result.error)
        for control, asked in (("stop", bool(stop)), ("response_prefix", bool(response_prefix))):
            if asked and control not in result.controls:
                raise UnsupportedControl(control, spec.model)
        user_inputs = [m["content"] for m in messages if m["role"] == "user"]
        node = TurnNode(
            id=f"{role}#{index}", role=role, model_group=spec.model, prompt=result.prompt_text or prompt,
            text=response_prefix + result.text, input=user_inputs[-1] if user_inputs else "", messages=messages,
            prompt_ids=result.prompt_ids, response_ids=result.response_ids, logprobs=result.logprobs,
            logprobs_exact=result.logprobs_exact, continued=result.continued, truncated=result.truncated,
            finished=result.finished, role_turn_index=index, started=started, ended=time.perf_counter(),
            weight_version=result.weight_version, rerendered=result.rerendered or fresh or None, tools=tools,
            forced_ids=result.forced_ids, stop=result.stop, token_texts=result.token_texts,
        )
        self.trajectory.add_node(node, self._consumed(after, {}))
        if node.truncated and spec.truncation == "error":
            raise PromptTooLong(f"the prompt of role '{role}' ({len(node.prompt_ids)} tokens) does not fit model "
                                f"group '{spec.model}' (roles.{role}.truncation: error)")
        _parse(node, spec, self._parsers.get(role))
        return node

    async def tool(self, name: str, *, after: Iterable[Any] = (), **arguments: Any) -> ToolNode:
        if name not in self._tools:
            raise UserError(f"workflow called tool '{name}', which no plugin provides", where="workflow")
        index = self._tool_counts.get(name, 0)
        self._tool_counts[name] = index + 1
        plain = {k: node_value(v) for k, v in arguments.items()}
        node = ToolNode(id=f"tool:{name}#{index}", tool=name, arguments=plain, started=time.perf_counter())
        try:
            node.result = await call_with_timeout(self._tools[name], plain, self._tool_timeout_s)
        except asyncio.CancelledError as exc:
            if cancelled_from_outside():  # the episode's time limit, or the step being stopped
                raise
            node.error = exception_text(exc)  # the tool raised it itself: a failing tool, like any other
        except (Exception, SystemExit, GeneratorExit) as exc:  # noqa: BLE001 - a failing tool is data, not a crash
            node.error = exception_text(exc)
        node.ended = time.perf_counter()
        return self.trajectory.add_node(node, self._consumed(after, arguments))


def _short(value: Any) -> str:
    """``repr(value)`` for an error message, or its type when that is long."""
    shown = repr(value)
    return shown if len(shown) <= 40 else f"<a {type(value).__name__}>"


class WorkflowMetricError(ValueError):
    """``ctx.metric`` got a bad name or value: the workflow's bug, so its episode fails (the run goes on)."""


class UnsupportedControl(RuntimeError):
    """A turn asked for a generation control (stop strings, a forced answer opening) its group does not apply."""

    def __init__(self, control: str, group: str):
        super().__init__(f"model group '{group}' does not apply '{control}' (its backend lacks it; the torch "
                         "backend has it)")
        self.control = control


class RequestRefused(RuntimeError):
    """The model group could not serve this turn's request (``GenResult.error``: its messages made the chat
    template or the tokenizer fail) although the group is fine: this episode fails with the message, the
    others of the batch go on."""


class PromptTooLong(RuntimeError):
    """A role's prompt exceeds its model's context and the role does not allow cutting it: its episode fails."""


def _parse(node: TurnNode, spec: RoleConfig, parse: Callable[[str], Any] | None) -> None:
    """Fill ``parsed``/``parse_error``: bad output is recorded, never raised (a buggy parser's error too)."""
    if spec.generation.require_eos and not (node.finished or node.stop):
        node.parse_error = f"no end-of-sequence within {spec.generation.max_new_tokens} tokens"
        return
    if parse is None:
        node.parsed = node.text.strip()
        return
    try:
        node.parsed = parse(node.text)
    except ParseError as exc:
        node.parse_error = str(exc)
    except (Exception, GeneratorExit) as exc:  # noqa: BLE001 - a parser plugin's bug is recorded like a parse failure
        node.parse_error = f"parser {spec.parser.name!r} failed: {describe(exc)}"
