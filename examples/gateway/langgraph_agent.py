"""A LangGraph ReAct agent with one tool. `pip install langgraph langchain-openai` (or `unimas[frameworks]`);
tested by tests/test_gateway_frameworks.py::test_a_langgraph_react_agent_trains_two_steps.

ChatOpenAI reads OPENAI_BASE_URL / OPENAI_API_KEY; `model` names the role.
"""

import json
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

task = json.loads(sys.stdin.read())


@tool
def lookup() -> str:
    """Looks the answer up."""
    return task["target"]


agent = create_react_agent(ChatOpenAI(model="agent"), [lookup])
state = agent.invoke({"messages": [("user", f"repeat: {task['target']}")]}, {"recursion_limit": 6})
print(json.dumps({"answer": str(state["messages"][-1].content).strip()}))
