"""A smolagents CodeAgent (it always sends `stop`). `pip install smolagents`.

CodeAgent runs the Python the model writes, in smolagents' own restricted interpreter (LocalPythonExecutor;
no imports authorised here). For untrusted models use its sandboxed executors (executor_type="docker" or "e2b").
"""

import json
import os
import sys

from smolagents import CodeAgent, OpenAIServerModel, tool

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
agent = CodeAgent(tools=[lookup], model=model, max_steps=2, additional_authorized_imports=[], verbosity_level=0)
print(json.dumps({"answer": str(agent.run(f"repeat: {task['target']}"))}))
