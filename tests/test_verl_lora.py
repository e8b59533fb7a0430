"""One LoRA adapter on a verl group (CPU, tiny qwen2): verl's engine trains only the adapter, the rollout receives
base and adapter and scores exactly as the trainer, the KL reference stays the bare base, checkpoints continue
bit-identically, validation refuses what the adapted rollout cannot serve, and `unimas train` runs such a group."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.test_verl_train import final_weights
from unimas.cli import main
from unimas.config.loading import config_from_dict
from unimas.config.schema import GenerationConfig
from unimas.contract.registry import build_registry
from unimas.groups.base import GenRequest, TrainTurn
from unimas.preflight.validate import check_config
from unimas.runtime.build import build_group

TINY = {"architecture": "qwen2", "alphabet": "SL:abcdefgh", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
        "max_positions": 32}
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
GEN = GenerationConfig(max_new_tokens=3, temperature=1.0, require_eos=False)
FIXED = [TrainTurn([4, 6, 7], [8, 9, 10], [], 0.0, temperature=0.7), TrainTurn([5, 6], [11, 1], [], 0.0,
                                                                                   temperature=1.3)]


def tree(**algorithm) -> dict:
    group = {"backend": "verl", "options": {"tiny": dict(TINY)}, "optim": {"lr": 0.02}, "lora": dict(LORA)}
    return {
        "name": "verl_lora", "models": {"team": group},
        "roles": {"speaker": {"model": "team", "adapter": "shared", "template": "S:{target}",
                              "generation": {"max_new_tokens": 1, "temperature": 1.0, "require_eos": False}},
                  "listener": {"model": "team", "adapter": "shared", "template": "L:{message}",
                               "generation": {"max_new_tokens": 1, "temperature": 1.0, "require_eos": False}}},
        "workflow": {"name": "signalling"}, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "group_size": 4, **algorithm}, "trainer": {"steps": 10, "seed": 3},
    }


@pytest.fixture(scope="module")
def setup():
    cfg, registry = config_from_dict(tree()), build_registry()
    return cfg, registry, build_group(cfg, registry, "team")


def requests(adapter="shared", prompts=("S:a", "S:bc", "L:h", "S:ddd")):
    return [GenRequest(prompt=p, generation=GEN, adapter=adapter) for p in prompts]


def turns_of(results, advantages):
    return [TrainTurn(r.prompt_ids, r.response_ids, r.logprobs, adv, rollout_logprobs_exact=r.logprobs_exact,
                      temperature=1.0, weight_version=r.weight_version) for r, adv in zip(results, advantages)]


def engine_params(group) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in group.actor.engine.module.named_parameters()}


def base_logprobs(model_dir: str, turns: list[TrainTurn]) -> list[list[float]]:
    """The bare base model's log-probs (plain transformers forward)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = []
    for turn in turns:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([turn.prompt_ids + turn.response_ids])).logits
        logits = logits[0, len(turn.prompt_ids) - 1:-1] / turn.temperature
        rows.append(logits.log_softmax(-1).gather(-1, torch.tensor(turn.response_ids)[:, None]).squeeze(-1).tolist())
    return rows


def test_only_the_adapter_trains_and_the_rollout_gets_base_and_adapter(setup):
    _, _, group = setup
    before = engine_params(group)
    trainable = {n for n, p in group.actor.engine.module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    # rank 4 on q_proj and v_proj (32 -> 32) of 2 layers: A is 4x32, B is 32x4
    assert sum(before[n].numel() for n in trainable) == 2 * 2 * (4 * 32 + 32 * 4)

    turns = turns_of(group.generate(requests()), [1.0, -1.0, 1.0, -1.0])
    group.update(turns)
    after = engine_params(group)
    assert all(torch.equal(before[n], after[n]) for n in before if n not in trainable)  # base bit-identical
    assert any(not torch.equal(before[n], after[n]) for n in trainable if "lora_B" in n)

    rollout = {name: p.detach() for name, p in group.rollout.model.named_parameters()}
    assert rollout.keys() == after.keys() and all(torch.equal(rollout[n], after[n]) for n in after)


def test_update_moves_logprobs_and_the_synced_rollout_scores_as_the_trainer(setup):
    _, _, group = setup
    version = group.weight_version
    results = group.generate(requests())
    assert all(r.weight_version == version and r.logprobs_exact for r in results)
    turns = turns_of(results, [1.0, -1.0, 1.0, -1.0])
    before = group.trainer_logprobs(turns)
    metrics = group.update(turns)
    assert metrics["rollout_logprob_diff"] <= 1e-5  # sampled by the weights the trainer had
    assert group.weight_version == version + 1 == group.rollout.weight_version
    assert group.last_sync_diff is not None and group.last_sync_diff <= 1e-5
    after = group.trainer_logprobs(turns + FIXED)
    objective = [sum(adv * (sum(x) - sum(y)) for adv, x, y in zip([1.0, -1.0, 1.0, -1.0], rows, before))
                 for rows in (after, before)]
    assert objective[0] > 0 == objective[1]  # the advantage-weighted log-likelihood went up
    served = group.rollout.logprobs([t.prompt_ids for t in turns + FIXED], [t.response_ids for t in turns + FIXED],
                                    [1.0] * 4 + [0.7, 1.3])
    assert max(abs(x - y) for row, other in zip(after, served) for x, y in zip(row, other)) <= 1e-5


def test_requests_name_the_groups_one_adapter(setup):
    _, _, group = setup
    assert all(r.response_ids for r in group.generate(requests(adapter=None)[:1] + requests()[:1]))
    with pytest.raises(ValueError, match="no LoRA adapter 'other'"):
        group.generate(requests(adapter="other"))


def steps(group, count: int) -> list:
    trace = []
    for _ in range(count):
        results = group.generate(requests())
        metrics = group.update(turns_of(results, [0.5, -1.0, 1.0, -0.5]))
        trace.append(([r.response_ids for r in results], [r.logprobs for r in results],
                      {k: v for k, v in metrics.items() if k != "update_time_s"}))
    return trace + [group.trainer_logprobs(FIXED)]


def test_save_then_load_into_a_fresh_group_continues_bit_identically(setup, tmp_path):
    cfg, registry, group = setup
    # Move the adapter off its zero start here: under xdist's default --dist load this test may run on a worker
    # whose module fixture no other test has trained.
    steps(group, 1)
    group.save(tmp_path / "team")
    saved_version, saved = group.weight_version, group.trainer_logprobs(FIXED)
    expected = steps(group, 2)
    fresh = build_group(cfg, registry, "team")
    assert fresh.trainer_logprobs(FIXED) != saved  # the adapter moved away from its zero start
    fresh.load(tmp_path / "team")
    assert fresh.weight_version == saved_version == fresh.rollout.weight_version
    assert fresh.trainer_logprobs(FIXED) == saved
    served = fresh.rollout.logprobs([t.prompt_ids for t in FIXED], [t.response_ids for t in FIXED], [0.7, 1.3])
    assert max(abs(a - b) for x, y in zip(served, saved) for a, b in zip(x, y)) <= 1e-5
    assert steps(fresh, 2) == expected


def test_the_kl_reference_is_the_bare_base():
    group = build_group(config_from_dict(tree(kl_coef=0.1)), build_registry(), "team")
    assert group.configs.reference.model_config.lora_rank == 0 and group.configs.actor.model_config.lora_rank == 4
    base = base_logprobs(group.configs.actor.model_config.local_path, FIXED)
    kl = [group.update(turns_of(group.generate(requests()), [1.0, -1.0, 1.0, -1.0]))["kl"] for _ in range(2)]
    assert kl[0] == 0.0 < kl[1]
    reference = group.trainer_logprobs(FIXED, reference=True)
    assert max(abs(a - b) for x, y in zip(reference, base) for a, b in zip(x, y)) <= 1e-5
    assert group.trainer_logprobs(FIXED) != reference


def problems_of(change) -> dict[str, str]:
    data = tree()
    change(data)
    return dict(check_config(config_from_dict(data), build_registry()))


def test_validation_accepts_one_shared_adapter_and_refuses_what_the_rollout_cannot_serve():
    assert problems_of(lambda t: None) == {}

    def two_adapters(t):
        t["roles"]["listener"]["adapter"] = "other"

    def frozen_role_without_adapter(t):
        t["roles"]["listener"].pop("adapter")
        t["roles"]["listener"]["trainable"] = False

    def frozen_group(t):
        t["models"]["team"]["trainable"] = False
        for role in t["roles"].values():
            role["trainable"] = False

    cases = [
        (two_adapters, "models.team.lora", "at most one per model"),
        (lambda t: t["models"]["team"]["lora"].update(train_base=True), "models.team.lora.train_base",
         "adapter only"),
        (lambda t: t["models"]["team"]["lora"].update(dropout=0.1), "models.team.lora.dropout", "without dropout"),
        (frozen_role_without_adapter, "roles.listener.adapter", "cannot also generate with the bare base"),
        (frozen_group, "models.team.lora", "frozen"),
    ]
    for change, where, message in cases:
        found = problems_of(change)
        assert where in found and message in found[where], (where, found)


VOLATILE = ("time/", "_time_s", "_per_s", "wall_s")


def stable_metrics(run) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(part in k for part in VOLATILE)} for r in records]


def test_unimas_train_runs_a_verl_lora_group_records_per_role_metrics_and_resumes_exactly(tmp_path):
    import yaml

    data = tree()
    data["trainer"] = {"steps": 4, "seed": 0, "tasks_per_step": 8, "eval_every": 2, "save_every": 2}
    data["logging"] = {"report": False, "console": False}
    config = tmp_path / "lora.yaml"
    config.write_text(yaml.safe_dump(data))
    straight = tmp_path / "straight"
    assert main(["train", str(config), "--run-dir", str(straight)]) == 0
    records = stable_metrics(straight)
    steps_done = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in steps_done] == [1, 2, 3, 4]
    for record in steps_done:
        assert record["group/team/weight_version"] == float(record["step"])
        for role in ("speaker", "listener"):
            assert record[f"role/{role}/turns"] > 0 and f"role/{role}/advantage_std" in record
    assert any(record["group/team/grad_norm"] > 0 for record in steps_done)

    resumed = tmp_path / "resumed"  # stops after the step-2 checkpoint, then resumes to step 4
    assert main(["train", str(config), "--run-dir", str(resumed), "--set", "trainer.steps=2"]) == 0
    assert main(["train", str(config), "--run-dir", str(resumed), "--resume"]) == 0
    assert stable_metrics(resumed) == records
    final = [final_weights(run, "team") for run in (straight, resumed)]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert any("lora_B" in k for k in final[0])


def test_an_unknown_target_module_is_a_user_error_naming_the_field(tmp_path, capsys):
    import yaml

    data = tree()
    data["models"]["team"]["lora"]["target_modules"] = ["q_proj", "qkv"]
    config = tmp_path / "lora.yaml"
    config.write_text(yaml.safe_dump(data))
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "models.team.lora.target_modules" in err and "'qkv' is not a module" in err
