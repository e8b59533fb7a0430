"""The ``actor_rollout_ref`` config verl's ``ActorRolloutRefWorker`` reads, built from :func:`.options.translate`.

A group in worker-group mode (``options.workers: ray``) is hosted the way
verl's own trainer hosts its actor: ranks of ``ActorRolloutRefWorker``
reading the Hydra config tree ``actor_rollout_ref.{model,actor,ref,rollout}``.
That tree is composed from verl's ``ppo_trainer`` defaults and then filled
with the *same* translated dataclasses the in-process engine gets, so both
modes train with identical engine, optimiser and rollout settings; only the
layout fields (micro-batch placeholders, rank counts, the checkpoint engine)
are set here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from unimas.groups.base import GroupSpec
from unimas.groups.verl import lora
from unimas.groups.verl.options import MODEL_FIELDS, VerlOptions, translate

INFER_MICRO_BATCH = 64
"""Rows per forward in log-prob passes (each call also sets its own micro-batch, see ``VerlModelGroup``)."""


def _plain(value: Any) -> Any:
    """A config value as OmegaConf stores it (tuples become lists)."""
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _fill(section: Any, config: Any, only: tuple[str, ...] | None = None) -> None:
    """Copy a translated dataclass's own settings into a Hydra section (nested configs keep verl's defaults)."""
    from omegaconf import open_dict

    with open_dict(section):
        for field in dataclasses.fields(config):
            value = getattr(config, field.name)
            if field.name.startswith("_") or dataclasses.is_dataclass(value) or (only and field.name not in only):
                continue
            section[field.name] = _plain(value)


def compose(spec: GroupSpec, model_dir: str) -> Any:
    """verl's full trainer config (a ``DictConfig``) for hosting ``spec`` on ``options.world_size`` ranks."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    options: VerlOptions = spec.options
    configs = translate(spec, model_dir)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        root = hydra_compose(config_name="ppo_trainer")
    GlobalHydra.instance().clear()
    tree = root.actor_rollout_ref
    budget, dynamic = options.max_token_len_per_gpu, options.dynamic_batch_size
    adapter = lora.model_fields(lora.adapter_in_use(spec.config, spec.adapters))
    _fill(tree.model, configs.actor.model_config, MODEL_FIELDS + tuple(adapter) + tuple(options.overrides.model))
    _fill(tree.actor.fsdp_config, configs.actor.engine_config)
    if configs.actor.optimizer_config is not None:
        _fill(tree.actor.optim, configs.actor.optimizer_config)
    with open_dict(tree):
        tree.actor.update(strategy=options.strategy, ppo_mini_batch_size=options.world_size,
                          ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=dynamic, ppo_max_token_len_per_gpu=budget,
                          use_torch_compile=False)
        tree.actor.checkpoint.update(save_contents=list(configs.actor.checkpoint_config.save_contents),
                                     load_contents=list(configs.actor.checkpoint_config.load_contents))
        tree.ref.update(strategy=options.strategy, log_prob_micro_batch_size_per_gpu=INFER_MICRO_BATCH,
                        log_prob_use_dynamic_bsz=dynamic, log_prob_max_token_len_per_gpu=budget,
                        use_torch_compile=False)
        if configs.reference is not None:
            _fill(tree.ref.fsdp_config, configs.reference.engine_config)
        _fill(tree.rollout, configs.rollout)
        tree.rollout.update(log_prob_micro_batch_size_per_gpu=INFER_MICRO_BATCH, log_prob_use_dynamic_bsz=dynamic,
                            log_prob_max_token_len_per_gpu=budget, n_gpus_per_node=options.world_size, nnodes=1)
        tree.rollout.checkpoint_engine.backend = "naive"
        root.trainer.update(n_gpus_per_node=options.world_size, nnodes=1)
    return root


def role(spec: GroupSpec) -> str:
    """The ``ActorRolloutRefWorker`` role: with a KL reference ``actor_rollout_ref``, else ``actor_rollout``."""
    return "actor_rollout_ref" if spec.config.trainable and spec.algorithm.kl_coef > 0 else "actor_rollout"
