"""litellm's `completion` against the gateway. `pip install litellm` (or `unimas[frameworks]`); tested by
tests/test_gateway_frameworks.py::test_litellm_completion_trains_two_steps.

The `openai/` prefix makes litellm speak the OpenAI protocol to `api_base`; the rest of the name is the role.
"""

import json
import os
import sys

import litellm

task = json.loads(sys.stdin.read())
reply = litellm.completion(model="openai/agent", api_base=os.environ["OPENAI_BASE_URL"],
                           api_key=os.environ["OPENAI_API_KEY"],
                           messages=[{"role": "user", "content": f"repeat: {task['target']}"}])
print(json.dumps({"answer": (reply.choices[0].message.content or "").strip()}))
