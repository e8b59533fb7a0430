"""One LoRA adapter on a verl group: unimas's ``models.<g>.lora`` as verl's HFModelConfig fields, and its limits.

verl's FSDP engine wraps the model in one peft adapter (``lora_rank > 0``)
and trains only that adapter. The rollout is a plain Hugging Face model, so
the engine exports the **merged** weights (base + scale * B @ A) to it at
every sync; the rollout therefore serves exactly one behaviour, the adapted
model. From that follow the limits checked here: one adapter per group, every
role on the group uses it (a role without it would need the bare base, which
the rollout no longer holds), the base stays frozen, and a frozen group has
nothing to adapt. The KL reference worker never gets the adapter: it is the
base model, which is what the adapter's KL term should measure against.

verl's own merged export (``get_per_tensor_param`` with ``merge``) casts every
tensor to bfloat16, which a float32 rollout cannot match within the sync
tolerance; :func:`merged_weights` runs the same verl merge and keeps the
engine's precision. verl is imported lazily, so validation stays verl-free.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Optional

from unimas.config import ExperimentConfig, LoraConfig, ModelGroupConfig

if TYPE_CHECKING:
    import torch


def adapter_in_use(group: ModelGroupConfig, adapters: list[str]) -> Optional[LoraConfig]:
    """The group's LoRA settings when a role trains through its adapter; None for a full-weight group."""
    return group.lora if group.lora is not None and adapters else None


def model_fields(lora: Optional[LoraConfig]) -> dict[str, Any]:
    """verl ``HFModelConfig`` keyword arguments for the adapter (``merge``: the rollout gets full merged weights)."""
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


def merged_weights(engine: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full tensors of base + adapter in the engine's dtype; the base weights are restored afterwards.

    A generator: verl's merge context stays open until the consumer has copied every tensor.
    """
    from verl.utils.fsdp_utils import merged_lora_context, normalize_peft_param_name
    from verl.utils.model import convert_weight_keys

    module = engine.module
    with merged_lora_context(module, backup_adapters=True):
        params = convert_weight_keys(normalize_peft_param_name(module.state_dict()),
                                     getattr(module, "_fsdp_wrapped_module", module))
        for name, param in params.items():
            yield name, (param.full_tensor() if hasattr(param, "full_tensor") else param.detach().clone())


def group_problems(name: str, group: ModelGroupConfig, adapters: list[str],
                   rollout_server: bool = False) -> list[tuple[str, str]]:
    """(config field, problem) for the group's LoRA settings on their own (roles: :func:`role_problems`)."""
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
    if rollout_server:
        problems.append((f"models.{name}.options.rollout_server", "server mode syncs through verl's export, which "
                         "sends a LoRA group's merged weights in bfloat16 only; drop rollout_server for this group"))
    if lora.dropout > 0:
        problems.append((f"{where}.dropout", "verl's engine builds its adapter without dropout; set dropout: 0 "
                         "or use backend: torch"))
    return problems


def role_problems(config: ExperimentConfig, name: str) -> list[tuple[str, str]]:
    """Roles on a verl LoRA group that do not use its adapter: the rollout holds merged weights only."""
    roles = {role_name: role for role_name, role in sorted(config.roles.items()) if role.model == name}
    adapters = sorted({role.adapter for role in roles.values() if role.adapter})
    if config.models[name].lora is None or len(adapters) != 1:
        return []
    return [(f"roles.{role_name}.adapter", f"model group '{name}' (verl) serves its LoRA adapter "
             f"'{adapters[0]}' merged into the weights, so it cannot also generate with the bare base; give this "
             f"role adapter: {adapters[0]}, or move it to another model group")
            for role_name, role in roles.items() if not role.adapter]
