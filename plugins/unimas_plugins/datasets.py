"""Built-in datasets: tasks from a JSONL file or listed inline in the config."""

from __future__ import annotations

import json
from pathlib import Path

import unimas
from unimas.errors import UserError


def jsonl(split: str, seed: int, path: str, eval_path: str | None = None) -> list[dict]:
    """One JSON object per line; ``eval_path`` (if given) is used for the eval split."""
    chosen = Path(eval_path if split == "eval" and eval_path else path)
    if not chosen.is_file():
        raise UserError("task file not found", where=f"data.params.path ({chosen})")
    tasks = []
    for number, line in enumerate(chosen.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"line {number} is not JSON: {exc.msg}", where=str(chosen)) from None
        if not isinstance(task, dict):
            raise UserError(f"line {number} must be a JSON object", where=str(chosen))
        tasks.append(task)
    return tasks


def inline(split: str, seed: int, tasks: list[dict], eval_tasks: list[dict] | None = None) -> list[dict]:
    return list(eval_tasks if split == "eval" and eval_tasks is not None else tasks)


@unimas.hookimpl
def unimas_datasets():
    return {"jsonl": jsonl, "inline": inline}
