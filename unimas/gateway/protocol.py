"""The OpenAI chat-completions wire format: request checking, responses and error bodies.

Requests are checked by hand rather than by a pydantic model so that every
refusal is one OpenAI-style error naming the offending field, which the
``openai`` client raises as ``BadRequestError`` / ``NotFoundError`` with
that message — an agent author sees what to fix, and the run carries on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from unimas.gateway.errors import GatewayError
from unimas.gateway.tool_calls import assistant_calls, parse_tools, split_calls
from unimas.trajectory import TurnNode

MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""Larger bodies are refused with 413 before they are parsed."""

MESSAGE_ROLES = {"system", "developer", "user", "assistant", "tool"}
UNSUPPORTED = {
    "functions": "function definitions are not supported",
    "stop": "stop sequences would cut the sampled tokens the turn is trained on",
}


@dataclass
class ChatCall:
    """One checked ``/chat/completions`` request."""

    role: str
    messages: list[dict[str, Any]]
    overrides: dict[str, Any] = field(default_factory=dict)
    """Generation fields the request sets: ``max_new_tokens`` always; sampling ones only where honoured."""
    stream: bool = False
    """Answer as server-sent events (the whole turn in one chunk: it is generated as one batch item)."""
    tools: list[dict[str, Any]] | None = None
    """Function definitions for the chat template; the answer's ``<tool_call>`` blocks become ``tool_calls``."""


def parse_json(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_REQUEST_BYTES:
        raise GatewayError(413, f"request body of {len(raw)} bytes is over the gateway's limit of "
                                f"{MAX_REQUEST_BYTES}", code="request_too_large")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise GatewayError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def parse_chat(body: dict[str, Any], roles: set[str], sampling: bool) -> ChatCall:
    """Check a chat request; ``sampling``: honour temperature / top_p (serving, not training)."""
    role = body.get("model")
    if not isinstance(role, str) or not role:
        raise GatewayError(400, "'model' must name a role: one of " + ", ".join(sorted(roles)), param="model")
    if role not in roles:
        raise GatewayError(404, f"the model '{role}' does not exist: 'model' names a role of this run, one of "
                                f"{', '.join(sorted(roles))}", code="model_not_found", param="model")
    for name, why in UNSUPPORTED.items():
        if body.get(name) not in (None, False, []):
            raise GatewayError(400, f"'{name}' is not supported by the unimas gateway: {why}", param=name)
    if body.get("n", 1) != 1:
        raise GatewayError(400, "'n' must be 1: each request is one turn", param="n")
    overrides: dict[str, Any] = {}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise GatewayError(400, "'max_tokens' must be a positive integer", param="max_tokens")
        overrides["max_new_tokens"] = limit
    if sampling:
        for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 1e-6, 1.0)):
            value = body.get(name)
            if value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
                raise GatewayError(400, f"'{name}' must be a number in [{low:g}, {high:g}]", param=name)
            overrides[name] = float(value)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise GatewayError(400, "'stream' must be true or false", param="stream")
    return ChatCall(role, _messages(body.get("messages")), overrides, stream=bool(stream), tools=parse_tools(body))


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise GatewayError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
    messages = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in MESSAGE_ROLES:
            raise GatewayError(400, f"{where} must be an object whose 'role' is one of "
                                    f"{', '.join(sorted(MESSAGE_ROLES))}", param=where)
        role = "system" if message["role"] == "developer" else message["role"]
        if role == "assistant" and message.get("tool_calls"):
            content = message.get("content")
            messages.append({"role": role, "content": "" if content is None else _text(content, where),
                             "tool_calls": assistant_calls(message, where)})
            continue
        converted = {"role": role, "content": _text(message.get("content"), where)}
        if role == "tool" and message.get("tool_call_id") is not None:
            converted["tool_call_id"] = str(message["tool_call_id"])
        messages.append(converted)
    return messages


def _text(content: Any, where: str) -> str:
    """A message's content as one string; a list of parts may hold only text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(part["text"] for part in content)
    raise GatewayError(400, f"{where}.content must be a string or a list of text parts", param=f"{where}.content")


def completion(turn: TurnNode, completion_id: str, tools: bool = False) -> dict[str, Any]:
    """The chat.completion object for a recorded turn; ``tools``: read tool calls out of its text."""
    content, calls = split_calls(turn.text, turn.id) if tools else (turn.text, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else "stop" if turn.finished else "length"
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": turn.role,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(turn.response_ids),
                  "total_tokens": len(turn.prompt_ids) + len(turn.response_ids)},
    }


def stream_events(done: dict[str, Any]) -> Iterator[str]:
    """A finished completion as ``chat.completion.chunk`` server-sent events: the text, the finish, ``[DONE]``."""
    choice = done["choices"][0]
    head = {key: done[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    delta = dict(choice["message"])
    if "tool_calls" in delta:  # streamed calls carry their position
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    chunks = [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
         "usage": done["usage"]},
    ]
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def model_list(roles: list[str]) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": role, "object": "model", "created": 0, "owned_by": "unimas"}
                                       for role in roles]}
