"""Two agents written against the plain OpenAI client, with no unimas code in them.

A speaker sees a target letter and says one token; a listener sees only that
token and names the letter (the signalling game of examples/quickstart_chat.yaml).
The program reads the task as JSON on stdin and prints its outcome as JSON on
stdout. `model=` picks the agent; OPENAI_BASE_URL and OPENAI_API_KEY come from
the environment, so the same file talks to OpenAI, to `unimas train` (through
its gateway) or to `unimas serve`.
"""

import json
import sys

from openai import OpenAI


def ask(client: OpenAI, agent: str, prompt: str) -> str:
    reply = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": prompt}], max_tokens=1)
    return reply.choices[0].message.content or ""


def main() -> None:
    task = json.load(sys.stdin)
    client = OpenAI()
    message = ask(client, "speaker", f"target: {task['target']}")
    guess = ask(client, "listener", f"message: {message}")
    print(json.dumps({"answer": guess.strip(), "message": message}))


if __name__ == "__main__":
    main()
