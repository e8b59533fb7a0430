"""Three workflow shapes on exact-checked arithmetic, for the workflow x mapping matrix (docs/results.md).

The shapes are the ones compared in the literature on when multi-agent RL helps
LLM workflows; the task is small enough for a tiny character model to learn on
a CPU in minutes, and every role's contribution can be checked exactly, so each
episode's outcome carries ``role_scores`` (one number in [0, 1] per role) that
the ``role_score`` reward hands to the roles as per-role credit.

* ``evaluator_optimizer`` (generator, evaluator): ``a+b=`` -> the generator
  proposes; the evaluator answers ``=`` (accept), ``<`` (the sum is smaller)
  or ``>`` (larger); on ``<`` / ``>`` the generator revises with that feedback
  (prompt ``a+b=47<``), at most ``max_rounds`` times.
* ``voting`` (solver, aggregator): ``a+b+c=`` -> three solver turns, each on a
  different rotation of the terms (so greedy evaluation still gets three
  different votes); the aggregator reads ``a+b+c=x,y,z>`` and writes the answer.
* ``orchestrator_workers`` (orchestrator, worker): ``a+b+c+d=`` -> the
  orchestrator splits it (``a+b|c+d``), a worker turn solves each part, the
  orchestrator combines the partial sums (``a+b+c+d=x+y=``).

The role prompts below are the templates of the example configs
(``examples/wf_*_cpu.yaml``) and of the warm start (``examples/workflow_warm_start.py``).
"""

from __future__ import annotations

import random
import re

TERMS = re.compile(r"^\d+(\+\d+)*$")


def arithmetic_sums(split: str, seed: int, terms: int = 2, max_operand: int = 50, size: int = 2000) -> list[dict]:
    """``a+b(+c...)=`` problems with ``terms`` operands below ``max_operand``; eval uses a disjoint seed stream."""
    rng = random.Random(seed * 7919 + terms * 31 + (1 if split == "eval" else 0))
    tasks = []
    for index in range(size):
        operands = [rng.randrange(max_operand) for _ in range(terms)]
        tasks.append({"id": f"{split}-{index}", "question": "+".join(map(str, operands)) + "=",
                      "answer": str(sum(operands)), "terms": operands})
    return tasks


def scored(ctx, outcome: dict) -> dict:
    """Log each role's checked score as a workflow metric (``workflow/<role>_score``, ``eval/workflow/...``):
    under a team reward every role's ``role/<r>/reward_mean`` is the team's, so this is the only per-role
    view of who does their part."""
    for role, value in outcome["role_scores"].items():
        ctx.metric(f"{role}_score", value)
    return outcome


def _text(node) -> str:
    return "" if node.parsed is None else str(node.parsed).strip()


def value_of(expression: str) -> int | None:
    """The sum written as ``n+n+...`` (digits and pluses only), or None when it is not one."""
    expression = expression.strip()
    return sum(int(t) for t in expression.split("+")) if TERMS.match(expression) else None


def verdict_for(proposal: str, answer: str) -> str:
    """What a perfect evaluator says: ``=`` right, ``<`` the sum is smaller than the proposal, ``>`` larger."""
    if not proposal.isdigit():
        return "<" if len(proposal) > len(answer) else ">"
    return "=" if int(proposal) == int(answer) else ("<" if int(answer) < int(proposal) else ">")


async def evaluator_optimizer(ctx, task, max_rounds: int = 2) -> dict:
    """Propose, check, revise with the check's direction until accepted or ``max_rounds`` revisions are spent."""
    proposal = await ctx.act("generator", hint="")
    current, verdicts, proposals = proposal, [], [_text(proposal)]
    for _ in range(max_rounds):
        check = await ctx.act("evaluator", proposal=_text(current), after=[current])
        said = _text(check)
        verdicts.append(float(said == verdict_for(_text(current), task["answer"])))
        if said not in ("<", ">"):  # "=" accepts; anything unreadable also ends the loop (no usable feedback)
            break
        current = await ctx.act("generator", hint=f"{_text(current)}{said}", after=[current, check])
        proposals.append(_text(current))
    right = [float(p == task["answer"]) for p in proposals]
    return scored(ctx, {"answer": _text(current), "proposal": proposals[0], "revisions": len(proposals) - 1,
            "role_scores": {"generator": sum(right) / len(right),
                            "evaluator": sum(verdicts) / len(verdicts) if verdicts else 0.0}})


def rotations(terms: list[int], count: int) -> list[str]:
    """``count`` rotations of the terms as questions: ``a+b+c=``, ``b+c+a=``, ``c+a+b=`` ..."""
    return ["+".join(map(str, terms[k % len(terms):] + terms[:k % len(terms)])) + "=" for k in range(count)]


async def voting(ctx, task, solvers: int = 3) -> dict:
    """``solvers`` independent solver turns (one per rotation of the terms), then the aggregator's pick."""
    votes = [await ctx.act("solver", view=view) for view in rotations(task["terms"], solvers)]
    final = await ctx.act("aggregator", votes=",".join(_text(v) for v in votes), after=votes)
    right = [float(_text(v) == task["answer"]) for v in votes]
    answer = _text(final)
    return scored(ctx, {"answer": answer, "votes": [_text(v) for v in votes],
                        "role_scores": {"solver": sum(right) / len(right),
                                        "aggregator": float(answer == task["answer"])}})


def split_parts(text: str, terms: list[int]) -> list[str] | None:
    """The orchestrator's split as two sum expressions that together use exactly the task's terms, else None."""
    parts = text.strip().split("|")
    if len(parts) != 2 or not all(TERMS.match(p) for p in parts):
        return None
    used = sorted(int(t) for p in parts for t in p.split("+"))
    return parts if used == sorted(terms) else None


async def orchestrator_workers(ctx, task) -> dict:
    """Split into two parts, one worker turn per part, combine the partial sums; an invalid split fails."""
    plan = await ctx.act("orchestrator", stage="|")
    parts = split_parts(_text(plan), task["terms"])
    if parts is None:
        return scored(ctx, {"answer": None, "split": _text(plan),
                            "role_scores": {"orchestrator": 0.0, "worker": 0.0}})
    results = [await ctx.act("worker", part=part, after=[plan]) for part in parts]
    partials = [_text(r) for r in results]
    final = await ctx.act("orchestrator", stage="+".join(partials) + "=", after=results)
    answer = _text(final)
    workers_right = [float(p == str(value_of(part))) for p, part in zip(partials, parts)]
    combined = all(p.isdigit() for p in partials) and answer == str(sum(int(p) for p in partials))
    return scored(ctx, {"answer": answer, "split": _text(plan), "partials": partials,
                        "role_scores": {"orchestrator": 0.5 + 0.5 * float(combined),  # 0.5 for a valid split
                                        "worker": sum(workers_right) / len(workers_right)}})


def role_score(trajectory, task: dict) -> dict[str, float]:
    """Role-level credit: each role's own exactly checked contribution, ``outcome["role_scores"]`` (0 if absent)."""
    scores = trajectory.outcome.get("role_scores") or {}
    return {role: float(value) for role, value in scores.items()}


WORKFLOWS = {"evaluator_optimizer": evaluator_optimizer, "voting": voting, "orchestrator_workers": orchestrator_workers}
