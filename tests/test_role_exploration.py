"""Per-role exploration and loss weight (issue 45, items 1-2): ``roles.<role>.entropy_coef`` / ``loss_weight``
change only that role's tokens' gradient, on a shared model and on a LoRA base, through the one objective
every backend calls; ``role/<role>/entropy`` / ``distinct_answers`` are logged; a collapsed role warns once."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from unimas.algorithms import losses
from unimas.algorithms.losses import RoleObjective
from unimas.cli import main
from unimas.config.schema import (AlgorithmConfig, EntropyWarningConfig, GenerationConfig, LoraConfig,
                                  ModelGroupConfig, OptimConfig, RoleConfig)
from unimas.groups.base import GenRequest, GroupSpec, TrainTurn
from unimas.report.charts import role_charts
from unimas.report.data import load_run
from unimas.report.plots import role_plot
from unimas.training.exploration import CollapseWatch, distinct_answers


def _lora_group(objectives: dict[str, RoleObjective]):
    """A tiny torch group with adapters x and y (one per role), no gradient clipping, these roles' terms."""
    from unimas.algorithms.losses import resolve_policy_loss
    from unimas.contract.registry import build_registry
    from unimas.groups.torch import TorchModelGroup, TorchOptions

    tiny = dict(alphabet=ALPHABET, hidden_size=32, num_layers=2, num_heads=4, max_positions=32)
    config = ModelGroupConfig(options={"tiny": tiny}, lora=LoraConfig(r=4), optim=OptimConfig(lr=1e-2, grad_clip=1e6))
    spec = GroupSpec(name="m", config=config, options=TorchOptions.model_validate(config.options),
                     adapters=["x", "y"], seed=5, algorithm=AlgorithmConfig(),
                     policy_loss=resolve_policy_loss("vanilla", build_registry()), role_objectives=objectives)
    return TorchModelGroup.build(spec)


def _role_turns(group, roles: list[str]) -> list[TrainTurn]:
    """One sampled turn per role name, on that role's adapter, advantages of both signs."""
    generation = GenerationConfig(max_new_tokens=4)
    results = group.generate([GenRequest(prompt, generation, adapter=role)
                              for prompt, role in zip(["a", "bcd", "hgf", "ee"], roles)])
    return [TrainTurn(r.prompt_ids, r.response_ids, r.logprobs, 1.0 if i % 2 == 0 else -0.5,
                      rollout_logprobs_exact=r.logprobs_exact, adapter=role, role=role)
            for i, (r, role) in enumerate(zip(results, roles))]


ALPHABET = "abcdefgh0123"


def _tiny_model(seed: int):
    """A random-init tiny causal LM (the torch backend's own tiny builder) and its vocabulary size."""
    from unimas.groups.hf.chars import build_char_tokenizer
    from unimas.groups.hf.model_source import TinyModelConfig
    from unimas.groups.hf.tiny import build_tiny_model

    tokenizer = build_char_tokenizer(ALPHABET)
    config = TinyModelConfig(alphabet=ALPHABET, hidden_size=32, num_layers=2, num_heads=4, max_positions=32)
    return build_tiny_model(config, tokenizer, seed), len(tokenizer)


ROLES = ["critic", "proposer", "critic", "proposer"]
ADVANTAGES = [1.0, -0.5, -1.0, 0.7]


def _logit_grads(model, vocab: int, objectives: dict[str, RoleObjective], settings: AlgorithmConfig) -> torch.Tensor:
    """d loss / d logits of every response token, (rows, tokens, vocab): a real forward and backward of the
    objective every backend calls, on four [prompt | response] rows of two roles."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (len(ROLES), 9), generator=generator)
    prompt = 5
    logits = model(input_ids=ids).logits[:, prompt - 1:-1].float()
    logits.retain_grad()
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, ids[:, prompt:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    mask = torch.ones_like(logp)
    mask[1, -1] = 0.0  # rows of different lengths
    weight, coef = losses.token_coefficients(objectives, ROLES, settings, logp)
    policy = losses.policy_losses(SimpleNamespace(names=lambda kind: []))["vanilla"]
    loss, _ = losses.compose_loss(policy, settings, log_prob=logp, old_log_prob=logp.detach(),
                                      advantages=torch.tensor(ADVANTAGES)[:, None] * mask, response_mask=mask,
                                      entropy=entropy, token_weight=weight, entropy_coef=coef)
    loss.backward()
    return logits.grad.detach().clone()


@pytest.mark.parametrize("objective", [RoleObjective(loss_weight=3.0), RoleObjective(entropy_coef=0.5),
                                       RoleObjective(entropy_coef=0.2, loss_weight=0.5)])
def test_a_roles_setting_changes_only_its_own_tokens_gradient_on_a_shared_model(objective):
    model, vocab = _tiny_model(seed=3)
    settings = AlgorithmConfig(entropy_coef=0.01)
    plain = _logit_grads(model, vocab, {}, settings)
    changed = _logit_grads(model, vocab, {"critic": objective}, settings)
    critic, proposer = [0, 2], [1, 3]
    assert torch.allclose(changed[proposer], plain[proposer], rtol=1e-5, atol=1e-9)
    assert not torch.allclose(changed[critic], plain[critic], rtol=1e-3, atol=1e-7)
    if objective.entropy_coef is None:  # a pure weight: the critic's token gradients scale by exactly it
        assert torch.allclose(changed[critic], plain[critic] * objective.loss_weight, rtol=1e-4, atol=1e-9)


def test_default_role_settings_leave_the_loss_as_it_was():
    model, vocab = _tiny_model(seed=4)
    settings = AlgorithmConfig(entropy_coef=0.03)
    assert losses.token_coefficients({"other": RoleObjective(loss_weight=2.0)}, ROLES, settings,
                                         torch.zeros(4, 1)) == (None, None)
    explicit = {"critic": RoleObjective(entropy_coef=0.03, loss_weight=1.0)}  # the group's own values, spelled out
    assert torch.allclose(_logit_grads(model, vocab, explicit, settings), _logit_grads(model, vocab, {}, settings),
                          rtol=1e-5, atol=1e-9)


def test_a_roles_entropy_coef_moves_only_its_own_lora_adapter():
    """Two groups built alike, one update each: with an entropy bonus on role x alone, adapter y (role y's own
    weights) ends exactly where it ends without it; adapter x does not."""
    def updated(objectives):
        group = _lora_group(objectives)
        try:
            metrics = group.update(_role_turns(group, ["x", "y", "x", "y"]))
            return {key: p.detach().clone() for key, p in group.policy.model.named_parameters()
                    if "lora_" in key}, metrics
        finally:
            group.close()

    plain, _ = updated({})
    bonus, metrics = updated({"x": RoleObjective(entropy_coef=1.0)})
    assert {"role/x/entropy", "role/y/entropy"} <= set(metrics)
    for key in plain:
        if ".y." in key:
            assert torch.equal(plain[key], bonus[key]), key
    assert any(not torch.equal(plain[key], bonus[key]) for key in plain if ".x." in key)


def test_role_entropy_is_each_roles_token_mean():
    entropy = torch.tensor([[1.0, 3.0, 9.0], [0.5, 0.0, 0.0], [2.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    assert losses.role_entropy(entropy, mask, ["a", "b", "a"]) == pytest.approx(
        {"role/a/entropy": 2.0, "role/b/entropy": 0.5})


def test_the_verl_loss_gets_the_same_per_role_terms():
    """The verl backend's loss (unimas_loss over verl's packed batch) equals compose_loss with the roles' terms."""
    from unimas.groups.base import TrainTurn
    from unimas.groups.verl import turn_rows
    from unimas.groups.verl.loss import unimas_loss

    turns = [TrainTurn([5, 6], [7, 8], [], 1.0, role="critic"), TrainTurn([9], [10], [], -1.0, role="proposer")]
    settings = AlgorithmConfig(entropy_coef=0.01)
    objectives = {"critic": RoleObjective(entropy_coef=0.4, loss_weight=2.0)}
    rows = turn_rows.layout(turns, 0, size=3)
    extra = {"old_log_probs": turn_rows.response_rows([[-1.0, -2.0], [-0.5]], rows)}
    extra.update(turn_rows.role_coefficients(turns, rows, objectives, settings))
    assert set(extra) == {"old_log_probs", "token_weight", "entropy_coef"}
    data = turn_rows.engine_input(rows, extra, compute_loss=True)
    from tensordict import TensorDict

    packed = data["input_ids"].float() * -0.1  # stands for the engine's per-token outputs, packed like its inputs
    output = TensorDict({"log_probs": packed, "entropy": -packed}, batch_size=[3])
    policy = losses.policy_losses(SimpleNamespace(names=lambda kind: []))["vanilla"]
    loss, _ = unimas_loss(policy, settings, output, data)
    log_prob = turn_rows.to_rows(output, "log_probs", data)
    mask = rows.tensors["response_mask"].float()
    weight, coef = losses.token_coefficients(objectives, ["critic", "proposer", ""], settings, log_prob)
    expected, _ = losses.compose_loss(policy, settings, log_prob=log_prob, old_log_prob=extra["old_log_probs"],
                                          advantages=rows.tensors["advantages"], response_mask=mask,
                                          entropy=turn_rows.to_rows(output, "entropy", data), token_weight=weight,
                                          entropy_coef=coef)
    plain_input = turn_rows.engine_input(rows, {"old_log_probs": extra["old_log_probs"]}, compute_loss=True)
    plain, _ = unimas_loss(policy, settings, output, plain_input)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(loss) != pytest.approx(float(plain), rel=1e-3)


# ----------------------------------------------------------------- config


@pytest.mark.parametrize("setting, field", [("roles.speaker.entropy_coef=-0.1", "roles.speaker.entropy_coef"),
                                            ("roles.speaker.loss_weight=0", "roles.speaker.loss_weight"),
                                            ("roles.speaker.loss_weight=true", "roles.speaker.loss_weight"),
                                            ("roles.speaker.entropy_coef=inf", "roles.speaker.entropy_coef")])
def test_bad_role_settings_exit_2_naming_the_field(repo, capsys, setting, field):
    assert main(["validate", str(repo / "examples" / "quickstart.yaml"), "--set", setting]) == 2
    assert field in capsys.readouterr().err


def test_a_role_setting_on_a_frozen_role_is_refused(repo, capsys):
    code = main(["validate", str(repo / "examples" / "quickstart.yaml"), "--set", "roles.listener.trainable=false",
                 "--set", "roles.listener.entropy_coef=0.1"])
    assert code == 2
    assert "roles.listener.entropy_coef" in capsys.readouterr().err


def test_role_settings_validate_and_are_summarised(repo, capsys):
    code = main(["validate", str(repo / "examples" / "critic_team_cpu.yaml"), "--set", "roles.solver.loss_weight=0.5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "per role: solver loss weight 0.5; verifier entropy" in out


# ----------------------------------------------------------------- metrics and the warning


def test_collapse_watch_warns_once_per_role_after_enough_low_steps(capsys):
    roles = {"critic": RoleConfig(model="m", template="x"), "judge": RoleConfig(model="m", template="x",
                                                                                  trainable=False)}
    watch = CollapseWatch(roles, EntropyWarningConfig(below=0.1, steps=3))
    seen = [watch.observe({"step": s, "role/critic/entropy": e, "role/judge/entropy": 0.0})
            for s, e in enumerate([0.05, 0.5, 0.05, 0.04, 0.01, 0.0, 0.0], start=1)]
    assert seen == [[], [], [], [], ["critic"], [], []]  # the high step 2 resets the count; judge is not trained
    err = capsys.readouterr().err
    assert err.count("has stopped exploring") == 1 and "roles.critic.entropy_coef" in err
    assert CollapseWatch(roles, None).observe({"role/critic/entropy": 0.0}) == []


def test_distinct_answers_counts_per_task_then_averages():
    def turn(role, parsed, error=None, text=""):
        return SimpleNamespace(role=role, parsed=parsed, parse_error=error, text=text)

    episodes = [SimpleNamespace(task_id="t1", turns=lambda: [turn("c", "y"), turn("p", "3")]),
                SimpleNamespace(task_id="t1", turns=lambda: [turn("c", "y"), turn("p", "4")]),
                SimpleNamespace(task_id="t2", turns=lambda: [turn("c", "n"), turn("p", None, "bad", " 5 ")]),
                SimpleNamespace(task_id="t2", turns=lambda: [turn("c", "y"), turn("p", "5")])]
    assert distinct_answers(episodes, ["c", "p", "absent"]) == {"role/c/distinct_answers": 1.5,
                                                                "role/p/distinct_answers": 1.5}


def test_role_metrics_reach_metrics_jsonl_and_the_warning_is_printed(repo, tmp_path, capsys):
    run = tmp_path / "run"
    settings = ["trainer.steps=3", "trainer.tasks_per_step=4", "trainer.eval_size=4", "logging.report=false",
                "trainer.stop_at_accuracy=null", "roles.listener.entropy_coef=0.05",
                "logging.entropy_warning={below: 100.0, steps: 2}"]  # every entropy is below 100 nats
    code = main(["train", str(repo / "examples" / "quickstart.yaml"), "--run-dir", str(run),
                 *[a for s in settings for a in ("--set", s)]])
    assert code == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records[1:]:
        for role in ("speaker", "listener"):
            assert 0 < record[f"role/{role}/entropy"] < 10
            assert 1 <= record[f"role/{role}/distinct_answers"] <= 8
    warnings = [line for line in capsys.readouterr().err.splitlines() if "has stopped exploring" in line]
    assert len(warnings) == 2 and all("step 2" in w for w in warnings)  # once per role, not again at step 3
    # the report plots both, one line per role (the interactive charts and the static role plot)
    run_data = load_run(run)
    charts = {chart: chart_lines for chart, _, chart_lines in role_charts(run_data)}
    for metric in ("entropy", "distinct_answers"):
        assert sorted(line.label for line in charts[f"role-{metric}"]) == ["listener", "speaker"]
        assert all(len(line.steps) == 3 for line in charts[f"role-{metric}"])
    titles = [axes.get_title() for axes in role_plot(run_data).axes]
    assert "entropy" in titles and "distinct_answers" in titles
