"""Forking an episode at a recorded decision point.

A fork re-runs the workflow on the parent's task; the parent's first ``k``
turns are *replayed* — ``ctx.act`` returns the recorded result (text, token
ids, log-probs) instead of asking the model — and sampling starts fresh at
turn ``k``. Replay is keyed by turn id (``role#index``), so it is the same for
Python and YAML graph workflows, and it is checked: a replayed turn whose
rendered input differs from the recorded one (a non-deterministic tool, a
workflow that changed) stops the fork with :class:`ReplayDiverged` instead of
silently training on a different history.

Siblings forked from one parent at one point share their prefix token for
token, so credit can compare continuations of the same decision; each child
records ``forked_from`` (the parent's episode id) and ``fork_turn`` (its
first fresh turn), which makes the episodes of a task a tree
(:func:`episode_tree`). Replayed turns are marked ``replayed`` and are never
trained again: the parent already carries them.

Forking through the OpenAI-compatible gateway is not supported: an external
agent's HTTP calls have no stable turn ids to key a replay on.
"""

from __future__ import annotations

import networkx as nx

from unimas.controller.specs import EpisodeSpec, ReplayPrefix
from unimas.trajectory import GraphTrajectory, TurnNode


def fork_spec(parent: GraphTrajectory, k: int, episode_id: str) -> EpisodeSpec:
    """An episode spec that replays ``parent``'s first ``k`` turns and samples the rest; same task, same group."""
    return EpisodeSpec(episode_id, parent.task_id, parent.task, prefix=ReplayPrefix.of(parent, k))


def fork_specs(parent: GraphTrajectory, k: int, siblings: int, tag: str = "f") -> list[EpisodeSpec]:
    """``siblings`` forks of ``parent`` at turn ``k``, named ``<parent>/<tag><k>.<i>``."""
    return [fork_spec(parent, k, f"{parent.episode_id}/{tag}{k}.{i}") for i in range(siblings)]


def surprisal(turn: TurnNode) -> float:
    """Mean negative log-prob of a turn's sampled tokens: the entropy proxy branching methods rank turns by."""
    return -sum(turn.logprobs) / len(turn.logprobs) if turn.logprobs else 0.0


def sampled_tokens(trajectories: list[GraphTrajectory]) -> int:
    """Response tokens actually sampled (replayed turns cost nothing): the unit of equal-budget comparisons."""
    return sum(len(t.response_ids) for traj in trajectories for t in traj.turns() if not t.replayed)


def episode_tree(trajectories: list[GraphTrajectory]) -> nx.DiGraph:
    """Parent -> child edges (with the fork turn) among ``trajectories``; roots are the freshly sampled episodes."""
    tree = nx.DiGraph()
    for traj in trajectories:
        tree.add_node(traj.episode_id, task=traj.task_id)
    for traj in trajectories:
        if traj.forked_from is not None:
            tree.add_edge(traj.forked_from, traj.episode_id, fork_turn=traj.fork_turn)
    return tree

