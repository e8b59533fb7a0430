"""Function calling through the gateway: tool definitions reach the chat template, calls come back as tool_calls,
and a turn that receives a tool result is linked to the turn that made the call."""

from __future__ import annotations

import json
import shutil

import pytest
from openai import AsyncOpenAI

from tests.test_gateway import run_episodes, team
from unimas.gateway.protocol import GatewayError, completion, parse_chat
from unimas.gateway.sessions import consumed_turns
from unimas.gateway.tool_calls import split_calls
from unimas.trajectory import GraphTrajectory, TurnNode

# A tools-aware ChatML template in the Hermes style (Qwen2.5's is a larger version of the same idea).
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t.function.name }} ({{ t.function.description }})"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ {'name': c.function.name, "
    "'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ADD = {"type": "function", "function": {"name": "add", "description": "adds two integers",
                                        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}


@pytest.fixture(scope="module")
def tools_model(chat_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tools") / "tiny-chat-tools"
    shutil.copytree(chat_model, directory)
    (directory / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return directory


def test_generated_tool_call_blocks_become_tool_calls():
    text = ('thinking <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> and '
            '<tool_call>not json</tool_call><tool_call>{"name": "mul", "arguments": "{\\"x\\": 3}"}</tool_call>')
    content, calls = split_calls(text, "speaker#2")
    assert content == "thinking  and <tool_call>not json</tool_call>"  # a malformed block stays text
    assert [c["id"] for c in calls] == ["call-speaker#2-0", "call-speaker#2-1"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("add", {"a": 1, "b": 2}), ("mul", {"x": 3})]
    assert split_calls("plain answer", "t") == ("plain answer", [])

    turn = TurnNode(id="speaker#2", role="speaker", model_group="g", prompt="", text=text, finished=True)
    answer = completion(turn, "chatcmpl-x", tools=True)["choices"][0]
    assert answer["finish_reason"] == "tool_calls" and len(answer["message"]["tool_calls"]) == 2
    assert completion(turn, "chatcmpl-x")["choices"][0]["message"] == {"role": "assistant", "content": text}


def test_tool_requests_are_checked_and_converted():
    body = {"model": "speaker", "tools": [ADD], "messages": [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-speaker#0-0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "call-speaker#0-0", "content": "3"}]}
    call = parse_chat(body, {"speaker"}, sampling=False)
    assert call.tools == [ADD]
    assert call.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call-speaker#0-0", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}
    assert call.messages[2] == {"role": "tool", "content": "3", "tool_call_id": "call-speaker#0-0"}
    assert parse_chat({**body, "tool_choice": "none"}, {"speaker"}, sampling=False).tools is None
    for bad, field in (({"tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice"),
                       ({"tools": [{"type": "function"}]}, "tools[0]"),
                       ({"tools": "add"}, "tools")):
        with pytest.raises(GatewayError) as refused:
            parse_chat({**body, **bad}, {"speaker"}, sampling=False)
        assert refused.value.status == 400 and refused.value.param == field

    trajectory = GraphTrajectory(episode_id="e", task_id="t")
    trajectory.add_node(TurnNode(id="speaker#0", role="speaker", model_group="g", prompt="", text="<tool_call>"), [])
    assert [t.id for t in consumed_turns(trajectory, call.messages)] == ["speaker#0"]


async def tool_agent(task: dict, base_url: str) -> dict:
    """One call with tools; its (pretended) tool call and the tool's result go back in a second call."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    asked = [{"role": "user", "content": f"target: {task['target']}"}]
    first = await client.chat.completions.create(model="speaker", messages=asked, tools=[ADD])
    call = {"id": f"call-{first.id.rsplit(':', 1)[-1]}-0", "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": 1})}}
    second = await client.chat.completions.create(model="listener", tools=[ADD], messages=[
        *asked, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "tool said 42"}])
    return {"answer": second.choices[0].message.content or "", "finish": first.choices[0].finish_reason}


def test_tools_reach_the_chat_template_and_link_the_turns(tools_model):
    [trajectory], _ = run_episodes(team(tools_model, {"agent": {"function": "tests.test_gateway_tools:tool_agent"}}),
                                   [{"target": "a", "answer": "a"}])
    assert trajectory.error is None, trajectory.error
    first, second = trajectory.turns()
    assert "tools: add (adds two integers)" in first.prompt  # rendered by the template, in the trained prompt
    assert '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' in second.prompt
    assert "tool said 42" in second.prompt and second.prompt.endswith("<|im_start|>assistant\n")
    assert (first.id, second.id) in trajectory.graph.edges  # the tool call came from the first turn
    assert second.prompt_ids and second.response_ids and len(second.logprobs) == len(second.response_ids)
    assert trajectory.outcome["finish"] in ("stop", "length", "tool_calls")
