"""What a role sees of its episode so far: its prompt as chat messages (``roles.<role>.memory``).

* ``none``: the system message and the current input only (one-shot roles);
* ``own``: the role's earlier turns — each input as a user message, each
  output as an assistant message — then the current input;
* ``shared``: the episode's transcript — the role's own turns as above,
  every other role's output as a user message ``"<role>: <text>"`` — then
  the current input.

Besides the messages, a turn gets the :class:`Continuation` of the role's
previous turn (its messages and the ids it saw and sampled), so the model
group can extend those ids instead of re-tokenising the conversation, and
the list of earlier turns the prompt contains, which become "consumed"
edges of the graph trajectory.
"""

from __future__ import annotations

from typing import Sequence

from unimas.config.schema import RoleConfig
from unimas.groups.base import Continuation
from unimas.trajectory import TurnNode


def conversation(role: str, spec: RoleConfig, user_text: str,
                 earlier: Sequence[TurnNode]) -> tuple[list[dict[str, str]], Continuation | None, list[TurnNode]]:
    """(messages, continuation of the role's last turn, earlier turns the prompt contains)."""
    messages = [{"role": "system", "content": spec.system}] if spec.system else []
    seen: list[TurnNode] = []
    last_own: TurnNode | None = None
    if spec.memory != "none":
        for turn in earlier:
            if turn.role == role:
                messages += [{"role": "user", "content": turn.input}, {"role": "assistant", "content": turn.text}]
                last_own = turn
            elif spec.memory == "shared":
                messages.append({"role": "user", "content": f"{turn.role}: {turn.text}"})
            else:
                continue
            seen.append(turn)
    messages.append({"role": "user", "content": user_text})
    continuation = None
    if last_own is not None and last_own.prompt_ids and last_own.messages:
        continuation = Continuation(messages=last_own.messages, prompt_ids=last_own.prompt_ids,
                                    response_ids=last_own.response_ids, finished=last_own.finished)
    return messages, continuation, seen
