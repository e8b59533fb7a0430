"""A smolagents ToolCallingAgent (it always sends `tool_choice: "required"`). `pip install smolagents`."""

import json
import os
import sys

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

task = json.loads(sys.stdin.read())


@tool
def lookup(query: str) -> str:
    """Looks the answer up.

    Args:
        query: what to look up.
    """
    return task["target"]


model = OpenAIServerModel(model_id="agent", api_base=os.environ["OPENAI_BASE_URL"],
                          api_key=os.environ["OPENAI_API_KEY"])
agent = ToolCallingAgent(tools=[lookup], model=model, max_steps=2, verbosity_level=0)
print(json.dumps({"answer": str(agent.run(f"repeat: {task['target']}"))}))
