"""A plain `openai` agent with one tool: the model calls it, the agent runs it, the result goes back.

Reads the task as JSON on stdin, prints its outcome as the last line of stdout (docs/gateway.md).
`OpenAI()` reads OPENAI_BASE_URL and OPENAI_API_KEY, which unimas sets per episode.
"""

import json
import sys

from openai import OpenAI

task = json.loads(sys.stdin.read())
client = OpenAI()
tools = [{"type": "function", "function": {"name": "lookup", "description": "looks the answer up",
                                           "parameters": {"type": "object", "properties": {}}}}]
messages = [{"role": "user", "content": f"repeat: {task['target']}"}]
for _ in range(3):
    reply = client.chat.completions.create(model="agent", messages=messages, tools=tools).choices[0].message
    messages.append(reply.model_dump(exclude_none=True))
    if not reply.tool_calls:
        break
    for call in reply.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": task["target"]})
print(json.dumps({"answer": (reply.content or "").strip()}))
