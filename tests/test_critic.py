"""PPO with a learned critic (docs/critic.md): GAE over a role's turns, the value model, validation, resume.

The GAE numbers are computed by hand on a three-role graph episode with tool
nodes: a role's next state is its own next turn, never the tool call or the
other role's turn in between, and 0 after its last turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import EXAMPLES
from tests.test_kill_resume import VOLATILE
from tests.test_torch_backend import group_spec, make_group
from unimas.algorithms import estimators
from unimas.algorithms.credit import CreditedTurn
from unimas.cli import main
from unimas.config.schema import CriticConfig, ModelGroupConfig, OptimConfig, RoleConfig
from unimas.contract.registry import build_registry
from unimas.groups.base import TrainTurn
from unimas.groups.role_gae import gae_over_turns, role_sequences
from unimas.groups.torch.group import TorchModelGroup
from unimas.training.trainer import train_turn
from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode

PPO = str(EXAMPLES / "quickstart_ppo.yaml")


def gae():
    return estimators.resolve_estimator("gae", build_registry([]))


# ------------------------------------------------ GAE over a role's turns, by hand


def three_role_episode() -> tuple[list[TrainTurn], list[list[float]]]:
    """Episode e1: A#0 (2 tokens), tool, B#0, C#0, A#1, tool, B#1 (2 tokens); episode e2: A#0 alone.

    A and B train on one group; C is on another, so its turn is not among the group's turns. Returns the
    group's turns as the trainer builds them, and hand-chosen values per token.
    """
    e1 = GraphTrajectory("e1", "t1")
    nodes = [TurnNode("A#0", "A", "g", "p", prompt_ids=[1], response_ids=[2, 3]),
             ToolNode("search#0", "search"),
             TurnNode("B#0", "B", "g", "p", prompt_ids=[1], response_ids=[4]),
             TurnNode("C#0", "C", "other", "p", prompt_ids=[1], response_ids=[5]),
             TurnNode("A#1", "A", "g", "p", prompt_ids=[1, 2, 3, 6], response_ids=[7], role_turn_index=1),
             ToolNode("search#1", "search"),
             TurnNode("B#1", "B", "g", "p", prompt_ids=[1, 4], response_ids=[8, 9], role_turn_index=1)]
    consumed = [[], ["A#0"], ["search#0"], ["B#0"], ["C#0"], ["A#1"], ["search#1"]]
    for node, sources in zip(nodes, consumed):
        e1.add_node(node, sources)
    e2 = GraphTrajectory("e2", "t1")
    e2.add_node(TurnNode("A#0", "A", "g", "p", prompt_ids=[1], response_ids=[2]))
    signals = {("e1", "A#0"): 0.3, ("e1", "B#0"): 0.4, ("e1", "A#1"): 1.0, ("e1", "B#1"): 2.0, ("e2", "A#0"): 1.0}
    roles = {"A": RoleConfig(model="g", template="x"), "B": RoleConfig(model="g", template="x")}
    turns = [train_turn(CreditedTurn(t, turn, "k", signal=signals[t.episode_id, turn.id]), roles[turn.role])
             for t in (e1, e2) for turn in t.turns() if turn.role in roles]
    values = [[0.1, 0.2], [0.5], [0.4], [0.0, 1.0], [0.5]]  # A#0, B#0, A#1, B#1 of e1; A#0 of e2
    return turns, values


def whitened(rows: list[list[float]]) -> torch.Tensor:
    flat = torch.tensor([v for row in rows for v in row], dtype=torch.float64)
    return (flat - flat.mean()) / flat.std()


@pytest.mark.parametrize("mode, expected_returns", [
    # gamma 0.5, lam 0.5. A in e1: reward 1.0 on A#1's token only. delta(a3) = 1 - 0.4 = 0.6;
    # delta(a2) = 0.5 * V(a3) - 0.2 = 0: A#0's last token bootstraps off A#1's first token (0.4), not off
    # the tool call or B's turn; A(a2) = 0.25 * 0.6 = 0.15, A(a1) = 0.25 * 0.15 = 0.0375; return = A + V.
    # B: reward 2.0 on b3; A(b3) = 1.0, A(b2) = 0.5 * 1.0 - 0 + 0.25 = 0.75, A(b1) = 0.5 * 0 - 0.5 + 0.1875.
    ("last_turn", [[0.1375, 0.35], [0.1875], [1.0], [0.75, 2.0], [1.0]]),
    # every_turn: also 0.3 on A#0's last token and 0.4 on B#0's: A(a2) = 0.3 + 0.15, A(a1) = 0.25 * 0.45;
    # A(b1) = 0.4 - 0.5 + 0.1875.
    ("every_turn", [[0.2125, 0.65], [0.5875], [1.0], [0.75, 2.0], [1.0]]),
])
def test_gae_chains_a_roles_turns_across_tool_calls_and_other_roles(mode, expected_returns):
    turns, values = three_role_episode()
    assert [t.role for t in turns] == ["A", "B", "A", "B", "A"] and turns[1].reward == 0.4
    assert role_sequences(turns) == [[0, 2], [1, 3], [4]]  # (episode, role), execution order; e2 apart
    advantages, returns = gae_over_turns(gae(), turns, values, gamma=0.5, lam=0.5, mode=mode)
    for got, want in zip(returns, expected_returns):
        assert got == pytest.approx(want, abs=1e-6)
    raw = [[r - v for r, v in zip(rr, vv)] for rr, vv in zip(returns, values)]
    # verl's gae whitens the advantages over every token of the call (the group's update batch)
    assert torch.allclose(whitened(advantages), whitened(raw), atol=1e-5)
    assert abs(sum(v for row in advantages for v in row)) < 1e-5


def test_gae_refuses_values_that_do_not_match_the_tokens():
    turns, values = three_role_episode()
    values[3] = [0.0]
    with pytest.raises(ValueError, match="1 values for 2 response tokens"):
        gae_over_turns(gae(), turns, values, gamma=1.0, lam=1.0)


# ------------------------------------------------------------- the value model


def critic_group(seed=0, value_lr=3e-3, **algorithm):
    group = make_group(seed=seed, algorithm={"estimator": "gae", **algorithm},
                       critic=CriticConfig(optim=OptimConfig(lr=value_lr)))
    group.spec.estimator = gae()
    return group


def test_the_value_of_a_token_is_read_from_the_state_before_it():
    group = critic_group()
    with torch.no_grad():
        group.critic.model.head.weight.normal_()
    ids = group.policy.tokenizer("S:abc", add_special_tokens=False)["input_ids"]
    whole = TrainTurn(ids[:2], ids[2:], [], 0.0)
    values = group.critic.values([whole], 4, group.learner.batches)[0]
    for j in range(len(ids) - 2):  # the state before token j is the prompt extended by the tokens before it
        later = TrainTurn(ids[: 2 + j], ids[2 + j:], [], 0.0)
        assert group.critic.values([later], 4, group.learner.batches)[0][0] == pytest.approx(values[j], abs=1e-5)
    assert len(set(round(v, 4) for v in values)) == len(values)  # the head is not constant: the check has teeth


def fixed_reward_turns(group) -> list[TrainTurn]:
    """Eight one-turn episodes: the reward is a fixed function of the prompt (the target letter). ``group``: a
    torch group (its policy's tokenizer) or a verl one (its own)."""
    tokenizer = group.policy.tokenizer if hasattr(group, "policy") else group.tokenizer
    turns = []
    for i, letter in enumerate("abcdefgh"):
        prompt = tokenizer(f"S:{letter}", add_special_tokens=False)["input_ids"]
        response = tokenizer(letter, add_special_tokens=False)["input_ids"]
        turns.append(TrainTurn(prompt, response, [0.0], 0.0, episode=f"e{i}", role="speaker", reward=i / 7))
    return turns


STEPS_TO_EXPLAIN = 30
"""Measured: explained variance first above 0.9 at update 11 (0.911; seed 0, critic lr 3e-3, 0.5 s on one CPU
thread); the bound leaves room for other CPUs' rounding."""


def test_the_critic_learns_a_fixed_reward_explained_variance_above_0_9():
    group = critic_group(critic_warmup=10_000)  # only the critic trains: the task stays fixed
    weights = [p.detach().clone() for p in group.policy.train_params]
    turns = fixed_reward_turns(group)
    history = []
    for _ in range(STEPS_TO_EXPLAIN):
        metrics = group.update(turns)
        history.append(metrics["critic/explained_variance"])
        if history[-1] > 0.9:
            break
    assert history[0] == 0.0 and metrics["critic/value_mean"] != 0.0  # values start at 0 (zero head)
    assert history[-1] > 0.9, history
    assert metrics["tokens"] == 0.0 and all(torch.equal(a, b) for a, b in zip(weights, group.policy.train_params))
    assert metrics["critic/value_loss"] > 0 and 0.0 <= metrics["critic/value_clip_frac"] <= 1.0


def test_after_the_warmup_the_policy_trains_on_per_token_advantages():
    group = critic_group(critic_warmup=1)
    turns = fixed_reward_turns(group)
    first = group.update(turns)
    second = group.update(turns)
    assert first["tokens"] == 0.0 and second["tokens"] == float(len(turns))
    assert second["critic/advantage_std/speaker"] > 0


def test_a_group_with_a_critic_resumes_bit_identically(tmp_path):
    group = critic_group(critic_warmup=1, mini_batch_size=3, ppo_epochs=2)
    turns = fixed_reward_turns(group)
    group.update(turns)
    group.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "critic" / "value_head.safetensors").exists()
    expected = [group.update(turns) for _ in range(2)]
    resumed = critic_group(seed=5, critic_warmup=1, mini_batch_size=3, ppo_epochs=2)
    resumed.load(tmp_path / "ckpt")
    got = [resumed.update(turns) for _ in range(2)]
    volatile = ("update_time_s",)
    assert [{k: v for k, v in m.items() if k not in volatile} for m in got] == \
        [{k: v for k, v in m.items() if k not in volatile} for m in expected]
    for a, b in zip(group.critic.model.parameters(), resumed.critic.model.parameters()):
        assert torch.equal(a, b)


def test_init_from_warm_starts_the_critic_with_a_fresh_optimiser(tmp_path):
    group = critic_group(critic_warmup=1)
    turns = fixed_reward_turns(group)
    for _ in range(3):
        group.update(turns)
    group.save(tmp_path / "trained")
    config = ModelGroupConfig(options={"init_from": str(tmp_path / "trained")},
                              critic=CriticConfig(optim=OptimConfig(lr=3e-3)))
    spec = group_spec(config, estimator="gae", critic_warmup=1)
    spec.estimator = gae()
    warm = TorchModelGroup.build(spec)
    for a, b in zip(group.critic.model.parameters(), warm.critic.model.parameters()):
        assert torch.equal(a, b)
    assert warm.critic.updates == 0 and warm.critic.warming_up  # a new run: its own schedule and warm-up
    assert warm.critic.values(turns, 8, warm.learner.batches) == group.critic.values(turns, 8, group.learner.batches)
    assert any(v != 0.0 for row in warm.critic.values(turns, 8, warm.learner.batches) for v in row)  # not the zero head


# ------------------------------------------------------------------- validation


def validate(capsys, *sets: str) -> tuple[int, str]:
    code = main(["validate", PPO, *sum((["--set", s] for s in sets), [])])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert "Traceback" not in output
    return code, output


@pytest.mark.parametrize("sets, field, words", [
    (["models.shared.critic=null"], "models.shared.critic", "needs value estimates"),
    (["models.shared.trainable=false", "roles.speaker.trainable=false", "roles.listener.trainable=false"],
     "models.shared.critic", "frozen group"),
    (["algorithm.estimator=grpo"], "models.shared.critic", "takes no values"),
    (["algorithm.update_order={name: reverse_execution, params: {damp: 0.5}}"], "algorithm.update_order.params",
     "rescales each turn's advantage"),
    (["algorithm.update_order={name: reverse_execution, params: {ratio_clip: 0.2}}"],
     "algorithm.update_order.params", "would not reach"),
])
def test_validate_refuses_a_missing_or_useless_critic(capsys, sets, field, words):
    code, output = validate(capsys, *sets)
    assert code == 2 and field in output and words in output


def test_validate_accepts_an_update_order_that_leaves_advantages_alone(capsys):
    code, output = validate(capsys, "algorithm.update_order={name: reverse_execution}")
    assert code == 0, output


def test_validate_accepts_the_ppo_example(capsys):
    code, output = validate(capsys)
    assert code == 0, output


# ---------------------------------------------- unimas train with gae, and resume


def records(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(part in k for part in VOLATILE)} for r in rows]


def test_unimas_train_with_gae_resumes_bit_identically(tmp_path, capsys):
    settings = ["trainer.steps=4", "trainer.save_every=2", "trainer.tasks_per_step=4", "trainer.eval_every=0",
                "algorithm.group_size=4", "algorithm.critic_warmup=1", "logging.report=false",
                "logging.console=false"]

    def train(run: Path, *extra: str, resume: bool = False) -> None:
        args = ["train", PPO, "--run-dir", str(run), *(["--resume"] if resume else [])]
        assert main(args + sum((["--set", s] for s in (*settings, *extra)), [])) == 0
        assert "Traceback" not in capsys.readouterr().err

    train(tmp_path / "whole")
    train(tmp_path / "cut", "trainer.steps=2")
    train(tmp_path / "cut", resume=True)
    whole, cut = records(tmp_path / "whole"), records(tmp_path / "cut")
    assert "eval/accuracy" in cut[2]  # the cut run's last step evaluated (its end); the whole run did not
    cut[2] = {k: v for k, v in cut[2].items() if not k.startswith("eval/")}
    assert [r["step"] for r in cut] == [0, 1, 2, 3, 4] and cut == whole
    assert "group/shared/critic/explained_variance" in whole[-1] and whole[1]["group/shared/tokens"] == 0.0
    critic = Path("checkpoints/step_000004/shared/critic/value_head.safetensors")
    a, b = load_file(tmp_path / "whole" / critic), load_file(tmp_path / "cut" / critic)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
