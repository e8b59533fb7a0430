"""Each built-in method on hand-built trajectories, against advantages / choices / orders computed by hand."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from unimas_plugins.methods.branching import choose_forks
from unimas_plugins.methods.budget import extra_samples
from unimas_plugins.methods.counterfactual import counterfactual
from unimas_plugins.methods.gagpo import gagpo
from unimas_plugins.methods.gdpo import gdpo
from unimas_plugins.methods.hgpo import hgpo
from unimas_plugins.methods.m2po import m2po, second_moment_mask
from unimas_plugins.methods.passthrough import passthrough
from unimas_plugins.methods.replay import VerifiedSuccesses
from unimas_plugins.methods.seeupo import ReverseExecution

from unimas.algorithms.credit import CreditedTurn
from unimas.algorithms.losses import resolve_policy_loss
from unimas.config import plugin_params
from unimas.contract.registry import build_registry
from unimas.controller.specs import EpisodeSpec
from unimas.errors import ModelGroupError, UserError
from unimas.groups.base import TrainTurn
from unimas.training.update_order import execution_order, update_groups
from unimas.trajectory import GraphTrajectory, TurnNode


def episode(eid, task, turns, reward, **fields):
    """``turns``: (role, prompt_ids, logprobs) triples; every turn gets the episode's team ``reward``."""
    traj = GraphTrajectory(episode_id=eid, task_id=task, task={"id": task}, **fields)
    counts = {}
    for role, prompt_ids, logprobs in turns:
        index = counts.get(role, 0)
        counts[role] = index + 1
        traj.add_node(TurnNode(id=f"{role}#{index}", role=role, model_group="m", prompt="", prompt_ids=prompt_ids,
                               response_ids=[1] * len(logprobs), logprobs=logprobs, role_turn_index=index,
                               reward=reward))
    return traj


def credited(trajectories, roles=None):
    return [CreditedTurn(t, turn, f"{t.task_id}|{turn.role}") for t in trajectories for turn in t.turns()
            if roles is None or turn.role in roles]


def test_hgpo_weights_the_same_history_group_above_the_task_group():
    eps = [episode(f"e{i}", "t", [("listener", prompt, [-1.0])], r)
           for i, (prompt, r) in enumerate([([1, 2], 1.0), ([1, 2], 0.0), ([1, 3], 1.0), ([1, 3], 1.0)])]
    signal = hgpo(alpha=2.0, norm_by_std=False)(credited(eps))
    # level 0 (task mean 0.75): .25 -.75 .25 .25; level 1 (history means .5 and 1): .5 -.5 0 0; (a0 + 2 a1) / 3
    assert signal == pytest.approx([1.25 / 3, -1.75 / 3, 0.25 / 3, 0.25 / 3])


def test_gagpo_td_advantages_from_the_grouped_value_proxy():
    eps = [episode("a", "t", [("speaker", [1], [-1.0]), ("listener", [1, 5], [-1.0])], 1.0),
           episode("b", "t", [("speaker", [1], [-1.0]), ("listener", [1, 6], [-1.0])], 0.0),
           episode("c", "t", [("speaker", [1], [-1.0]), ("listener", [1, 5], [-1.0])], 0.0)]
    signal = gagpo(gamma=1.0, lam=1.0)(credited(eps))
    # V(speaker) = 1/3; V(listener [1,5]) = 1/2; [1,6] is seen once -> the task mean 1/3
    assert signal == pytest.approx([2 / 3, 0.5, -1 / 3, -1 / 3, -1 / 3, -0.5])
    lam0 = gagpo(gamma=1.0, lam=0.0)(credited(eps))  # one-step TD: speaker gets V(listener) - V(speaker)
    assert lam0 == pytest.approx([1 / 6, 0.5, 0.0, -1 / 3, 1 / 6, -0.5])


def test_counterfactual_credit_compares_siblings_of_one_decision():
    parent = episode("p", "t", [("solver", [1], [-1.0]), ("verifier", [1, 2], [-1.0])], 0.0)
    kids = [episode(f"p/f1.{i}", "t", [("solver", [1], [-1.0]), ("verifier", [1, 2], [-1.0])], r,
                    forked_from="p", fork_turn="verifier#0") for i, r in enumerate([1.0, 0.0])]
    for kid in kids:
        kid.turns()[0].replayed = True
    other = episode("q", "t", [("solver", [1], [-1.0]), ("verifier", [1, 3], [-1.0])], 1.0)
    turns = credited([parent, other]) + [c for c in credited(kids) if not c.turn.replayed]
    signal = counterfactual()(turns)
    # turns: p.solver, p.verifier, q.solver, q.verifier, kid0.verifier, kid1.verifier
    # sibling set {p, kid0, kid1} at verifier#0 with returns 0, 1, 0 (leave-one-out); solvers p, q: 0 vs 1
    assert signal == pytest.approx([-1.0, -0.5, 1.0, 0.0, 1.0, -0.5])
    assert turns[1].key == turns[4].key == "p|verifier#0"


def test_gdpo_normalises_each_channel_in_its_group_before_summing():
    eps = [episode(f"e{i}", "t", [("solver", [1], [-1.0])], 0.0) for i in range(4)]
    for traj, a, b in zip(eps, [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]):
        traj.rewards = {"team": a, "fix": {"solver": b}}
    signal = gdpo(channels=["team", "fix"])(credited(eps))
    # per channel: (x - mean) / (unbiased std + 1e-6); summed; then whitened over the batch (verl masked_whiten)
    a = [(x - 0.5) / (math.sqrt(1 / 3) + 1e-6) for x in [1, 0, 1, 0]]
    b = [(x - 0.25) / (0.5 + 1e-6) for x in [0, 0, 0, 1]]
    total = [x + y for x, y in zip(a, b)]
    mean = sum(total) / 4
    var = sum((x - mean) ** 2 for x in total) / 3
    assert signal == pytest.approx([(x - mean) / math.sqrt(var + 1e-8) for x in total], abs=1e-4)
    for bad in ({"channels": []}, {"channels": ["team"], "weights": [1.0, 2.0]}):  # its params model says no
        with pytest.raises(UserError, match=r"algorithm\.credit\.params"):
            plugin_params.bind(gdpo, "gdpo", bad, "algorithm.credit.params")


def test_entropy_branching_forks_the_most_uncertain_turn_and_mixed_branching_the_contested_tasks():
    root = episode("r", "t", [("a", [1], [-0.1]), ("b", [2], [-2.0, -2.0]), ("c", [3], [-0.5])], 1.0)
    assert [(p.episode_id, k, n) for p, k, n in choose_forks([root], 3, "entropy")] == [("r", 1, 3)]
    assert choose_forks([root], 3, "entropy", min_turn=2)[0][1] == 2
    roots = [episode("x0", "t1", [("a", [1], [-1.0]), ("b", [2], [-1.0])], 1.0),
             episode("x1", "t1", [("a", [1], [-1.0]), ("b", [2], [-1.0])], 0.0),
             episode("y0", "t2", [("a", [1], [-1.0]), ("b", [2], [-1.0])], 1.0),
             episode("y1", "t2", [("a", [1], [-1.0]), ("b", [2], [-1.0])], 1.0)]
    assert [(p.episode_id, k) for p, k, _ in choose_forks(roots, 1, "mixed")] == [("x0", 1), ("x1", 1)]


def test_adaptive_budget_spends_the_rest_on_mixed_tasks_only():
    assert extra_samples({"a": [1, 0], "b": [1, 1], "c": [0, 1]}, 5) == {"a": 3, "c": 2}
    assert extra_samples({"b": [1, 1]}, 5) == {}


class RecordingTransport:
    """Records update calls (group, roles of the turns, advantages) and reports a fixed ppo_kl."""

    def __init__(self):
        self.calls = []

    async def update(self, group, turns):
        self.calls.append((group, [t.adapter for t in turns], [t.advantage for t in turns]))
        return {"ppo_kl": 0.5, "policy_loss": float(len(self.calls))}


def train_turn(role, advantage=1.0, episode=""):
    return TrainTurn(prompt_ids=[1], response_ids=[2], rollout_logprobs=[-1.0], advantage=advantage, adapter=role,
                     episode=episode)


class ScoringTransport(RecordingTransport):
    """Also scores turns: a turn's new log-prob is its behaviour log-prob plus its role's shift."""

    def __init__(self, shift):
        super().__init__()
        self.shift, self.scored = shift, []

    async def score(self, group, turns):
        self.scored.append([t.adapter for t in turns])
        return [sum(t.rollout_logprobs) + self.shift[t.adapter] for t in turns]


def test_seeupo_ratio_clip_weighs_a_role_by_the_ratios_the_earlier_stage_moved_in_its_episode():
    turns = {"team": [train_turn("solver", episode="e1"), train_turn("verifier", episode="e1"),
                      train_turn("verifier", episode="e2"), train_turn("verifier", episode="e2"),
                      train_turn("solver", episode="e2"), train_turn("solver", episode="e3")]}
    roles = {"team": [t.adapter for t in turns["team"]]}  # the helper keeps the role in `adapter`
    transport = ScoringTransport({"verifier": math.log(1.1), "solver": 0.0})
    asyncio.run(update_groups(transport, turns, roles, ReverseExecution(ratio_clip=0.2), ["solver", "verifier"]))
    assert [r for _, r, _ in transport.calls] == [["verifier"] * 3, ["solver"] * 3]
    assert transport.scored == [["verifier"] * 3]  # after the first stage only: nothing follows the last
    # e1: one verifier turn, ratio 1.1; e2: two, 1.1 * 1.1 = 1.21 clipped to 1.2; e3: none, 1.0
    assert transport.calls[1][2] == pytest.approx([1.1, 1.2, 1.0])
    assert transport.calls[0][2] == [1.0, 1.0, 1.0]  # the first stage is not reweighted
    plain = ScoringTransport({"verifier": 1.0, "solver": 0.0})
    asyncio.run(update_groups(plain, turns, roles, ReverseExecution(), ["solver", "verifier"]))
    assert plain.scored == [] and plain.calls[1][2] == [1.0, 1.0, 1.0]  # no ratios asked for: no scoring


def test_an_order_needing_ratios_on_a_backend_that_cannot_score_is_a_user_error():
    class Unscorable(RecordingTransport):
        async def score(self, group, turns):
            raise ModelGroupError(group, "score", NotImplementedError(f"model group '{group}' cannot score turns"))

    turns = {"team": [train_turn("solver", episode="e"), train_turn("verifier", episode="e")]}
    with pytest.raises(UserError, match="needs probability ratios, and model group 'team' cannot score turns"):
        asyncio.run(update_groups(Unscorable(), turns, {"team": ["solver", "verifier"]},
                                  ReverseExecution(ratio_clip=0.2), ["solver", "verifier"]))


def test_seeupo_updates_roles_one_by_one_in_reverse_execution_order_even_on_a_shared_model():
    order = execution_order([(2.0, "verifier"), (1.0, "solver"), (3.0, "verifier")])
    assert order == ["solver", "verifier"]
    turns = {"team": [train_turn("solver"), train_turn("verifier"), train_turn("solver")]}
    roles = {"team": ["solver", "verifier", "solver"]}
    transport = RecordingTransport()
    stats = asyncio.run(update_groups(transport, turns, roles, ReverseExecution(damp=1.0), order))
    assert [(g, r) for g, r, _ in transport.calls] == [("team", ["verifier"]), ("team", ["solver", "solver"])]
    assert transport.calls[1][2] == pytest.approx([math.exp(-0.5)] * 2)  # damped by the verifier's ppo_kl
    assert stats["team"]["policy_loss"] == pytest.approx(1.5)  # mean over the group's two stages
    parallel = RecordingTransport()
    asyncio.run(update_groups(parallel, turns, roles, None, order))
    assert len(parallel.calls) == 1 and parallel.calls[0][2] == [1.0, 1.0, 1.0]


def test_update_order_that_forgets_a_role_is_refused():
    class OnlyFirst(ReverseExecution):
        def stages(self, execution):
            return [execution[:1]]

    with pytest.raises(ValueError, match="exactly once"):
        asyncio.run(update_groups(RecordingTransport(), {"team": [train_turn("solver"), train_turn("verifier")]},
                                  {"team": ["solver", "verifier"]}, OnlyFirst(), ["solver", "verifier"]))


class Session:
    step = 7

    def score(self, trajectories):  # rewards are set by hand on these episodes
        pass


def test_replay_of_verified_successes_fills_all_failure_groups_with_staleness():
    buffer = VerifiedSuccesses(threshold=1.0, per_task=2, per_group=1, revisit=0.5)
    win, loss = episode("s3-t0-g0", "s3-t0", [("a", [1], [-1.0])], 1.0), episode("s3-t1-g0", "s3-t1",
                                                                                 [("a", [1], [-1.0])], 0.0)
    win.task, loss.task = {"id": "q1"}, {"id": "q2"}
    buffer.observe([win, loss], step=3)
    assert list(buffer.kept) == ["q1"]
    specs = [EpisodeSpec("s7-t0-g0", "s7-t0", {"id": "q5"}), EpisodeSpec("s7-t1-g0", "s7-t1", {"id": "q6"})]
    revisited = buffer.revisit(specs, 7)
    assert [s.task for s in revisited] == [{"id": "q5"}, {"id": "q1"}] and revisited[1].task_uid == "s7-t1"
    fresh = [episode("s7-t1-g0", "s7-t1", [("a", [1], [-1.0])], 0.0),
             episode("s7-t1-g1", "s7-t1", [("a", [1], [-1.0])], 0.0)]
    for t in fresh:
        t.task = {"id": "q1"}
    [copy] = buffer.mix(fresh, Session())
    assert copy.task_id == "s7-t1" and copy.turns()[0].staleness == 4 and copy.turns()[0].reward is None
    fresh[0].turns()[0].reward = 1.0  # a group that already has a success needs no replay
    assert buffer.mix(fresh, Session()) == []


def test_m2po_masks_the_largest_log_ratios_until_the_second_moment_fits():
    log_ratio = torch.tensor([[0.0, 0.05, -0.3, 0.5]])
    mask = torch.ones(1, 4)
    # squares 0, .0025, .09, .25: mean .0856 > .01 -> drop .25 -> .0308 > .01 -> drop .09 -> .00125 fits
    assert second_moment_mask(log_ratio, mask, tau=0.01).tolist() == [[1.0, 1.0, 0.0, 0.0]]
    old = torch.zeros(1, 4)
    advantages = torch.full((1, 4), 2.0)
    loss, metrics = m2po(old, log_ratio, advantages, mask, "token-mean", None)  # clip 0.2 -> tau 0.01
    assert loss.item() == pytest.approx(-(2 * 1.0 + 2 * math.exp(0.05)) / 2)
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(0.5)
    fresh_loss, fresh = m2po(old, torch.zeros(1, 4), advantages, mask, "token-mean", None)
    assert float(fresh["actor/pg_clipfrac"]) == 0.0 and fresh_loss.item() == pytest.approx(-2.0)
    # algorithm.loss_params: {tau: 0.04} is bound when the loss is resolved: only the .25 is dropped then
    loose = resolve_policy_loss("m2po", build_registry(), params={"tau": 0.04})
    _, metrics = loose(old, log_ratio, advantages, mask, loss_agg_mode="token-mean", config=None)
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(0.25)


def test_passthrough_hands_the_signal_on():
    scores = torch.tensor([[0.5], [-1.0]])
    advantages, returns = passthrough(scores, torch.ones_like(scores))
    assert advantages.tolist() == [[0.5], [-1.0]] and returns.tolist() == [[0.5], [-1.0]]
