"""One LoRA adapter on a verl group: unimas's ``models.<g>.lora`` as verl's HFModelConfig fields, and its limits.

verl's FSDP engine wraps the model in one peft adapter (``lora_rank > 0``)
and trains only that adapter; the KL reference worker never gets it (the
reference is the bare base, what the adapter's KL term should measure against).

The rollout holds the same peft wrapping (:func:`wrap_rollout_model`) and each
sync sends it the engine's base and adapter tensors under their peft names
(:func:`peft_weights`), so it computes base + adapter exactly as the trainer
does. Merged weights (``lora.merge``, what verl's own export sends, in bfloat16)
were tried: merging in float32 changes the rounding, and the rollout's
log-probs drifted past the sync tolerance (2.8e-5 > 1e-5 at lr 0.03 on the
quickstart; full-weight groups stay near 1e-6). ``merge`` stays set so that
verl-side exports hand a plain Hugging Face rollout full weights.

The rollout serves only the adapted model; from that follow the limits checked
here: one adapter per group, every role on the group uses it, the base stays
frozen, and a frozen group has nothing to adapt. verl and peft are imported
lazily, so validation stays free of them.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Optional

from unimas.config.schema import ExperimentConfig, LoraConfig, ModelGroupConfig

if TYPE_CHECKING:
    import torch


def adapter_in_use(group: ModelGroupConfig, adapters: list[str]) -> Optional[LoraConfig]:
    """The group's LoRA settings when a role trains through its adapter; None for a full-weight group."""
    return group.lora if group.lora is not None and adapters else None


def model_fields(lora: Optional[LoraConfig]) -> dict[str, Any]:
    """verl ``HFModelConfig`` keyword arguments for the adapter (``merge``: verl's own exports send full weights)."""
    if lora is None:
        return {}
    return {"lora_rank": lora.r, "lora_alpha": lora.alpha, "target_modules": list(lora.target_modules),
            "lora": {"merge": True}}


@contextmanager
def seeded_init(model_config: Any, seed: int) -> Iterator[None]:
    """Seed the adapter's random init (peft's ``lora_A``), which verl leaves to the global RNG: without it two runs
    with one ``trainer.seed`` differ. The global RNG is restored afterwards; full-weight groups are untouched."""
    if not model_config.lora_rank:
        yield
        return
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def wrap_rollout_model(model: Any, model_config: Any) -> Any:
    """The rollout's model with the engine's peft adapter layout (weights arrive with the first sync)."""
    if not model_config.lora_rank:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    with seeded_init(model_config, 0):  # the init is overwritten by the sync; keep the global RNG untouched
        return get_peft_model(model, PeftLoraConfig(task_type="CAUSAL_LM", r=model_config.lora_rank,
                                                    lora_alpha=model_config.lora_alpha,
                                                    target_modules=model_config.target_modules, bias="none"))


def peft_weights(engine: Any) -> Iterator[tuple[str, "torch.Tensor"]]:
    """The engine's base and adapter tensors, full (unsharded), under the peft names both sides share."""
    for name, tensor in engine.module.state_dict().items():
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def group_problems(name: str, group: ModelGroupConfig, adapters: list[str]) -> list[tuple[str, str]]:
    """(config field, problem) for the group's LoRA settings; roles: :func:`role_problems`."""
    where = f"models.{name}.lora"
    lora = group.lora
    if len(adapters) > 1:
        return [(where, f"roles give model group '{name}' {len(adapters)} LoRA adapters ({', '.join(adapters)}); "
                 "verl trains at most one per model, so split the roles over several verl groups or use "
                 "backend: torch")]
    if lora is not None and not group.trainable:
        return [(where, f"model group '{name}' is frozen (trainable: false): a verl LoRA adapter would never "
                 "move from its initial (zero) update; drop the lora section and the roles' adapters")]
    if lora is None or not adapters:
        return []
    problems = []
    if lora.train_base:
        problems.append((f"{where}.train_base", "verl's engine trains the adapter only (base frozen); set "
                         "train_base: false, drop lora to train the full model, or use backend: torch"))
    if lora.dropout > 0:
        problems.append((f"{where}.dropout", "verl's engine builds its adapter without dropout; set dropout: 0 "
                         "or use backend: torch"))
    return problems


def role_problems(config: ExperimentConfig, name: str) -> list[tuple[str, str]]:
    """Roles on a verl LoRA group that do not use its adapter: the rollout serves the adapted model only."""
    roles = {role_name: role for role_name, role in sorted(config.roles.items()) if role.model == name}
    adapters = sorted({role.adapter for role in roles.values() if role.adapter})
    if config.models[name].lora is None or len(adapters) != 1:
        return []
    return [(f"roles.{role_name}.adapter", f"model group '{name}' (verl) generates with its LoRA adapter "
             f"'{adapters[0]}' only, so it cannot also generate with the bare base; give this role "
             f"adapter: {adapters[0]}, or move it to another model group")
            for role_name, role in roles.items() if not role.adapter]
