"""Retrieval QA: query rewriter -> retrieve (a tool) -> optional evidence selector -> answerer.

Roles (names fixed, templates in the config): ``rewriter`` writes a search query; ``selector`` (only
with ``use_selector``) names the useful passages; ``answerer`` answers from the evidence. With
``rounds > 1`` the loop repeats (multi-hop): the rewriter sees the evidence gathered so far and the
previous draft answer, and evidence accumulates (deduplicated by passage id). A retriever that fails
(timeout, HTTP error, ...) is recorded on its tool node; the round goes on with the evidence it has.

Rewards: ``qa_exact_match`` and ``qa_f1`` (answer normalisation as in SQuAD: lower case, no
punctuation, no articles a/an/the, single spaces; a list target = any of its aliases) and the
turn-level ``qa_f1_delta``: round r's answerer F1 minus round r-1's (0 before the first), given to the
answerer and rewriter turns of round r. Data: ``retrieval_qa_synthetic``, questions over the offline
synthetic world that ``bm25_search`` indexes by default. See docs/workflows/retrieval_qa.md.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from unimas_plugins.retrievers import format_passages, synthetic_questions

import unimas

ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = str.maketrans("", "", string.punctuation)


def _value(node: Any) -> Any:
    return node.parsed if node.parse_error is None else None


async def retrieval_qa(ctx: unimas.EpisodeContext, task: dict, k: int = 3, use_selector: bool = False,
                       rounds: int = 1, retriever: str = "bm25_search", retriever_args: dict | None = None,
                       max_evidence_chars: int = 600) -> dict:
    """One episode; ``workflow.params`` give every keyword (``retriever_args`` go to each retriever call)."""
    if not isinstance(rounds, int) or rounds < 1:
        raise unimas.UserError(f"rounds must be an integer >= 1, got {rounds!r}", where="workflow.params.rounds")
    if not isinstance(k, int) or not 1 <= k <= 50:
        raise unimas.UserError(f"k must be an integer between 1 and 50, got {k!r}", where="workflow.params.k")
    passages: list[dict] = []
    evidence, draft = "(none yet)", "(none yet)"
    answers, queries, errors = [], [], []
    previous: list[Any] = []
    for _ in range(rounds):
        rewrite = await ctx.act("rewriter", evidence=evidence, draft=draft, after=previous)
        query = rewrite.parsed if rewrite.parse_error is None and str(rewrite.parsed).strip() else task["question"]
        queries.append(str(query))
        search = await ctx.tool(retriever, query=str(query), k=k, after=[rewrite], **(retriever_args or {}))
        if search.error is not None:
            errors.append(search.error)
        elif isinstance(search.result, list):
            seen = {p.get("id") for p in passages}
            passages += [p for p in search.result if isinstance(p, dict) and p.get("id") not in seen]
        evidence = format_passages(passages, max_chars=max_evidence_chars)
        consumed = [search]
        if use_selector:  # every round, so rounds line up by role_turn_index (on "(no passages)" too)
            select = await ctx.act("selector", passages=evidence, after=[search])
            evidence = format_passages(passages, selection=select.parsed if select.parse_error is None else None,
                                       max_chars=max_evidence_chars)
            consumed.append(select)
        answer = await ctx.act("answerer", evidence=evidence, after=consumed)
        answers.append(_value(answer))
        draft = answer.text.strip() or "(empty)"
        previous = [answer]
    return {"answer": answers[-1], "answers": answers, "queries": queries,
            "retrieved": [p.get("id") for p in passages], "retrieval_errors": errors}


# -- rewards ------------------------------------------------------------------------------------------

def normalize_answer(text: Any) -> str:
    """SQuAD normalisation: lower case, punctuation and the articles a/an/the removed, whitespace collapsed."""
    text = str(text if text is not None else "").lower().translate(PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def _targets(task: dict, target: str) -> list[str]:
    gold = task[target]
    return [str(g) for g in gold] if isinstance(gold, (list, tuple)) else [str(gold)]


def em_score(prediction: Any, gold: str) -> float:
    return float(prediction is not None and normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: Any, gold: str) -> float:
    """Token F1 of the normalised strings; 1.0 when both are empty."""
    predicted = normalize_answer(prediction).split() if prediction is not None else []
    expected = normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected and prediction is not None)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def qa_exact_match(trajectory: unimas.GraphTrajectory, task: dict, field: str = "answer",
                   target: str = "answer") -> float:
    """1.0 when the normalised ``outcome[field]`` equals a normalised ``task[target]`` (or one of a list)."""
    return max(em_score(trajectory.outcome.get(field), gold) for gold in _targets(task, target))


def qa_f1(trajectory: unimas.GraphTrajectory, task: dict, field: str = "answer", target: str = "answer") -> float:
    """Token F1 of ``outcome[field]`` against ``task[target]`` (best over a list of aliases)."""
    return max(f1_score(trajectory.outcome.get(field), gold) for gold in _targets(task, target))


def qa_f1_delta(trajectory: unimas.GraphTrajectory, task: dict, answer_role: str = "answerer",
                roles: list[str] | None = None, target: str = "answer") -> dict[str, float]:
    """Turn level: each round's F1 improvement, for the answerer and rewriter turns of that round.

    Round r is the answerer's turn with ``role_turn_index`` r; its F1 is that turn's parsed answer
    (0 on a parse error) against the target. Round r's delta, F1_r - F1_{r-1} (F1_{-1} = 0), goes to
    the turn of index r of every role in ``roles`` (default ``[rewriter, answerer]``); the deltas of
    one role sum to the last round's F1.
    """
    credited = roles if roles is not None else ["rewriter", answer_role]
    golds = _targets(task, target)
    scores: dict[str, float] = {}
    before = 0.0
    for turn in sorted(trajectory.turns(answer_role), key=lambda t: t.role_turn_index):
        f1 = max(f1_score(_value(turn), gold) for gold in golds)
        for role in credited:
            for other in trajectory.turns(role):
                if other.role_turn_index == turn.role_turn_index:
                    scores[other.id] = f1 - before
        before = f1
    return scores


# -- data ---------------------------------------------------------------------------------------------

def retrieval_qa_synthetic(split: str, seed: int, world_seed: int = 0, people: int = 60,
                           eval_every: int = 5, size: int | None = None) -> list[dict]:
    """Two-hop questions over :func:`unimas_plugins.retrievers.synthetic_world`; no download, no randomness
    beyond ``world_seed``. Every ``eval_every``-th author's questions form the eval split, the rest train.
    Pass the same ``world_seed`` / ``people`` to ``bm25_search`` (its defaults match these)."""
    if not isinstance(eval_every, int) or eval_every < 2:
        raise unimas.UserError(f"eval_every must be an integer >= 2, got {eval_every!r}", where="data.params")
    try:
        questions = synthetic_questions(world_seed, people)
    except ValueError as exc:
        raise unimas.UserError(str(exc), where="data.params.people") from None
    chosen = [q for q in questions if (int(q["id"].split("-")[1]) % eval_every == 0) == (split == "eval")]
    return chosen[:size] if size is not None else chosen


@unimas.hookimpl
def unimas_workflows():
    return {"retrieval_qa": retrieval_qa}


@unimas.hookimpl
def unimas_rewards():
    return {"qa_exact_match": qa_exact_match, "qa_f1": qa_f1, "qa_f1_delta": qa_f1_delta}


@unimas.hookimpl
def unimas_datasets():
    return {"retrieval_qa_synthetic": retrieval_qa_synthetic}
