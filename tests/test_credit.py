import numpy as np
import pytest

from unimas.config import AlgorithmConfig, RewardConfig
from unimas.credit import CreditedTurn, estimate_advantages, group_key, score_episode, turn_credit
from unimas.errors import UserError
from unimas.trajectory import GraphTrajectory, TurnNode


def episode(eid, task_id, solver_right, verifier_right):
    traj = GraphTrajectory(episode_id=eid, task_id=task_id, task={"answer": "4"})
    traj.add_node(TurnNode(id="solver#0", role="solver", model_group="m", prompt="", text="x"))
    traj.add_node(TurnNode(id="verifier#0", role="verifier", model_group="m", prompt="", text="y"), ["solver#0"])
    traj.add_node(TurnNode(id="verifier#1", role="verifier", model_group="m", prompt="", text="z",
                           role_turn_index=1), ["verifier#0"])
    traj.outcome = {"answer": "4" if verifier_right else "5", "proposal": "4" if solver_right else "3"}
    return traj


REWARDS = {
    "team": lambda t, task: float(t.outcome["answer"] == task["answer"]),
    "fix": lambda t, task: {"verifier": float(t.outcome["answer"] == "4") - float(t.outcome["proposal"] == "4")},
    "bonus": lambda t, task: {"verifier#1": 0.25},
}


def test_credit_rule_combines_levels_weights_and_role_filters():
    specs = [RewardConfig(name="team", level="trajectory", weight=2.0),
             RewardConfig(name="fix", level="role", weight=1.0, roles=["verifier"]),
             RewardConfig(name="bonus", level="turn", weight=4.0)]
    traj = episode("e", "t", solver_right=False, verifier_right=True)
    score_episode(traj, specs, REWARDS)
    credit = {turn.id: turn_credit(traj, turn, specs) for turn in traj.turns()}
    assert credit == {"solver#0": 2.0, "verifier#0": 3.0, "verifier#1": 4.0}


def test_failed_episode_scores_zero_without_calling_rewards():
    traj = episode("e", "t", True, True)
    traj.error = "RuntimeError: boom"
    specs = [RewardConfig(name="team"), RewardConfig(name="fix", level="role")]
    score_episode(traj, specs, {"team": None, "fix": None})
    assert traj.rewards == {"team": 0.0, "fix": {}}


def test_reward_of_the_wrong_shape_is_a_user_error():
    traj = episode("e", "t", True, True)
    with pytest.raises(UserError, match="must return a number"):
        score_episode(traj, [RewardConfig(name="fix", level="trajectory")], REWARDS)


def test_grouping_keys():
    turn = TurnNode(id="v#1", role="v", model_group="m", prompt="", role_turn_index=1)
    assert group_key("role", "t0", turn) == "t0|v"
    assert group_key("role_turn", "t0", turn) == "t0|v|1"
    assert group_key("trajectory", "t0", turn) == "t0"


def credited(values, keys):
    return [CreditedTurn(None, None, v, k) for v, k in zip(values, keys)]


def test_grpo_normalises_within_each_group_only():
    turns = credited([1.0, 0.0, 1.0, 0.0, 5.0, 5.0], ["a", "a", "a", "a", "b", "b"])
    stats = estimate_advantages(turns, AlgorithmConfig(estimator="grpo"), "grpo")
    adv = np.array([t.advantage for t in turns])
    assert adv[:4].mean() == pytest.approx(0.0, abs=1e-5)
    assert adv[0] > 0 > adv[1]
    assert adv[4:] == pytest.approx([0.0, 0.0])
    assert stats["zero_variance_groups"] == pytest.approx(0.5)


def test_rloo_uses_leave_one_out_baseline():
    turns = credited([1.0, 0.0, 0.0, 0.0], ["a"] * 4)
    estimate_advantages(turns, AlgorithmConfig(estimator="rloo"), "rloo")
    assert turns[0].advantage == pytest.approx(1.0 - 0.0)
    assert turns[1].advantage == pytest.approx(0.0 - 1.0 / 3)


def test_plugin_estimator_is_called_with_group_index():
    seen = {}

    def mean_baseline(token_level_rewards, response_mask, index, config):
        seen["index"] = list(index)
        scores = token_level_rewards.sum(-1)
        adv = (scores - scores.mean())[:, None] * response_mask
        return adv, adv

    turns = credited([3.0, 1.0], ["a", "b"])
    estimate_advantages(turns, AlgorithmConfig(estimator="mean_baseline"), mean_baseline)
    assert seen["index"] == ["a", "b"]
    assert [t.advantage for t in turns] == pytest.approx([1.0, -1.0])
