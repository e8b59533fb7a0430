"""An OpenAI Agents SDK agent with its default model (OpenAIResponsesModel: the Responses API) and one tool.

`pip install openai-agents`. The SDK's default client reads OPENAI_BASE_URL / OPENAI_API_KEY; tracing is
turned off because it would upload traces to OpenAI.
"""

import json
import sys

from agents import Agent, MaxTurnsExceeded, ModelBehaviorError, Runner, function_tool, set_tracing_disabled

task = json.loads(sys.stdin.read())
set_tracing_disabled(True)


@function_tool
def lookup() -> str:
    """Looks the answer up."""
    return task["target"]


agent = Agent(name="agent", instructions=f"repeat: {task['target']}", tools=[lookup], model="agent")
try:
    answer = str(Runner.run_sync(agent, f"repeat: {task['target']}", max_turns=3).final_output).strip()
except (ModelBehaviorError, MaxTurnsExceeded):  # the model called a tool that does not exist, or never finished
    answer = ""
print(json.dumps({"answer": answer}))
