"""Built-in datasets: tasks from a JSONL file or listed inline in the config."""

from __future__ import annotations

import json
from pathlib import Path

import unimas
from unimas import UserError, read_bytes


def jsonl(split: str, seed: int, path: str, eval_path: str | None = None) -> list[dict]:
    """One JSON object per line; ``eval_path`` (if given) is used for the eval split."""
    key = "eval_path" if split == "eval" and eval_path else "path"
    name = eval_path if key == "eval_path" else path
    if not isinstance(name, str):
        raise UserError(f"must be a file name, got {type(name).__name__}", where=f"data.params.{key}")
    chosen = Path(name)
    try:
        data = read_bytes(chosen)
    except (OSError, ValueError) as exc:  # missing, a directory, unreadable, a name the system cannot hold
        reason = "task file not found" if isinstance(exc, FileNotFoundError) else f"cannot read the task file: {exc}"
        raise UserError(reason, where=f"data.params.{key} ({chosen})") from None
    tasks = []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"line {number} is not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8",
                            where=str(chosen)) from None
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or an integer past the digit limit
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else (
                "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
            raise UserError(f"line {number} is not JSON: {reason}", where=str(chosen)) from None
        if not isinstance(task, dict):
            raise UserError(f"line {number} must be a JSON object like {{\"question\": ...}}, got "
                            f"{type(task).__name__}", where=str(chosen))
        tasks.append(task)
    return tasks


def inline(split: str, seed: int, tasks: list[dict], eval_tasks: list[dict] | None = None) -> list[dict]:
    return list(eval_tasks if split == "eval" and eval_tasks is not None else tasks)


@unimas.hookimpl
def unimas_datasets():
    return {"jsonl": jsonl, "inline": inline}
