"""Math team: solver -> verifier -> (refiner while the verifier objects, at most ``max_rounds``) -> answer.

Graph of one episode (``max_rounds: 2``)::

    solver#0 -> verifier#0 --ok--> answer = solver#0
                    |
                  other -> refiner#0 -> verifier#1 --ok--> answer = refiner#0
                                            |
                                          other -> refiner#1 -> answer = refiner#1 (rounds spent)

The verifier sees the question and the current proposal and writes a verdict
that its parser reads (``ok`` / ``wrong``, e.g. regex ``^\\s*(ok|wrong)``).
Only ``ok`` accepts: ``wrong`` *or an unreadable verdict* sends the question,
the proposal and the verifier's whole text (its objection) to the refiner,
whose answer becomes the next proposal. After ``max_rounds`` refinements the
last one is final without another check. See ``docs/workflows/math_team.md``.

Datasets: ``math_jsonl``, ``math_parquet`` (a Parquet file/glob or a
``datasets.save_to_disk`` directory) with configurable question/answer
columns and answer formats (``gsm8k``: ``#### 1,234``; ``math``: last
``\\boxed{}``; ``plain``), and ``math_synthetic`` for CPU runs. Rewards live in
``unimas_plugins.math_rewards`` and are registered here.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

from unimas_plugins.math_rewards import REWARDS
from unimas_plugins.parsers import last_balanced

import unimas
from unimas import UserError, read_bytes

ANSWER_FORMATS = ("plain", "gsm8k", "math")


async def math_team(ctx, task, max_rounds: int = 2, accept: str = "ok") -> dict:
    """Solve, check, refine while the check objects; the outcome holds every verdict for the rewards."""
    if not isinstance(max_rounds, int) or max_rounds < 0:
        raise UserError(f"must be an integer >= 0, got {max_rounds!r}", where="workflow.params.max_rounds")
    proposal = await ctx.act("solver", question=task["question"])
    current, checks, refinements = proposal, [], 0
    for _ in range(max_rounds):
        verdict = await ctx.act("verifier", question=task["question"], proposal=current)
        said = str(verdict.parsed).strip().lower() if verdict.parsed is not None else None
        checks.append({"turn": verdict.id, "proposal": current.parsed, "verdict": said})
        if said == accept:
            break
        current = await ctx.act("refiner", question=task["question"], proposal=current, objection=verdict.text,
                                after=[verdict])
        refinements += 1
    return {"answer": current.parsed, "proposal": proposal.parsed, "checks": checks, "refinements": refinements}


# ------------------------------------------------------------------ answers


def gsm8k_answer(solution: Any) -> str | None:
    """The number after the last ``####`` (``#### 1,234`` -> ``1234``); None when there is none."""
    text = "" if solution is None else str(solution)
    if "####" not in text:
        return None
    answer = text.rsplit("####", 1)[1].strip().splitlines()
    answer = answer[0].strip().replace(",", "").rstrip(".") if answer else ""
    return answer.lstrip("$").strip() or None


def boxed_answer(solution: Any) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; None when absent."""
    text = "" if solution is None else str(solution)
    for marker in ("\\boxed{", "\\fbox{"):
        content = last_balanced(text, marker)
        if content is not None:
            return content
    return None


def extract_answer(solution: Any, answer_format: str) -> str | None:
    if answer_format == "gsm8k":
        return gsm8k_answer(solution)
    if answer_format == "math":
        return boxed_answer(solution)
    return None if solution is None else str(solution).strip() or None


# ------------------------------------------------------------------ datasets


def _rows_to_tasks(rows, split: str, question: str, answer: str, answer_format: str, where: str,
                   limit: int | None) -> list[dict]:
    if answer_format not in ANSWER_FORMATS:
        raise UserError(f"must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}",
                        where="data.params.answer_format")
    tasks = []
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or question not in row or answer not in row:
            found = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise UserError(f"row {number} lacks column '{question}' or '{answer}' (has {found}); set "
                            "data.params.question / data.params.answer to the column names", where=where)
        target = extract_answer(row[answer], answer_format)
        if target is None:
            continue  # e.g. a MATH solution without \boxed{}: no gradeable answer
        task_id = row.get("id", row.get("unique_id", f"{split}-{number - 1}"))
        tasks.append({"id": str(task_id), "question": str(row[question]), "answer": target})
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise UserError(f"no task with a readable '{answer}' ({answer_format} format)", where=where)
    return tasks


def _chosen(split: str, path: Any, eval_path: Any) -> tuple[str, str]:
    key = "eval_path" if split == "eval" and eval_path else "path"
    name = eval_path if key == "eval_path" else path
    if not isinstance(name, str) or not name:
        raise UserError(f"must be a file name, got {type(name).__name__}", where=f"data.params.{key}")
    return key, name


def math_jsonl(split: str, seed: int, path: str, eval_path: str | None = None, question: str = "question",
               answer: str = "answer", answer_format: str = "plain", limit: int | None = None) -> list[dict]:
    """One JSON object per line, e.g. GSM8K (``answer_format: gsm8k``) or MATH (``math``)."""
    key, name = _chosen(split, path, eval_path)
    try:
        lines = read_bytes(name).decode("utf-8").splitlines()
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the task file: {exc}", where=f"data.params.{key} ({name})") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or a too-long integer
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else (
                    "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
                raise UserError(f"line {number} is not JSON: {reason}", where=name) from None
    return _rows_to_tasks(rows, split, question, answer, answer_format, name, limit)


def math_parquet(split: str, seed: int, path: str, eval_path: str | None = None, question: str = "question",
                 answer: str = "answer", answer_format: str = "plain", limit: int | None = None,
                 split_name: str | None = None) -> list[dict]:
    """A Parquet file (or glob), or a Hugging Face ``datasets`` directory written by ``save_to_disk``.

    A ``DatasetDict`` directory is read at ``split_name``, by default ``train`` for the train split and
    the first of ``test``/``validation``/``eval`` present for the eval split.
    """
    key, name = _chosen(split, path, eval_path)
    where = f"data.params.{key} ({name})"
    try:
        import datasets
    except ImportError:
        raise UserError("needs the `datasets` package: pip install datasets", where=where) from None
    try:
        if Path(name).is_dir() and any((Path(name) / f).exists() for f in ("dataset_dict.json", "state.json")):
            data = datasets.load_from_disk(name)
            if isinstance(data, datasets.DatasetDict):
                wanted = [split_name] if split_name else (["train"] if split == "train" else
                                                          ["test", "validation", "eval"])
                present = [s for s in wanted if s in data]
                if not present:
                    raise UserError(f"has splits {sorted(data)}, none of {wanted}; set data.params.split_name",
                                    where=where)
                data = data[present[0]]
        else:
            data = datasets.load_dataset("parquet", data_files=name, split="train")
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - missing file, not parquet, ...: a config problem
        raise UserError(f"cannot load the data set: {type(exc).__name__}: {exc}", where=where) from None
    return _rows_to_tasks(iter(data), split, question, answer, answer_format, where, limit)


def _fraction_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def math_synthetic(split: str, seed: int, size: int = 2000, max_operand: int = 9,
                   kinds: list[str] | tuple[str, ...] = ("add", "sub", "mul", "frac")) -> list[dict]:
    """Deterministic small problems for CPU runs: ``a+b``, ``a-b``, ``a*b`` and fraction sums ``a/b+c/d``.

    Answers are integers or reduced fractions (``5/6``); the eval split uses a disjoint seed stream.
    """
    allowed = {"add", "sub", "mul", "frac"}
    if not kinds or set(kinds) - allowed:
        raise UserError(f"kinds must be a non-empty subset of {sorted(allowed)}, got {kinds!r}",
                        where="data.params.kinds")
    if not isinstance(max_operand, int) or max_operand < 2:
        raise UserError(f"must be an integer >= 2, got {max_operand!r}", where="data.params.max_operand")
    rng = random.Random(seed * 7919 + (104729 if split == "eval" else 0))
    tasks = []
    for index in range(size):
        kind = kinds[index % len(kinds)]
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if kind == "frac":
            a, b, c, d = rng.randint(1, max_operand), rng.randint(2, max_operand), rng.randint(1, max_operand), \
                rng.randint(2, max_operand)
            question, value = f"{a}/{b}+{c}/{d}", Fraction(a, b) + Fraction(c, d)
        else:
            symbol = {"add": "+", "sub": "-", "mul": "*"}[kind]
            value = Fraction({"add": a + b, "sub": a - b, "mul": a * b}[kind])
            question = f"{a}{symbol}{b}"
        tasks.append({"id": f"{split}-{index}", "question": question, "answer": _fraction_text(value)})
    return tasks


@unimas.hookimpl
def unimas_workflows():
    return {"math_team": math_team}


@unimas.hookimpl
def unimas_rewards():
    return dict(REWARDS)


@unimas.hookimpl
def unimas_datasets():
    return {"math_jsonl": math_jsonl, "math_parquet": math_parquet, "math_synthetic": math_synthetic}
