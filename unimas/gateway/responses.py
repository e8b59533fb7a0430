"""The OpenAI Responses API (``POST .../v1/responses``) mapped onto the same turns as chat completions.

A Responses request is turned into a :class:`~unimas.gateway.protocol.ChatCall`
(``instructions`` -> the system message; ``input`` items -> chat messages:
``function_call`` items -> an assistant message's ``tool_calls``,
``function_call_output`` -> a ``tool`` message; flat function ``tools`` ->
chat tools), generated as one turn of the role named by ``model``, and
answered as a ``response`` object whose ``output`` holds a ``message`` item
and one ``function_call`` item per call. So the OpenAI Agents SDK, whose
default model calls this API, trains like any chat client.

``previous_response_id``: the session keeps every response's whole
conversation (its input messages and its answer), so a request that names an
earlier response continues that conversation — the same messages a chat
client would have sent, hence the same token-exact continuation of the
role's ids. Streaming sends the usual event sequence, the text deltas as the
turn is sampled (:mod:`unimas.gateway.streaming`).
"""

from __future__ import annotations

import json
import sys
import time
from collections import OrderedDict
from typing import Any, AsyncIterator, Callable, Iterator

from unimas.gateway.errors import GatewayError
from unimas.gateway.protocol import (
    ChatCall,
    answer_parts,
    generation_overrides,
    ignored_fields,
    parse_parallel_tool_calls,
    parse_role,
    parse_stop,
    sampling_fields,
    streamed_content,
    token_logprobs,
    unimas_notes,
)
from unimas.gateway.streaming import TurnStream
from unimas.gateway.tool_calls import assistant_calls, parse_tools
from unimas.trajectory import TurnNode

HANDLED = {"model", "input", "instructions", "tools", "tool_choice", "previous_response_id", "max_output_tokens",
           "stream", "temperature", "top_p", "text", "include", "stop", "parallel_tool_calls"}
IGNORED_HERE = {
    "truncation": "a prompt too long for the context follows the role's truncation setting",
    "prompt_cache_key": "no effect on generation", "prompt_cache_retention": "no effect on generation",
    "background": "every response is answered when it is generated",
}
REFUSED_HERE = {
    "conversation": "conversation objects are not kept: send previous_response_id or the whole input",
    "prompt": "stored prompts are not kept: send instructions and input",
}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
KEPT_RESPONSES = 1024
"""Responses a session remembers for ``previous_response_id`` (the oldest are forgotten first)."""
KEPT_BYTES = 64 * 2**20
"""Memory a session's remembered conversations may hold together (their strings as Python stores them, and each
message's own size). Each holds its whole history, so a client growing one conversation by 4 MiB requests (the
body limit) would otherwise keep gigabytes in ``unimas serve``, whose one session serves every client; the oldest
are forgotten first. Counted in bytes, not characters: a character outside Latin-1 takes 2 or 4 bytes, and a bound
on characters let 300 concurrent requests of such text keep hundreds of MB."""


def held_bytes(conversation: list[dict[str, Any]]) -> int:
    """What the strings of a remembered conversation hold in memory (messages shared with another conversation are
    counted in each: the bound is never exceeded, only reached sooner)."""
    total = 0
    for message in conversation:
        total += sys.getsizeof(message)
        total += sum(sys.getsizeof(value) for value in message.values() if isinstance(value, str))
        for call in message.get("tool_calls") or []:
            total += sys.getsizeof(json.dumps(call))  # the arguments as JSON: about what the parsed object holds
    return total


class ResponseHistory:
    """Per session: response id -> the whole conversation up to and including that response's answer."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.bytes = 0
        """What the remembered conversations hold (:func:`held_bytes`), at most :data:`KEPT_BYTES` after a keep."""

    def conversation(self, response_id: Any) -> list[dict[str, Any]]:
        if response_id is None:
            return []
        if not isinstance(response_id, str) or response_id not in self._kept:
            raise GatewayError(400, f"'previous_response_id' {response_id!r} is not a response of this episode "
                                    "(responses are kept while the episode runs): send the whole input instead",
                               param="previous_response_id", code="previous_response_not_found")
        return list(self._kept[response_id])

    def keep(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        self._forget(response_id)
        self._kept[response_id] = conversation
        self._sizes[response_id] = held_bytes(conversation)
        self.bytes += self._sizes[response_id]
        while len(self._kept) > KEPT_RESPONSES or (self.bytes > KEPT_BYTES and len(self._kept) > 1):
            self._forget(next(iter(self._kept)))

    def _forget(self, response_id: str) -> None:
        if response_id in self._kept:
            del self._kept[response_id]
            self.bytes -= self._sizes.pop(response_id)


def parse_responses(body: dict[str, Any], roles: set[str], sampling: bool, history: ResponseHistory) -> ChatCall:
    """Check a Responses request and turn it into the chat call of the same turn."""
    role = parse_role(body, roles)
    for name, why in REFUSED_HERE.items():
        if body.get(name) is not None:
            raise GatewayError(400, f"'{name}' is not supported by the unimas gateway: {why}", param=name)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise GatewayError(400, "'stream' must be true or false", param="stream")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise GatewayError(400, "'instructions' must be a string", param="instructions")
    # an earlier response's instructions are not carried over (Responses semantics): only its conversation
    messages = history.conversation(body.get("previous_response_id")) + input_messages(body.get("input"))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    if not any(m["role"] != "system" for m in messages):
        raise GatewayError(400, "'input' must be a string or a non-empty list of input items", param="input")
    tools, tool_choice, forced = parse_tools({"tools": chat_tools(body.get("tools")),
                                              "tool_choice": chat_tool_choice(body.get("tool_choice"))})
    include = body.get("include") or []
    if not isinstance(include, list):
        raise GatewayError(400, "'include' must be a list", param="include")
    ignored = ignored_fields(body, HANDLED | set(IGNORED_HERE) | set(REFUSED_HERE))
    ignored.update({name: why for name, why in IGNORED_HERE.items() if body.get(name) is not None})
    ignored.update({f"include[{value}]": "not produced" for value in include if value != LOGPROBS_INCLUDE})
    if body.get("top_logprobs") not in (None, 0):
        raise GatewayError(400, "'top_logprobs' is not supported by the unimas gateway: only the sampled tokens' "
                                f"log-probs are recorded; include {LOGPROBS_INCLUDE!r} without top_logprobs",
                           param="top_logprobs")
    return ChatCall(role, messages, generation_overrides(body, sampling, "max_output_tokens"), stream=bool(stream),
                    tools=tools, stop=parse_stop(body.get("stop")), forced=forced, tool_choice=tool_choice,
                    logprobs=LOGPROBS_INCLUDE in include, response_format=text_format(body.get("text")),
                    ignored=ignored, sampling=sampling_fields(body), single_call=parse_parallel_tool_calls(body))


def input_messages(raw: Any) -> list[dict[str, Any]]:
    """``input`` (a string, or message / function_call / function_call_output items) as chat messages."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise GatewayError(400, "'input' must be a string or a list of input items", param="input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in ("system", "developer", "user", "assistant"):
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
            [converted] = assistant_calls({"tool_calls": [call]}, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(converted)  # the calls of one answer form one message
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [converted]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": _content(item.get("output"), where),
                             "tool_call_id": str(item.get("call_id", ""))})
        else:
            raise GatewayError(400, f"{where} must be a message (role system, developer, user or assistant), a "
                                    "function_call or a function_call_output item", param=where)
    return messages


def _content(content: Any, where: str) -> str:
    """A string, or a list of text parts (input_text / output_text / text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(part["text"] for part in content)
    raise GatewayError(400, f"{where}.content must be a string or a list of text parts", param=f"{where}.content")


def chat_tools(raw: Any) -> list[dict[str, Any]] | None:
    """Flat Responses function tools ``{type, name, description, parameters}`` in the chat form."""
    if raw in (None, []):
        return None
    if not isinstance(raw, list):
        raise GatewayError(400, "'tools' must be a list of function tools", param="tools")
    tools = []
    for i, tool in enumerate(raw):
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("name"), str)):
            raise GatewayError(400, f"tools[{i}] must be a function tool {{type: function, name, parameters}} "
                                    "(built-in tools such as web_search are not available: give the agent a function "
                                    "instead)",
                               param=f"tools[{i}]")
        function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(raw: Any) -> Any:
    if isinstance(raw, dict) and raw.get("type") == "function":
        return {"type": "function", "function": {"name": raw.get("name")}}
    return raw


def text_format(raw: Any) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format`` (checked after generation, see ``format_error``)."""
    if raw is None:
        return None
    spec = raw.get("format") if isinstance(raw, dict) else None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if spec is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(spec.get("schema", {}), dict):
        return {"type": "json_schema", "schema": spec.get("schema", {})}
    raise GatewayError(400, "'text.format.type' must be text, json_object or json_schema", param="text.format")


def output_items(turn: TurnNode, call: ChatCall, response_id: str) -> list[dict[str, Any]]:
    """The response's ``output``: a message item for the text (if any), a function_call item per call."""
    content, calls, _ = answer_parts(turn, bool(call.tools), call.single_call)
    items: list[dict[str, Any]] = []
    if content or not calls:
        part: dict[str, Any] = {"type": "output_text", "text": content or "", "annotations": []}
        if call.logprobs:
            part["logprobs"] = token_logprobs(turn)
        items.append({"type": "message", "id": f"msg-{response_id}", "status": "completed", "role": "assistant",
                      "content": [part]})
    for n, tool_call in enumerate(calls):
        items.append({"type": "function_call", "id": f"fc-{response_id}-{n}", "call_id": tool_call["id"],
                      "name": tool_call["function"]["name"], "arguments": tool_call["function"]["arguments"],
                      "status": "completed"})
    return items


def response_shell(call: ChatCall, response_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` fields that do not depend on the answer (a streamed response opens with them)."""
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "model": call.role,
        "status": "in_progress", "incomplete_details": None, "error": None,
        "instructions": body.get("instructions") or None, "output": [], "output_text": "",
        "parallel_tool_calls": not call.single_call, "previous_response_id": body.get("previous_response_id"),
        "tool_choice": "required" if call.tool_choice == "required" else
        {"type": "function", "name": call.tool_choice} if call.tool_choice else "auto",
        "tools": [{"type": "function", **tool["function"]} for tool in call.tools or []],
        "temperature": None, "top_p": None, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": None, "metadata": {},
    }


def response_object(turn: TurnNode, call: ChatCall, response_id: str, history: ResponseHistory,
                    body: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` for a recorded turn of the request ``body``; its conversation (without the
    instructions) is kept for ``previous_response_id``."""
    output = output_items(turn, call, response_id)
    content, calls, finish = answer_parts(turn, bool(call.tools), call.single_call)
    answer: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if calls:
        answer["tool_calls"] = assistant_calls({"tool_calls": calls}, "output")
    history.keep(response_id, [*call.messages[1 if body.get("instructions") else 0:], answer])
    # `incomplete` only when the client's own max_output_tokens was reached: a client that set no limit (the Agents
    # SDK by default) treats `incomplete` as a failed call, so a cut at the role's limit completes (unimas.cut_off)
    asked = call.overrides.get("max_new_tokens")
    incomplete = finish == "length" and not calls and asked is not None and len(turn.response_ids) >= asked
    return {
        **response_shell(call, response_id, body),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output, "output_text": content or "",
        "usage": {"input_tokens": len(turn.prompt_ids), "output_tokens": len(turn.response_ids),
                  "total_tokens": len(turn.prompt_ids) + len(turn.response_ids),
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        "unimas": unimas_notes(turn, call.ignored),
    }


async def response_events(stream: TurnStream, call: ChatCall, shell: dict[str, Any],
                          response_of: Callable[[TurnNode], dict[str, Any]]) -> AsyncIterator[str]:
    """The response as Responses server-sent events, from ``response.created`` to ``response.completed``.

    The message item opens with the first content sampled and gets an
    ``output_text.delta`` each time the shown text grows; once the turn is
    recorded come the rest of the text, the function calls and the closing
    events. The deltas add up to the recorded answer's text. A turn that
    fails after the stream began ends it with an ``error`` event.
    """
    sequence = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal sequence
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': sequence - 1, **fields})}\n\n"

    message = {"type": "message", "id": f"msg-{shell['id']}", "status": "in_progress", "role": "assistant",
               "content": []}
    text_at = {"item_id": message["id"], "output_index": 0, "content_index": 0}

    def open_message() -> Iterator[str]:
        yield event("response.output_item.added", output_index=0, item=message)
        yield event("response.content_part.added", item_id=message["id"], output_index=0, content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []})

    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    shown = ""
    async for text in stream.texts():
        content = streamed_content(call.forced + text, bool(call.tools))
        if len(content) > len(shown) and content.startswith(shown):
            if not shown:
                for opening in open_message():
                    yield opening
            yield event("response.output_text.delta", **text_at, delta=content[len(shown):], logprobs=[])
            shown = content
    try:
        done = response_of(await stream.turn())
    except GatewayError as exc:
        yield event("error", code=exc.code, message=exc.message, param=exc.param)
        return
    for index, item in enumerate(done["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            if not shown:
                for opening in open_message():
                    yield opening
            rest = part["text"][len(shown):] if part["text"].startswith(shown) else ""
            if rest or not shown or part.get("logprobs"):
                yield event("response.output_text.delta", **text_at, delta=rest, logprobs=part.get("logprobs", []))
            yield event("response.output_text.done", **text_at, text=part["text"], logprobs=part.get("logprobs", []))
            yield event("response.content_part.done", **text_at, part=part)
        else:
            yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                                "arguments": ""})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        arguments=item["arguments"], name=item["name"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed" if done["status"] == "completed" else "response.incomplete", response=done)
