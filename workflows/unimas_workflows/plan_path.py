"""Plan-Path on small grids: a planner writes a path, a tool walks it, an executor/checker writes the final path.

A grid is ``size x size`` cells written row after row with no separator:
``.`` free, ``#`` wall, ``S`` start, ``G`` goal. A path is a string of moves
``U D L R``. The ``grid_walk`` tool validates a path move by move and answers
``ok`` (it reaches the goal), ``x<k>`` (move k leaves the grid or hits a
wall) or ``e`` (it ends elsewhere). The executor sees the grid, the plan and
the tool's verdict (``{grid}>{plan}?{check}>``) and writes the path that is
finally walked; the episode is solved when that path reaches the goal.

This is the planning task on which per-role GRPO was reported to lift small
models from single digits to near perfect; here it is small enough for a tiny
character model (docs/results.md).
"""

from __future__ import annotations

import random
from collections import deque

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def walk(grid: str, path: str, size: int = 4) -> str:
    """``ok`` when ``path`` goes from S to G through free cells, ``x<k>`` at the first bad move, else ``e``."""
    row, col = divmod(grid.index("S"), size)
    path = path.strip()
    if not path:
        return "e"
    for k, move in enumerate(path, start=1):
        if move not in MOVES:
            return f"x{k}"
        dr, dc = MOVES[move]
        row, col = row + dr, col + dc
        if not (0 <= row < size and 0 <= col < size) or grid[row * size + col] == "#":
            return f"x{k}"
        if grid[row * size + col] == "G":
            return "ok" if k == len(path) else f"x{k + 1}"  # moving past the goal is a wasted, wrong move
    return "e"


def shortest_path(grid: str, size: int = 4) -> str | None:
    """A shortest S -> G path (moves tried in U D L R order), or None when walls cut G off."""
    start, goal = grid.index("S"), grid.index("G")
    came: dict[int, tuple[int, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            moves = []
            while came[cell] is not None:
                cell, move = came[cell][0], came[cell][1]
                moves.append(move)
            return "".join(reversed(moves))
        row, col = divmod(cell, size)
        for move, (dr, dc) in MOVES.items():
            r, c = row + dr, col + dc
            nxt = r * size + c
            if 0 <= r < size and 0 <= c < size and grid[nxt] != "#" and nxt not in came:
                came[nxt] = (cell, move)
                queue.append(nxt)
    return None


def plan_path_tasks(split: str, seed: int, size: int = 4, walls: int = 4, min_distance: int = 3,
                    max_moves: int = 6, count: int = 2000) -> list[dict]:
    """Random solvable grids; ``answer`` is one shortest path (any path that reaches G counts as solved)."""
    rng = random.Random(seed * 104729 + (1 if split == "eval" else 0))
    tasks: list[dict] = []
    while len(tasks) < count:
        cells = ["."] * (size * size)
        start, goal, *blocked = rng.sample(range(size * size), 2 + walls)
        cells[start], cells[goal] = "S", "G"
        for cell in blocked:
            cells[cell] = "#"
        grid = "".join(cells)
        (sr, sc), (gr, gc) = divmod(start, size), divmod(goal, size)
        best = shortest_path(grid, size)
        if best is None or abs(sr - gr) + abs(sc - gc) < min_distance or len(best) > max_moves:
            continue
        tasks.append({"id": f"{split}-{len(tasks)}", "grid": grid, "answer": best, "size": size})
    return tasks


def grid_walk(grid: str, path: str, size: int = 4) -> str:
    """The move-validating tool: :func:`walk` (``ok`` / ``x<k>`` / ``e``)."""
    return walk(str(grid), str(path), int(size))


async def plan_path(ctx, task) -> dict:
    """Plan, validate the plan with the tool, let the executor write the final path, validate that."""
    plan = await ctx.act("planner")
    planned = "" if plan.parsed is None else str(plan.parsed).strip()
    check = await ctx.tool("grid_walk", grid=task["grid"], path=planned, size=task["size"], after=[plan])
    verdict = check.result if check.error is None else "e"
    final = await ctx.act("executor", plan=planned, check=verdict, after=[plan, check])
    path = "" if final.parsed is None else str(final.parsed).strip()
    solved = walk(task["grid"], path, task["size"]) == "ok"
    scores = {"planner": float(verdict == "ok"), "executor": float(solved)}
    for role, value in scores.items():  # the per-role view under any credit (workflow/<role>_score)
        ctx.metric(f"{role}_score", value)
    return {"path": path, "plan": planned, "solved": solved, "plan_check": verdict, "role_scores": scores}


def path_solved(trajectory, task: dict) -> float:
    """Team reward: 1.0 when the final path reaches the goal through free cells."""
    return float(bool(trajectory.outcome.get("solved")))
