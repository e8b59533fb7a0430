"""Solver -> verifier on ``a+b=``: a proposal, then a checked final answer.

The verifier sees the question and the solver's proposal and writes the final
answer. Under a team reward alone the verifier tends to learn to copy; a
role-level fix/break reward (see ``fix_or_break``) gives it its own signal.
"""

from __future__ import annotations

import random


async def solver_verifier(ctx, task):
    proposal = await ctx.act("solver")
    final = await ctx.act("verifier", proposal=proposal)
    return {"answer": final.parsed, "proposal": proposal.parsed}


def arithmetic_tasks(split: str, seed: int, max_operand: int = 50, size: int = 2000) -> list[dict]:
    """Random ``a+b=`` problems; eval uses a disjoint seed stream."""
    rng = random.Random(seed * 7919 + (1 if split == "eval" else 0))
    tasks = []
    for index in range(size):
        a, b = rng.randrange(max_operand), rng.randrange(max_operand)
        tasks.append({"id": f"{split}-{index}", "question": f"{a}+{b}=", "answer": str(a + b)})
    return tasks
