"""Debate: two debaters argue opposite answers to a question, a frozen judge decides.

Roles (names are workflow params, defaults below): ``debater_a`` defends
``task["side_a"]``, ``debater_b`` defends ``task["side_b"]``, ``judge`` reads
the whole exchange and names the winner, ``A`` or ``B``. Exactly one side is
true: ``task["answer"]`` is the label (``A``/``B``) of the debater holding it,
so whether the judge found the truth is checkable. The judge is meant to be
frozen (a ``trainable: false`` group or the ``openai`` backend); the debaters
may share one policy (self-play of one policy against itself), use separate
groups, or LoRA adapters on one base. See ``docs/workflows/debate.md``.

Template variables each turn gets, besides the task's keys (``question``,
``side_a``, ``side_b``, ...; never put ``{answer}`` or ``{truth}`` in a
template: they give the truth away):

* debaters: ``side`` (own position), ``opponent_side``, ``opponent`` (the
  opponent's latest argument, or a placeholder), ``transcript`` (every
  argument so far), ``round`` (1-based) and ``rounds``;
* judge: ``transcript`` (every argument).
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import unimas

NO_ARGUMENT = "(no argument yet)"
LABEL = re.compile(r"(?:debater\s*)?([ab])(?:\s*[.!])?", re.IGNORECASE)
"""A judge's label, matched against the stripped text with ``fullmatch``: no two ``\\s*`` can trade the same
spaces, which made ``"a" + " " * 40_000 + "x"`` take seconds (quadratic backtracking)."""


# -- workflow -----------------------------------------------------------------------------------------

def _line(label: str, side: str, turn: unimas.TurnNode) -> str:
    return f"{label} ({side}): {turn.text.strip()}"


def verdict_label(parsed: Any, task: dict) -> str | None:
    """The judge's parsed answer as ``"A"``/``"B"``: a label (``A``, ``b``, ``Debater A``) or a side's text."""
    if parsed is None:
        return None
    text = str(parsed).strip()
    match = LABEL.fullmatch(text)
    if match:
        return match.group(1).upper()
    lowered = text.lower()
    sides = {"A": str(task.get("side_a", "")).strip().lower(), "B": str(task.get("side_b", "")).strip().lower()}
    chosen = [label for label, side in sides.items() if side and side == lowered]
    return chosen[0] if len(chosen) == 1 else None


async def debate(ctx, task: dict, rounds: int = 2, order: str = "sequential", debaters: tuple = ("debater_a",
                 "debater_b"), judge: str = "judge") -> dict:
    """``rounds`` exchanges of arguments, then one judge turn.

    ``order: sequential``: in each round A argues, then B answers A's new
    argument. ``order: simultaneous``: both argue at once, each seeing the
    other's argument of the previous round.
    """
    if rounds < 1:
        raise unimas.UserError(f"rounds must be >= 1, got {rounds}", where="workflow.params.rounds")
    if order not in ("sequential", "simultaneous"):
        raise unimas.UserError(f"order must be 'sequential' or 'simultaneous', got {order!r}",
                               where="workflow.params.order")
    role_a, role_b = debaters
    sides = {role_a: task["side_a"], role_b: task["side_b"]}
    labels = {role_a: "A", role_b: "B"}
    spoken: list[unimas.TurnNode] = []
    latest: dict[str, unimas.TurnNode | None] = {role_a: None, role_b: None}

    def transcript() -> str:
        return "\n".join(_line(labels[t.role], sides[t.role], t) for t in spoken) or NO_ARGUMENT

    def argue(role: str, other: str, number: int, seen: list[unimas.TurnNode]):
        opponent = latest[other]
        return ctx.act(role, side=sides[role], opponent_side=sides[other],
                       opponent=opponent if opponent is not None else NO_ARGUMENT,
                       transcript=transcript(), round=number, rounds=rounds,
                       after=[t for t in seen if t is not opponent])

    for number in range(1, rounds + 1):
        if order == "simultaneous":
            before = list(spoken)
            turn_a, turn_b = await asyncio.gather(argue(role_a, role_b, number, before),
                                                  argue(role_b, role_a, number, before))
            spoken += [turn_a, turn_b]
            latest.update({role_a: turn_a, role_b: turn_b})
        else:
            turn_a = await argue(role_a, role_b, number, list(spoken))
            spoken.append(turn_a)
            latest[role_a] = turn_a
            turn_b = await argue(role_b, role_a, number, list(spoken))
            spoken.append(turn_b)
            latest[role_b] = turn_b
    decision = await ctx.act(judge, transcript=transcript(), after=spoken)
    verdict = verdict_label(decision.parsed, task)
    return {"verdict": verdict, "answer": verdict, "winner_side": {"A": task["side_a"], "B": task["side_b"]}.get(
        verdict), "debaters": [role_a, role_b], "judge": judge, "rounds": rounds}


# -- rewards ------------------------------------------------------------------------------------------

def judge_correct(trajectory: unimas.GraphTrajectory, task: dict) -> float:
    """Trajectory level: 1.0 when the judge sided with the debater holding the true answer."""
    return float(trajectory.outcome.get("verdict") is not None and trajectory.outcome["verdict"] == task["answer"])


def debate_winner(trajectory: unimas.GraphTrajectory, task: dict, win: float = 1.0, lose: float = -1.0,
                  no_verdict: float = 0.0) -> dict[str, float]:
    """Role level: ``win`` to the debater the judge picked, ``lose`` to the other, ``no_verdict`` to both when
    the judge's output named neither (zero-sum by default)."""
    role_a, role_b = trajectory.outcome.get("debaters", ("debater_a", "debater_b"))
    verdict = trajectory.outcome.get("verdict")
    if verdict not in ("A", "B"):
        return {role_a: no_verdict, role_b: no_verdict}
    return {role_a: win if verdict == "A" else lose, role_b: win if verdict == "B" else lose}


def debate_on_side(trajectory: unimas.GraphTrajectory, task: dict) -> dict[str, float]:
    """Turn level format reward: 1.0 for a debater turn that parsed and states its own side (as a word)."""
    role_a, role_b = trajectory.outcome.get("debaters", ("debater_a", "debater_b"))
    sides = {role_a: str(task["side_a"]), role_b: str(task["side_b"])}
    scores = {}
    for turn in trajectory.turns():
        if turn.role in sides:
            pattern = rf"(?<!\w){re.escape(sides[turn.role])}(?!\w)"
            stated = re.search(pattern, turn.text, re.IGNORECASE) is not None
            scores[turn.id] = float(turn.parse_error is None and stated)
    return scores


# -- dataset ------------------------------------------------------------------------------------------

def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def _claim(kind: str, rng: random.Random, max_number: int) -> tuple[str, str, str]:
    """(question, true answer, false answer) of one synthetic claim with a known answer."""
    if kind == "prime":
        want = rng.random() < 0.5
        n = rng.randrange(2, max_number + 1)
        while _is_prime(n) != want and any(_is_prime(k) == want for k in range(2, max_number + 1)):
            n = rng.randrange(2, max_number + 1)
        truth = "yes" if _is_prime(n) else "no"
        return f"Is {n} a prime number?", truth, "no" if truth == "yes" else "yes"
    if kind == "sum":
        a, b = rng.randrange(max_number), rng.randrange(max_number)
        shown = a + b if rng.random() < 0.5 else a + b + rng.choice([-2, -1, 1, 2, 10])
        truth = "yes" if shown == a + b else "no"
        return f"Is {a}+{b} equal to {shown}?", truth, "no" if truth == "yes" else "yes"
    if kind == "compare":
        x, y = rng.sample(range(max_number + 1), 2)
        return f"Which number is larger, {x} or {y}?", str(max(x, y)), str(min(x, y))
    raise unimas.UserError(f"unknown claim kind {kind!r}; use prime, sum or compare", where="data.params.kinds")


def debate_claims(split: str, seed: int, size: int = 200, kinds: list[str] | tuple = ("prime", "sum", "compare"),
                  max_number: int = 100) -> list[dict]:
    """Deterministic synthetic claims with a known answer; which debater holds the truth is a coin flip.

    Each task: ``question``, ``side_a``, ``side_b`` (the two positions), ``truth`` (the true position) and
    ``answer`` (``A`` or ``B``: the debater holding it). The eval split uses a disjoint seed stream.
    """
    if max_number < 3:
        raise unimas.UserError(f"max_number must be >= 3, got {max_number}", where="data.params.max_number")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    if not kinds:
        raise unimas.UserError("kinds is empty; use some of prime, sum, compare", where="data.params.kinds")
    rng = random.Random(seed * 7919 + (1 if split == "eval" else 0) + 104729)
    tasks = []
    for index in range(size):
        kind = kinds[index % len(kinds)]
        question, truth, false = _claim(kind, rng, max_number)
        a_is_true = rng.random() < 0.5
        side_a, side_b = (truth, false) if a_is_true else (false, truth)
        tasks.append({"id": f"{split}-{index}", "kind": kind, "question": question, "side_a": side_a,
                      "side_b": side_b, "truth": truth, "answer": "A" if a_is_true else "B"})
    return tasks


# -- registration -------------------------------------------------------------------------------------

@unimas.hookimpl
def unimas_workflows():
    return {"debate": debate}


@unimas.hookimpl
def unimas_rewards():
    return {"judge_correct": judge_correct, "debate_winner": debate_winner, "debate_on_side": debate_on_side}


@unimas.hookimpl
def unimas_datasets():
    return {"debate_claims": debate_claims}
