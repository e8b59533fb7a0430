"""Function calling through the gateway: tool definitions in, tool calls out.

Tool definitions and the tool-call / tool-result messages of a conversation
go to the model's chat template (``apply_chat_template(..., tools=...)``),
which is where each model family's own tool format lives. A template that
does not mention tools leaves them out (as transformers does); the recorded
prompt of the turn shows what the model saw.

Out of the generated text, calls are read in the Hermes format that Qwen2.5,
Hermes and many other open models are trained on: one JSON object
``{"name": ..., "arguments": {...}}`` per ``<tool_call>...</tool_call>``
block. Only well-formed blocks become ``tool_calls``; the rest of the text
stays the message content. The model's output is data: it is only ever
parsed as JSON.

Call ids are ``call-<turn id>-<n>``: when an agent later sends the call back
(the assistant message with ``tool_calls``, then the ``tool`` result), the
gateway knows which turn it came from and records the "consumed" edge.
"""

from __future__ import annotations

import json
import re
from typing import Any

from unimas.gateway.errors import GatewayError

CALL_OPEN = "<tool_call>"
CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
MAX_TOOLS = 64
CHOICES = (None, "auto", "none", "required")
"""The string values of ``tool_choice`` (an object names a function)."""


def forced_opening(name: str | None) -> str:
    """The Hermes opening forced for ``tool_choice``: the call block and, for a named function, its name.

    It ends where BPE tokenisers usually end a token (after ``": "`` or
    ``":``), so that the forced ids are the ones the model would have produced.
    """
    if name is None:
        return '<tool_call>\n{"name": "'
    return '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments":'


def parse_tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str | None, str]:
    """(the request's checked ``tools`` or None, the forced choice, the forced opening of the answer).

    ``tool_choice``: ``auto`` (the model's own choice), ``none`` (tools are
    not rendered and the answer is not read for calls), ``required`` (the
    answer is forced to open a call block) or a named function (forced to
    open a call of that function). The forced opening is prompt-side text
    (see ``TurnNode.forced_ids``): the model samples the rest of the call.
    """
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not (choice in CHOICES or isinstance(choice, dict)):  # 3, "sometimes": malformed, with tools or without
        raise GatewayError(400, "'tool_choice' must be auto, none, required or {type: function, function: {name}}",
                           param="tool_choice")
    if tools in (None, []) or choice == "none":
        if isinstance(choice, dict) or choice == "required":
            raise GatewayError(400, "'tool_choice' forces a call but the request has no 'tools'", param="tool_choice")
        return None, None, ""
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise GatewayError(400, f"'tools' must be a list of at most {MAX_TOOLS} function definitions", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)
                and isinstance(function.get("name"), str) and function["name"]):
            raise GatewayError(400, f"tools[{i}] must be {{type: function, function: {{name, description, "
                                    "parameters}}}}", param=f"tools[{i}]")
        for key, kind, shape in (("parameters", dict, "a JSON schema object"), ("description", str, "a string")):
            if function.get(key) is not None and not isinstance(function[key], kind):
                raise GatewayError(400, f"tools[{i}].function.{key} must be {shape}, not "
                                        f"{type(function[key]).__name__} (a chat template renders it as given)",
                                   param=f"tools[{i}].function.{key}")
    if choice in (None, "auto"):
        return tools, None, ""
    if choice == "required":
        return tools, "required", forced_opening(None)
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    named = function.get("name") if isinstance(function, dict) else None
    names = [tool["function"]["name"] for tool in tools]
    if not isinstance(named, str) or named not in names:
        raise GatewayError(400, "'tool_choice' must be auto, none, required or {type: function, function: {name}} "
                                f"naming one of the tools ({', '.join(names)})", param="tool_choice")
    return tools, named, forced_opening(named)


def assistant_calls(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as chat templates take them (arguments as an object)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        raise GatewayError(400, f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
    converted = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise GatewayError(400, f"{where}.tool_calls[{j}] must carry function.name and function.arguments",
                               param=f"{where}.tool_calls[{j}]")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                pass  # not JSON: the template shows it as the agent sent it
        converted.append({"id": str(call.get("id", "")), "type": "function",
                          "function": {"name": function["name"], "arguments": arguments}})
    return converted


def called_turn_ids(messages: list[dict[str, Any]]) -> set[str]:
    """Turn ids named by the call ids of assistant ``tool_calls`` and ``tool`` results in the messages."""
    ids = set()
    for message in messages:
        names = [call.get("id", "") for call in message.get("tool_calls") or []]
        names.append(message.get("tool_call_id") or "")
        ids.update(match.group(1) for name in names if (match := re.fullmatch(r"call-(.+)-\d+", str(name))))
    return ids


def split_calls(text: str, turn_id: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a generated text: well-formed ``<tool_call>`` blocks become calls."""
    calls = []
    kept = []
    position = 0
    for match in CALL_BLOCK.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            continue
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"]):
            continue
        arguments = call.get("arguments", {})
        calls.append({"id": f"call-{turn_id}-{len(calls)}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
        kept.append(text[position:match.start()])
        position = match.end()
    if not calls:
        return text, []
    kept.append(text[position:])
    content = "".join(kept).strip()
    return content or None, calls
