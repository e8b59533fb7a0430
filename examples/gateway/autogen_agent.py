"""An AutoGen AssistantAgent with one tool. `pip install autogen-agentchat "autogen-ext[openai]"` in an environment
of its own (autogen-core pins protobuf 5.29, older than Ray's Google libraries accept): run it as the `command` with
that environment's python. Tested by tests/test_gateway_frameworks.py::test_an_autogen_assistant_agent_trains_two_steps
when $UNIMAS_AUTOGEN_PYTHON names that python. A model name OpenAI does not know needs `model_info`; with
`reflect_on_tool_use` the reflection on the tool result is sent without tools, so that turn is rendered afresh
(`rerendered` says why).
"""

import asyncio
import json
import os
import sys

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient

task = json.loads(sys.stdin.read())


async def lookup() -> str:
    """Looks the answer up."""
    return task["target"]


async def main() -> None:
    client = OpenAIChatCompletionClient(model="agent", base_url=os.environ["OPENAI_BASE_URL"],
                                        api_key=os.environ["OPENAI_API_KEY"],
                                        model_info={"vision": False, "function_calling": True, "json_output": True,
                                                    "family": "unknown", "structured_output": False})
    agent = AssistantAgent("agent", model_client=client, tools=[lookup], reflect_on_tool_use=True)
    result = await agent.run(task=f"repeat: {task['target']}")
    print(json.dumps({"answer": str(result.messages[-1].content).strip()}))


asyncio.run(main())
