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
from typing import Any, AsyncIterator, Callable

from unimas.gateway.errors import GatewayError
from unimas.gateway.streaming import TurnStream
from unimas.gateway.tool_calls import CALL_OPEN, assistant_calls, parse_tools, split_calls
from unimas.groups.streaming import shown_text
from unimas.trajectory import TurnNode

MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""Larger bodies are refused with 413 before they are parsed."""

MESSAGE_ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOPS = 4

REFUSED = {
    "functions": "the deprecated function definitions: send 'tools' instead",
    "function_call": "the deprecated form of tool_choice: send 'tool_choice' instead",
    "audio": "audio output is not generated: leave 'audio' out",
    "prediction": "predicted outputs are not supported: leave 'prediction' out",
    "web_search_options": "there is no web search: give the agent a search tool instead",
}
"""Fields refused whenever set: each has no meaning for a trained text model (the message says what to do)."""

DISTRIBUTION_FIELDS = {
    "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {},
}
"""Fields that would change the sampling distribution the update assumes: refused unless neutral."""

IGNORED = {
    "seed": "sampling draws from the model group's own seeded generator (the run's seed), so runs resume "
            "bit-identically",
    "user": "no effect on generation", "metadata": "no effect on generation", "store": "nothing is stored",
    "service_tier": "no effect on generation",
    "reasoning_effort": "the role's generation settings govern the answer",
    "stream_options": "the last chunk always carries usage",
}
"""Fields accepted without effect: listed with the reason in the response's ``unimas.ignored``."""

HANDLED = {"model", "messages", "tools", "tool_choice", "stop", "max_tokens", "max_completion_tokens", "stream",
           "temperature", "top_p", "n", "logprobs", "top_logprobs", "response_format", "modalities",
           "parallel_tool_calls"}
SAMPLING_FIELDS = (("temperature", 0.0, 2.0), ("top_p", 1e-6, 1.0))
"""Request fields that set the sampling distribution, with their valid range: honoured where the role's turns are
not trained (and by ``unimas serve``), refused by name where they differ from a trained role's own settings."""


@dataclass
class ChatCall:
    """One checked ``/chat/completions`` request."""

    role: str
    messages: list[dict[str, Any]]
    overrides: dict[str, Any] = field(default_factory=dict)
    """Generation fields the request sets: ``max_new_tokens`` always; sampling ones only where honoured."""
    stream: bool = False
    """Answer as server-sent events, the text as it is sampled (:mod:`unimas.gateway.streaming`)."""
    tools: list[dict[str, Any]] | None = None
    """Function definitions for the chat template; the answer's ``<tool_call>`` blocks become ``tool_calls``."""
    stop: list[str] | None = None
    """Stop strings: sampling ends once the text contains one; the answer's text ends before it."""
    forced: str = ""
    """The answer's forced opening (``tool_choice`` required or named): prompt-side, never trained as sampled."""
    tool_choice: str | None = None
    """``required`` or the forced function's name (None: the model's own choice)."""
    logprobs: bool = False
    """Answer with each token's recorded log-prob (``choices[0].logprobs.content``)."""
    response_format: dict[str, Any] | None = None
    """``json_object`` / ``json_schema``: checked after generation; a miss is the turn's ``format_error``."""
    ignored: dict[str, str] = field(default_factory=dict)
    """Fields accepted without effect, with the reason (answered under ``unimas.ignored``)."""
    sampling: dict[str, float] = field(default_factory=dict)
    """``temperature`` / ``top_p`` as the request set them: the session honours or refuses them per role."""
    single_call: bool = False
    """``parallel_tool_calls: false``: only the answer's first tool call is returned (the rest is a format error)."""


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
    _check_unicode(body)
    return body


def _check_unicode(body: dict[str, Any]) -> None:
    """Refuse a string that is not Unicode text (a lone surrogate such as ``"\\ud800"``), naming its field.

    JSON lets such a string through; the tokenizer, the trajectory file and
    every other UTF-8 encoder behind the gateway would fail on it — for a
    whole batch of episodes at once — so it is refused here, where only the
    request that carries it is answered.
    """
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if _lone_surrogate(key) is not None:
                    shown = key.encode("utf-8", "backslashreplace").decode()
                    raise GatewayError(400, f"a field name in '{where or 'the body'}' is not valid Unicode text: "
                                            f"'{shown}'", param=where or None)
                stack.append((f"{where}.{key}" if where else key, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str) and (at := _lone_surrogate(value)) is not None:
            raise GatewayError(400, f"'{where}' is not valid Unicode text: it holds a lone surrogate "
                                    f"{value[at]!r} at character {at}", param=where)


def _lone_surrogate(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def parse_chat(body: dict[str, Any], roles: set[str], sampling: bool) -> ChatCall:
    """Check a chat request; ``sampling``: honour temperature / top_p (serving, not training)."""
    role = parse_role(body, roles)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise GatewayError(400, "'stream' must be true or false", param="stream")
    tools, tool_choice, forced = parse_tools(body)
    return ChatCall(role, _messages(body.get("messages")), generation_overrides(body, sampling), stream=bool(stream),
                    tools=tools, stop=parse_stop(body.get("stop")), forced=forced, tool_choice=tool_choice,
                    logprobs=parse_logprobs(body), response_format=parse_response_format(body.get("response_format")),
                    ignored=ignored_fields(body, HANDLED), sampling=sampling_fields(body),
                    single_call=parse_parallel_tool_calls(body))


def parse_role(body: dict[str, Any], roles: set[str]) -> str:
    role = body.get("model")
    if not isinstance(role, str) or not role:
        raise GatewayError(400, "'model' must name a role: one of " + ", ".join(sorted(roles)), param="model")
    if role not in roles:
        raise GatewayError(404, f"the model '{role}' does not exist: 'model' names a role of this run, one of "
                                f"{', '.join(sorted(roles))}", code="model_not_found", param="model")
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False, [], {}):
            raise GatewayError(400, f"'{name}' is not supported by the unimas gateway: {why}", param=name)
    for name, neutral in DISTRIBUTION_FIELDS.items():
        if body.get(name) not in (None, neutral):
            raise GatewayError(400, f"'{name}' is not supported by the unimas gateway: it would change the sampling "
                                    "distribution the update assumes; leave it out (or at its neutral value) and "
                                    "shape behaviour with rewards or the role's generation settings", param=name)
    if body.get("n", 1) not in (1, None):
        raise GatewayError(400, "'n' must be 1: each request is one turn; send n requests (GRPO groups already "
                                "sample several episodes per task: trainer.group_size)", param="n")
    modalities = body.get("modalities")
    if modalities not in (None, ["text"]):
        raise GatewayError(400, "'modalities' may only be [\"text\"]: the models are text models", param="modalities")
    return role


def generation_overrides(body: dict[str, Any], sampling: bool, limit_field: str = "max_tokens") -> dict[str, Any]:
    """``max_new_tokens`` from the token limit; temperature / top_p too when ``sampling`` (serving: every request is
    sampled as it asks; a training episode decides per role, from :attr:`ChatCall.sampling`)."""
    overrides: dict[str, Any] = {}
    named = "max_completion_tokens" if body.get("max_completion_tokens") is not None else limit_field
    limit = body.get(named)
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise GatewayError(400, f"'{named}' must be a positive integer", param=named)
        overrides["max_new_tokens"] = limit
    if sampling:
        overrides.update(sampling_fields(body))
    return overrides


def sampling_fields(body: dict[str, Any]) -> dict[str, float]:
    """The request's ``temperature`` / ``top_p``, checked against their ranges (absent ones left out)."""
    values = {}
    for name, low, high in SAMPLING_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise GatewayError(400, f"'{name}' must be a number in [{low:g}, {high:g}]", param=name)
        values[name] = float(value)
    return values


def parse_parallel_tool_calls(body: dict[str, Any]) -> bool:
    """True when the request sets ``parallel_tool_calls: false`` (at most one call per answer)."""
    value = body.get("parallel_tool_calls")
    if value not in (None, True, False):
        raise GatewayError(400, "'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    return value is False


def ignored_fields(body: dict[str, Any], handled: set[str]) -> dict[str, str]:
    """The request's fields that have no effect, each with the reason (answered under ``unimas.ignored``)."""
    ignored = {name: IGNORED[name] for name in IGNORED if body.get(name) is not None}
    known = handled | set(IGNORED) | set(REFUSED) | set(DISTRIBUTION_FIELDS)
    for name in sorted(set(body) - known):
        ignored[name] = "not a field the unimas gateway knows"
    return ignored


def parse_stop(raw: Any) -> list[str] | None:
    """``stop``: a string or a list of up to 4 non-empty strings."""
    if raw is None or raw == []:
        return None
    stops = [raw] if isinstance(raw, str) else raw
    if not (isinstance(stops, list) and 0 < len(stops) <= MAX_STOPS
            and all(isinstance(x, str) and x for x in stops)):
        raise GatewayError(400, f"'stop' must be a non-empty string or a list of up to {MAX_STOPS} of them",
                           param="stop")
    return list(stops)


def parse_logprobs(body: dict[str, Any]) -> bool:
    logprobs = body.get("logprobs")
    if logprobs not in (None, True, False):
        raise GatewayError(400, "'logprobs' must be true or false", param="logprobs")
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise GatewayError(400, "'top_logprobs' is not supported by the unimas gateway: only the sampled tokens' "
                                "log-probs are recorded; send logprobs: true without top_logprobs",
                           param="top_logprobs")
    return bool(logprobs)


def parse_response_format(raw: Any) -> dict[str, Any] | None:
    """``response_format``: None for text; json_object / json_schema are checked after generation."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise GatewayError(400, "'response_format.json_schema' must be {name, schema: {...}}",
                               param="response_format.json_schema")
        return {"type": "json_schema", "schema": spec.get("schema", {})}
    raise GatewayError(400, "'response_format.type' must be text, json_object or json_schema",
                       param="response_format")


def format_error(content: str | None, response_format: dict[str, Any] | None) -> str | None:
    """Why ``content`` misses the requested format (None: it meets it, or none was asked).

    The gateway does not constrain decoding (the sampled tokens stay the
    model's own): it checks the answer, records a miss on the turn for the
    rewards, and says so in the response.
    """
    if response_format is None:
        return None
    text = (content or "").strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the answer is not JSON ({exc})"
    if not isinstance(value, dict):
        return f"the answer is JSON but not an object ({type(value).__name__})"
    if response_format["type"] == "json_schema" and response_format["schema"]:
        try:
            import jsonschema
        except ImportError:
            return None if not response_format["schema"].get("required") else \
                f"the schema is not checked (install jsonschema); required: {response_format['schema']['required']}"
        try:
            jsonschema.validate(value, response_format["schema"])
        except jsonschema.ValidationError as exc:
            return f"the answer does not match the schema: {exc.message}"
        except jsonschema.SchemaError as exc:
            return f"the schema is not a valid JSON schema: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - the agent's schema (a $ref to nowhere, or one that loops), not a bug
            return f"the schema cannot be checked: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise GatewayError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
    messages = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str) or role not in MESSAGE_ROLES:  # a list or object role is not hashable
            raise GatewayError(400, f"{where} must be an object whose 'role' is one of "
                                    f"{', '.join(sorted(MESSAGE_ROLES))}", param=where)
        role = "system" if role == "developer" else role
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


def answer_parts(turn: TurnNode, call_tools: bool,
                 single: bool = False) -> tuple[str | None, list[dict[str, Any]], str]:
    """(content, tool_calls, finish_reason) of a recorded turn; ``call_tools``: read calls out of its text;
    ``single``: only its first call (``parallel_tool_calls: false``)."""
    content, calls = split_calls(turn.text, turn.id) if call_tools else (turn.text, [])
    calls = calls[:1] if single else calls
    finish = "tool_calls" if calls else "stop" if (turn.finished or turn.stop) else "length"
    return content, calls, finish


def unimas_notes(turn: TurnNode, ignored: dict[str, str]) -> dict[str, Any]:
    """The response's ``unimas`` field: what the gateway did beyond the OpenAI format (docs/gateway.md)."""
    notes: dict[str, Any] = {"turn": turn.id}
    if ignored:
        notes["ignored"] = ignored
    if turn.format_error:
        notes["format_error"] = turn.format_error
    if turn.forced_ids:
        notes["forced_tokens"] = len(turn.forced_ids)
    if turn.stop:
        notes["stop"] = turn.stop
    if turn.rerendered:
        notes["rerendered"] = turn.rerendered
    if not (turn.finished or turn.stop):
        notes["cut_off"] = (f"the role's generation.max_new_tokens (or the request's lower limit) ended the answer "
                            f"after {len(turn.response_ids)} tokens; the turn records finished: false")
    return notes


def token_logprobs(turn: TurnNode) -> list[dict[str, Any]]:
    """The sampled tokens' recorded log-probs in the OpenAI format (forced tokens were not sampled: absent)."""
    texts = turn.token_texts or [""] * len(turn.response_ids)
    return [{"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
            for text, logprob in zip(texts, turn.logprobs)]


def completion(turn: TurnNode, completion_id: str, tools: bool = False, call: ChatCall | None = None
               ) -> dict[str, Any]:
    """The chat.completion object for a recorded turn; ``tools``: read tool calls out of its text."""
    content, calls, finish = answer_parts(turn, tools, call is not None and call.single_call)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    logprobs = {"content": token_logprobs(turn), "refusal": None} if call is not None and call.logprobs else None
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": turn.role,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}],
        "usage": {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(turn.response_ids),
                  "total_tokens": len(turn.prompt_ids) + len(turn.response_ids)},
        "unimas": unimas_notes(turn, call.ignored if call else {}),
    }


def streamed_content(text: str, tools: bool) -> str:
    """The content a streamed answer may show of ``text`` (the answer so far, its forced opening included).

    Without tools, all of it. With tools, only what comes before a call block
    (and not an end that may be the start of one, nor trailing whitespace,
    which the content loses when a call follows): calls are sent once the
    turn is recorded and its blocks parsed.
    """
    return shown_text(text, [CALL_OPEN]).rstrip() if tools else text


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def stream_events(stream: TurnStream, call: ChatCall, completion_of: Callable[[TurnNode], dict[str, Any]],
                        completion_id: str) -> AsyncIterator[str]:
    """The turn as ``chat.completion.chunk`` server-sent events, content deltas as it is sampled.

    First the assistant role, then a content delta each time the shown text
    grows, then (once the turn is recorded) the rest of the content, the tool
    calls and the log-probs, then the finish reason with ``usage``, then
    ``[DONE]``. The deltas add up to the recorded answer's content. A turn that
    fails after the stream began ends it with an ``error`` event.
    """
    head = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": call.role}

    def chunk(delta: dict[str, Any], logprobs: dict[str, Any] | None = None) -> str:
        return sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": logprobs}]})

    yield chunk({"role": "assistant", "content": ""})
    shown = ""
    async for text in stream.texts():
        content = streamed_content(call.forced + text, bool(call.tools))
        if len(content) > len(shown) and content.startswith(shown):
            yield chunk({"content": content[len(shown):]})
            shown = content
    try:
        done = completion_of(await stream.turn())
    except GatewayError as exc:
        yield sse(exc.body())
        return
    choice = done["choices"][0]
    final = choice["message"]["content"] or ""
    delta: dict[str, Any] = {"content": final[len(shown):]} if final.startswith(shown) and final != shown else {}
    if "tool_calls" in choice["message"]:  # streamed calls carry their position
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(choice["message"]["tool_calls"])]
    if delta or choice["logprobs"]:
        yield chunk(delta, choice["logprobs"])
    yield sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
               "usage": done["usage"], "unimas": done["unimas"]})
    yield "data: [DONE]\n\n"


def model_list(roles: list[str]) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": role, "object": "model", "created": 0, "owned_by": "unimas"}
                                       for role in roles]}
