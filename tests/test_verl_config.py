"""verl backend configuration: unimas settings -> verl dataclass configs for 1, 2 and 3 groups with mixed sharing,
validation errors for mixes verl cannot run, and the dry-run plan. No engine is built."""

from __future__ import annotations

import copy

import pytest

from tests.conftest import EXAMPLES, save_tiny_model
from unimas.cli import main
from unimas.config.loading import config_from_dict
from unimas.contract.registry import build_registry
from unimas.groups.verl.options import translate
from unimas.preflight.validate import check_config
from unimas.runtime.build import group_spec
from unimas.runtime.placement import placement_plan

TINY = {"architecture": "qwen2", "alphabet": "SL:abcdefgh", "hidden_size": 32, "num_layers": 1, "num_heads": 4}


def verl_group(**extra) -> dict:
    group = {"backend": "verl", "options": {"tiny": dict(TINY)}}
    for key, value in extra.items():
        group.setdefault(key, {}).update(value) if isinstance(value, dict) else group.__setitem__(key, value)
    return group


def experiment(models: dict, roles: dict, **algorithm) -> dict:
    return {
        "name": "verl_config", "models": models,
        "roles": {name: {"model": model, "template": "S:{target}" if name == "speaker" else "L:{message}",
                         "generation": {"max_new_tokens": 1}} for name, model in roles.items()},
        "workflow": {"name": "signalling"}, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "group_size": 4, **algorithm}, "trainer": {"steps": 7},
    }


@pytest.fixture(scope="module")
def registry():
    return build_registry()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """One tiny HF dir for verl's HFModelConfig to read (the group writes its own at build time)."""
    return save_tiny_model(tmp_path_factory.mktemp("verl_tiny"), TINY)


def translated(tree: dict, registry, model_dir: str) -> dict:
    config = config_from_dict(tree)
    assert check_config(config, registry) == []
    return {name: translate(group_spec(config, registry, name), model_dir)
            for name, group in config.models.items() if group.backend == "verl"}


def test_one_group_shared_by_two_roles(registry, model_dir):
    tree = experiment({"shared": verl_group(optim={"lr": 0.004, "grad_clip": 0.5})},
                      {"speaker": "shared", "listener": "shared"})
    configs = translated(tree, registry, model_dir)["shared"]
    engine, optim = configs.actor.engine_config, configs.actor.optimizer_config
    assert engine.strategy == "fsdp2" and not engine.forward_only
    assert engine.mixed_precision["param_dtype"] == "fp32"
    assert optim.lr == 0.004 and optim.clip_grad == 0.5 and optim.total_training_steps == 7
    assert configs.actor.model_config.override_config["attn_implementation"] == "sdpa"
    assert configs.reference is None  # kl_coef 0: no reference worker
    assert configs.rollout.name == "unimas_hf"
    assert configs.rollout.custom == {"server_name_prefix": "unimas_shared_hf_", "group": "shared"}


def test_two_groups_one_verl_one_torch(registry, model_dir):
    torch_group = {"backend": "torch", "options": {"tiny": dict(TINY)}}
    tree = experiment({"speaker_model": verl_group(options={"dtype": "bfloat16"}), "listener_model": torch_group},
                      {"speaker": "speaker_model", "listener": "listener_model"})
    configs = translated(tree, registry, model_dir)
    assert list(configs) == ["speaker_model"]
    engine = configs["speaker_model"].actor.engine_config
    assert engine.mixed_precision == {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert configs["speaker_model"].rollout.dtype == "bfloat16"


def test_three_groups_mixed_sharing_kl_frozen_and_overrides(registry, model_dir):
    models = {
        "a": verl_group(algorithm={"kl_coef": 0.1}, optim={"schedule": "cosine", "warmup_steps": 2}),
        "b": verl_group(options={"overrides": {"engine": {"infer_micro_batch_size_per_gpu": 3},
                                               "rollout": {"temperature": 0.5}}}),
        "c": verl_group(trainable=False),
    }
    roles = {"speaker": "a", "listener": "a", "judge": "b", "critic": "c"}
    tree = experiment(models, roles)
    tree["roles"]["judge"]["template"] = tree["roles"]["critic"]["template"] = "S:{target}"
    tree["roles"]["critic"]["trainable"] = False
    configs = translated(tree, registry, model_dir)
    a, b, c = configs["a"], configs["b"], configs["c"]
    assert a.reference is not None and a.reference.engine_config.forward_only and a.reference.optimizer_config is None
    assert a.actor.optimizer_config.lr_scheduler_type == "cosine" and a.actor.optimizer_config.lr_warmup_steps == 2
    assert b.reference is None and b.actor.engine_config.infer_micro_batch_size_per_gpu == 3
    assert b.rollout.temperature == 0.5 and a.rollout.temperature != 0.5
    assert c.actor.engine_config.forward_only and c.actor.optimizer_config is None and c.reference is None
    prefixes = {name: cfg.rollout.custom["server_name_prefix"] for name, cfg in configs.items()}
    assert len(set(prefixes.values())) == 3
    assert len({cfg.rollout.seed for cfg in configs.values()}) == 3  # per-group seeds


def test_unknown_override_field_is_named(registry, model_dir):
    tree = experiment({"m": verl_group(options={"overrides": {"engine": {"no_such_field": 1}}})},
                      {"speaker": "m", "listener": "m"})
    config = config_from_dict(tree)
    with pytest.raises(ValueError, match="no field 'no_such_field'"):
        translate(group_spec(config, registry, "m"), model_dir)


def problems_of(tree: dict, registry) -> dict[str, str]:
    return dict(check_config(config_from_dict(tree), registry))


def test_validation_refuses_what_verl_cannot_run(registry):
    base = experiment({"m": verl_group(), "n": verl_group()}, {"speaker": "m", "listener": "n"})
    cases = [
        ({"m": {"options": {"strategy": "fsdp"}}}, "models.m.options.strategy", "FSDP1"),
        ({"m": {"options": {"rollout": "vllm"}}}, "models.m.options.workers", "workers: ray"),
        ({"m": {"options": {"rollout": "vllm", "tensor_parallel_size": 2}, "resources": {"gpus": 1}}},
         "models.m.options.tensor_parallel_size", "whole GPUs"),
        ({"m": {"resources": {"gpus": 2}}}, "models.m.resources.gpus", "workers: ray"),
        ({"m": {"optim": {"schedule": "linear"}}}, "models.m.optim.schedule", "constant and cosine"),
        ({"m": {"options": {"rollout_mode": "standalone"}}}, "models.m.options.rollout_mode", "not implemented"),
    ]
    for change, where, message in cases:
        tree = copy.deepcopy(base)
        for key, value in change["m"].items():
            tree["models"]["m"].setdefault(key, {}).update(value)
        found = problems_of(tree, registry)
        assert where in found and message in found[where], (change, found)
    assert problems_of(base, registry) == {}


def test_fsdp1_is_allowed_with_a_gpu_and_two_adapters_are_refused(registry):
    tree = experiment({"m": verl_group(options={"strategy": "fsdp"}, resources={"gpus": 1})},
                      {"speaker": "m", "listener": "m"})
    assert problems_of(tree, registry) == {}
    tree = experiment({"m": verl_group(lora={"r": 4})}, {"speaker": "m", "listener": "m"})
    tree["roles"]["speaker"]["adapter"] = "s"
    tree["roles"]["listener"]["adapter"] = "l"
    found = problems_of(tree, registry)
    assert "at most one per model" in found["models.m.lora"]


def test_vllm_groups_sharing_one_gpu_must_leave_room(registry):
    def shared(memory: float) -> dict:
        return verl_group(options={"rollout": "vllm", "gpu_memory_utilization": memory}, resources={"gpus": 0.5})

    tree = experiment({"m": shared(0.5), "n": shared(0.5)}, {"speaker": "m", "listener": "n"})
    found = problems_of(tree, registry)
    assert "1.00 of its memory" in found["models.*.options.gpu_memory_utilization"]
    tree = experiment({"m": shared(0.4), "n": shared(0.4)}, {"speaker": "m", "listener": "n"})
    found = problems_of(tree, registry)
    assert "models.*.options.gpu_memory_utilization" not in found
    assert "workers: ray" in found["models.m.options.workers"]  # vLLM is fed by a worker group's ranks


def test_dry_run_plan_names_engine_rollout_and_devices():
    tree = experiment({"m": verl_group(), "n": verl_group(options={"rollout": "vllm", "gpu_memory_utilization": 0.3},
                                                          resources={"gpus": 0.5})},
                      {"speaker": "m", "listener": "n"})
    plan = placement_plan(config_from_dict(tree))
    assert "verl group m: trained, fsdp2 engine on CPU (gloo), rollout hf (hybrid" in plan
    assert "verl group n: trained, fsdp2 engine on a shared GPU, rollout vllm TP 1, memory fraction 0.3" in plan


@pytest.mark.parametrize("name", ["verl_one_gpu.yaml", "verl_multi_gpu.yaml", "verl_vllm_one_gpu.yaml",
                                  "verl_vllm_four_gpus.yaml"])
def test_gpu_examples_validate(name, model_dir, capsys):
    """The GPU examples point at a model the user downloads: a tiny model dir stands in."""
    sets = [a for g in ("solver_model", "verifier_model") for a in ("--set", f"models.{g}.options.path={model_dir}")]
    assert main(["validate", str(EXAMPLES / "gpu" / name), *sets]) == 0
    assert "roles -> model groups" in capsys.readouterr().out


def test_one_gpu_example_dry_run_plans_two_groups_on_a_shared_gpu(model_dir, capsys):
    sets = [a for g in ("solver_model", "verifier_model") for a in ("--set", f"models.{g}.options.path={model_dir}")]
    assert main(["train", str(EXAMPLES / "gpu" / "verl_one_gpu.yaml"), "--dry-run", *sets]) == 0
    out = capsys.readouterr().out
    for group in ("solver_model", "verifier_model"):
        assert f"verl group {group}: trained, fsdp2 engine on a shared GPU, rollout hf (hybrid" in out
    assert "total: 2 CPU, 1 GPU" in out


def test_four_gpu_vllm_example_plans_two_ranked_groups(model_dir, capsys):
    sets = [a for g in ("solver_model", "verifier_model") for a in ("--set", f"models.{g}.options.path={model_dir}")]
    assert main(["train", str(EXAMPLES / "gpu" / "verl_vllm_four_gpus.yaml"), "--dry-run", *sets]) == 0
    out = capsys.readouterr().out
    for group in ("solver_model", "verifier_model"):
        assert f"verl group {group}: trained, fsdp2 engine on a Ray worker group of 2 rank(s) on 2 GPU, rollout vllm" \
            in out
