"""An Agent Lightning agent run by Agent Lightning's own runner (``Trainer.dev``), trained through the unimas gateway.

Task JSON on stdin, the outcome as the last line of stdout, like every ``command`` agent of
``examples/gateway/tool_agent.yaml`` (docs/gateway.md, "Frameworks"). ``pip install agentlightning``.

Agent Lightning's runner hands each rollout the ``LLM`` resource it was given, and the rollout's client sends that
resource's ``api_key`` — not ``OPENAI_API_KEY`` from the environment. unimas gives every episode a key of its own
(``OPENAI_API_KEY``) and refuses any other with 401, so the resource must carry it: that is the one line a unimas
run needs (``api_key=os.environ["OPENAI_API_KEY"]`` below).
"""

from __future__ import annotations

import json
import os
import sys

import agentlightning as agl
from openai import OpenAI

ANSWERS: list[str] = []
"""What the rollouts answered: the runner runs them on a thread of this process (the shared-memory strategy)."""


@agl.rollout
def repeat_agent(task: dict, llm: agl.LLM) -> float:
    """One turn of the role ``llm.model``; Agent Lightning's reward is 1 for the expected answer."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unset")
    reply = client.chat.completions.create(model=llm.model,
                                           messages=[{"role": "user", "content": f"repeat: {task.get('target', '')}"}])
    answer = (reply.choices[0].message.content or "").strip()
    ANSWERS.append(answer)
    return float(answer == task.get("answer"))


def main() -> None:
    task = json.loads(sys.stdin.read())
    llm = agl.LLM(endpoint=os.environ["OPENAI_BASE_URL"], model="agent", api_key=os.environ["OPENAI_API_KEY"])
    trainer = agl.Trainer(initial_resources={"main_llm": llm},
                          strategy=agl.SharedMemoryExecutionStrategy(n_runners=1, main_thread="algorithm"))
    trainer.dev(repeat_agent, train_dataset=[task])
    print(json.dumps({"answer": ANSWERS[-1] if ANSWERS else ""}))


if __name__ == "__main__":
    main()
