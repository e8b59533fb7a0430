"""A two-role signalling game: the smallest task that needs two agents to cooperate.

The speaker sees a target symbol and emits one token; the listener sees only
that token and must name the target. The team is rewarded when the listener
is right, so the pair has to invent a code. At random init the listener is at
chance (1/K); a working multi-agent RL loop drives it to 100 %.
"""

from __future__ import annotations


async def signalling(ctx, task):
    message = await ctx.act("speaker")
    guess = await ctx.act("listener", message=message)
    return {"answer": guess.parsed, "message": message.text}


def signalling_tasks(split: str, seed: int, targets: str = "abcdefgh", repeat: int = 1) -> list[dict]:
    """Every target once per repeat; the eval split lists each target once."""
    rounds = 1 if split == "eval" else repeat
    return [{"id": f"{split}-{r}-{t}", "target": t, "answer": t} for r in range(rounds) for t in targets]
