import numpy as np
import pytest
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

from unimas.algorithms.credit import CreditAssigner
from unimas.algorithms.estimators import Estimator
from unimas.config.loading import config_from_dict
from unimas.trajectory import GraphTrajectory, TurnNode


def episode(eid, task_id, solver_right, verifier_right):
    traj = GraphTrajectory(episode_id=eid, task_id=task_id, task={"answer": "4"})
    traj.add_node(TurnNode(id="solver#0", role="solver", model_group="m", prompt="", text="x", response_ids=[1]))
    traj.add_node(TurnNode(id="verifier#0", role="verifier", model_group="m", prompt="", text="y",
                           response_ids=[1]), ["solver#0"])
    traj.add_node(TurnNode(id="verifier#1", role="verifier", model_group="m", prompt="", text="z",
                           role_turn_index=1, response_ids=[1]), ["verifier#0"])
    traj.outcome = {"answer": "4" if verifier_right else "5", "proposal": "4" if solver_right else "3"}
    return traj


REWARDS = {
    "team": lambda t, task: float(t.outcome["answer"] == task["answer"]),
    "fix": lambda t, task: {"verifier": float(t.outcome["answer"] == "4") - float(t.outcome["proposal"] == "4")},
    "bonus": lambda t, task: {"verifier#1": 0.25},
    "stranger": lambda t, task: {"critic": 1.0},
    "lost_turn": lambda t, task: {"verifier#7": 1.0},
    "broken": lambda t, task: 1 / 0,
    "none": lambda t, task: None,
    "text": lambda t, task: "1.0",
    "nan": lambda t, task: float("nan"),
    "inf_role": lambda t, task: {"solver": float("inf")},
}


def assigner(rewards, estimator="grpo", functions=REWARDS, **algorithm):
    config = config_from_dict({
        "models": {"m": {"options": {"tiny": {"alphabet": "ab"}}}},
        "roles": {"solver": {"model": "m", "template": "a"}, "verifier": {"model": "m", "template": "b"}},
        "workflow": {"name": "w"}, "data": {"name": "d"}, "rewards": rewards,
        "algorithm": {"estimator": estimator, **algorithm},
    })
    fn = functions.get(estimator) or ADV_ESTIMATOR_REGISTRY[estimator]
    return CreditAssigner(config, functions, Estimator.from_function(estimator, fn, "test"))


def test_allocation_combines_levels_weights_and_role_filters():
    credit = assigner([{"name": "team", "weight": 2.0}, {"name": "fix", "level": "role", "roles": ["verifier"]},
                       {"name": "bonus", "level": "turn", "weight": 4.0}])
    traj = episode("e", "t", solver_right=False, verifier_right=True)
    metrics = credit.allocate([traj])
    assert {turn.id: turn.reward for turn in traj.turns()} == {"solver#0": 2.0, "verifier#0": 3.0, "verifier#1": 4.0}
    # each reward's own value per role, unweighted: a role's own reward is visible, not only the sum
    assert metrics["reward/fix/verifier"] == 1.0 and "reward/fix/solver" not in metrics
    assert metrics["reward/bonus/verifier"] == pytest.approx(0.125)
    assert metrics["reward/team/solver"] == 1.0


def test_failed_episode_scores_zero_without_calling_rewards():
    credit = assigner([{"name": "broken"}, {"name": "fix", "level": "role"}])
    traj = episode("e", "t", True, True)
    traj.fail("RuntimeError: boom")
    credit.allocate([traj])
    assert traj.rewards == {"broken": 0.0, "fix": {}}
    assert all(turn.reward == 0.0 for turn in traj.turns())


def test_a_reward_that_raises_fails_its_episode_and_names_the_line():
    credit = assigner([{"name": "broken"}])
    traj = episode("e", "t", True, True)
    credit.allocate([traj])
    assert traj.failed and "ZeroDivisionError" in traj.error and "test_credit.py:" in traj.error


@pytest.mark.parametrize(("name", "level", "message"), [
    ("fix", "trajectory", "returned dict; at level 'trajectory' it must return a number"),
    ("none", "trajectory", "returned NoneType"),
    ("text", "trajectory", "returned str"),
    ("nan", "trajectory", "returned nan; rewards must be finite"),
    ("inf_role", "role", "returned inf; rewards must be finite"),
    ("stranger", "role", "'critic', which are not roles"),
    ("lost_turn", "turn", "'verifier#7', which are not turn"),
])
def test_a_reward_that_returns_something_unusable_fails_its_episode(name, level, message):
    """Wrong shape, non-number, NaN/inf or keys the run lacks: the episode fails, naming the reward's definition."""
    credit = assigner([{"name": "team"}, {"name": name, "level": level}])
    bad = episode("bad", "t", True, True)
    credit.allocate([bad])
    assert bad.failed and message in bad.error and f"rewards.{name}" in bad.error
    assert "test_credit.py:" in bad.error  # where the reward is defined
    assert all(turn.reward == 0.0 for turn in bad.turns())



def test_grouping_keys():
    traj = episode("e", "t0", True, True)
    turn = traj.turns("verifier")[1]
    assert assigner([{"name": "team"}], grouping="role").group_key(traj, turn) == "t0|verifier"
    assert assigner([{"name": "team"}], grouping="role_turn").group_key(traj, turn) == "t0|verifier|1"
    assert assigner([{"name": "team"}], grouping="trajectory").group_key(traj, turn) == "t0"


def test_one_call_writes_reward_and_advantage_once_with_diagnostics():
    """GRPO normalises within each (task, role) group only; a group of equal rewards gets zero advantage."""
    credit = assigner([{"name": "team"}], grouping="role")
    right = [episode(f"a{i}", "a", True, i % 2 == 0) for i in range(4)]
    flat = [episode(f"b{i}", "b", True, True) for i in range(2)]
    result = credit.assign(right + flat)
    assert len(result.turns) == 18
    adv = np.array([t.turn.advantage for t in result.turns if t.trajectory.task_id == "a" and
                    t.turn.role == "solver"])
    assert adv.mean() == pytest.approx(0.0, abs=1e-5) and adv[0] > 0 > adv[1]
    assert [t.turn.advantage for t in result.turns if t.trajectory.task_id == "b"] == pytest.approx([0.0] * 6)
    assert result.metrics["credit/zero_variance_groups"] == pytest.approx(0.5)
    assert result.metrics["role/solver/zero_variance_frac"] == pytest.approx(0.5)
    assert result.metrics["role/verifier/advantage_std"] > 0


def test_rloo_uses_leave_one_out_baseline():
    credit = assigner([{"name": "team"}], estimator="rloo", grouping="role")
    trajs = [episode(f"e{i}", "t", True, i == 0) for i in range(4)]
    credit.assign(trajs)
    assert trajs[0].turns()[0].advantage == pytest.approx(1.0)
    assert trajs[1].turns()[0].advantage == pytest.approx(-1.0 / 3)


def test_plugin_estimator_is_called_with_group_index():
    seen = {}

    def mean_baseline(token_level_rewards, response_mask, index, config):
        seen["index"] = list(index)
        scores = token_level_rewards.sum(-1)
        adv = (scores - scores.mean())[:, None] * response_mask
        return adv, adv

    credit = assigner([{"name": "team"}], estimator="mean_baseline",
                      functions={**REWARDS, "mean_baseline": mean_baseline})
    trajs = [episode("e0", "t0", True, True), episode("e1", "t1", True, False)]
    credit.assign(trajs)
    assert seen["index"][:3] == ["t0|solver", "t0|verifier", "t0|verifier"]
    assert trajs[0].turns()[0].advantage == pytest.approx(0.5)
