"""The verl backend's settings (``models.<group>.options``) and their translation into verl's dataclass configs.

unimas names stay the user-facing surface; this is the one module that knows
how they map onto verl 0.9.1's ``HFModelConfig``, ``FSDPEngineConfig``,
``FSDPOptimizerConfig``, ``RolloutConfig`` and ``TrainingWorkerConfig``.
Experts can set any verl field the mapping does not cover through
``overrides.<section>`` (applied last, unchecked by unimas, checked by verl).

verl imports are lazy, so validating a config never imports verl.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from unimas.config.schema import LoraConfig, OptimConfig
from unimas.config.strict import Strict
from unimas.groups.base import GroupSpec
from unimas.groups.hf.model_source import ModelSource, TinyModelConfig, TinyModelFacts
from unimas.groups.verl import lora, names

ROLLOUT_NAMES = {"hf": "unimas_hf", "vllm": "vllm"}
"""unimas rollout name -> the key verl's rollout registries know it by."""

SERVER_ROLLOUT = "unimas_hf_server"
"""verl registry key of the ``hf`` rollout served by a Ray actor (server mode, :mod:`.servers`)."""

PRECISION = {"float32": "fp32", "bfloat16": "bf16"}


class VerlOverrides(Strict):
    """Raw verl fields per config section, applied after the translation (for experts)."""

    model: dict[str, Any] = Field(default_factory=dict, description="verl HFModelConfig fields")
    engine: dict[str, Any] = Field(default_factory=dict, description="verl FSDPEngineConfig fields")
    optimizer: dict[str, Any] = Field(default_factory=dict, description="verl FSDPOptimizerConfig fields")
    rollout: dict[str, Any] = Field(default_factory=dict, description="verl RolloutConfig fields")


class VerlOptions(Strict, TinyModelFacts):
    """Where the weights come from, how verl's FSDP2 engine trains them, and which rollout generates."""

    path: Optional[str] = Field(None, description="local Hugging Face model directory (never downloaded)")
    tiny: Optional[TinyModelConfig] = Field(None, description="build a small random-init model from this spec")
    init_from: Optional[str] = Field(None, description="start from these weights: a unimas checkpoint (a verl or "
                                     "torch group dir, or a run's checkpoints/step_N) or a Hugging Face model dir; "
                                     "optimiser and sampling state start fresh")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="compute dtype of the FSDP2 engine "
                                                  "(weights and optimiser stay float32)")
    strategy: Literal["fsdp2", "fsdp"] = Field("fsdp2", description="verl engine; `fsdp` (FSDP1) needs a GPU")
    rollout: Literal["hf", "vllm"] = Field("hf", description="generation: `hf` = unimas's in-process rollout "
                                           "(CPU or GPU), `vllm` = verl's vLLM servers (GPU, `unimas[gpu]`)")
    rollout_mode: Literal["hybrid", "standalone"] = Field(
        "hybrid", description="hybrid = rollout shares the trainer's devices; standalone = its own GPUs")
    rollout_server: bool = Field(False, description="generate through verl's rollout servers (a Ray actor per "
                                 "group, routed in the group's process) and sync weights through verl's checkpoint "
                                 "engine (naive); false = the rollout lives in the group's process")
    workers: Literal["in_process", "ray"] = Field(
        "in_process", description="in_process = verl's engine in the group's process (one rank); ray = verl's "
        "RayWorkerGroup of ActorRolloutRefWorker ranks with verl's hybrid rollout servers (needed for several "
        "ranks and for rollout: vllm)")
    world_size: int = Field(1, ge=1, description="data-parallel ranks of a `workers: ray` group (on GPU one GPU "
                            "each, so equal to resources.gpus when that is 1 or more; on CPU gloo processes)")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor-parallel size")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="share of GPU memory for the vLLM cache")
    remove_padding: bool = Field(True, description="verl remove-padding (packed sequences) forward")
    dynamic_batch_size: bool = Field(False, description="micro-batches by token budget (log-prob passes)")
    max_token_len_per_gpu: int = Field(16384, ge=1, description="token budget per micro-batch (dynamic batch size)")
    sync_tolerance: float = Field(1e-4, ge=0, description="largest |rollout - trainer| log-prob after a weight "
                                  "sync; above it the update fails (float32: the two sides' kernels differ by "
                                  "~1e-6 on tiny models, ~1e-5 on larger ones; raise it for bfloat16)")
    overrides: VerlOverrides = Field(default_factory=VerlOverrides, description="raw verl config fields")

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: Any) -> Any:
        if isinstance(data, dict):
            given = [key for key in ("path", "tiny", "init_from") if data.get(key) is not None]
            if len(given) != 1:
                raise ValueError("give exactly one of 'path' (local Hugging Face dir), 'tiny' (built from a spec) "
                                 f"or 'init_from' (a checkpoint); got {' and '.join(given) if given else 'none'}")
        return data

    @model_validator(mode="after")
    def _path_is_model_dir(self) -> "VerlOptions":
        if self.path is not None:
            ModelSource(path=self.path)  # the kit's check and message for a bad directory
        if self.init_from is not None and not verl_checkpoints(Path(self.init_from)):
            ModelSource(init_from=self.init_from)  # not a verl checkpoint: a torch group's layouts and message
        return self

    @property
    def serves_hf(self) -> bool:
        """The ``hf`` rollout runs in a Ray server actor (server mode, or any worker-group group)."""
        return self.rollout == "hf" and (self.rollout_server or self.workers == "ray")

    def source(self, group: Optional[str] = None) -> Optional[ModelSource]:
        """The weights source the kit's loaders read (:mod:`unimas.groups.hf.source`); ``group`` picks it in a run
        checkpoint.

        None when ``init_from`` is a run checkpoint of verl groups without that
        group (or, with no group named, with several).
        """
        if self.init_from is None:
            return ModelSource(path=self.path, tiny=self.tiny)
        found = verl_checkpoints(Path(self.init_from))
        if not found:
            return ModelSource(init_from=self.init_from)
        if "" in found:  # init_from is the group's own checkpoint dir
            model = found[""]
        elif group is not None:
            model = found.get(group)
        else:  # no group named (validation helpers): only an unambiguous run checkpoint answers
            model = next(iter(found.values())) if len(found) == 1 else None
        return None if model is None else ModelSource(path=str(model))


VERL_HF_DIR = Path("verl_actor") / "huggingface"
"""Where a verl group checkpoint keeps its weights as a Hugging Face model (written by :mod:`.checkpoint`)."""


def verl_checkpoints(root: Path) -> dict[str, Path]:
    """The Hugging Face dirs of the verl group checkpoints at ``root`` by group name ("" for a group dir itself).

    A LoRA group's export holds peft-named tensors, which would load as a
    randomly initialised model: such a checkpoint is refused, not read.
    """
    if (root / VERL_HF_DIR / "config.json").is_file():
        found = {"": root / VERL_HF_DIR}
    else:
        children = sorted(root.iterdir()) if root.is_dir() else []
        found = {child.name: child / VERL_HF_DIR for child in children
                 if (child / VERL_HF_DIR / "config.json").is_file()}
    for name, model in found.items():
        if _peft_named(model):
            raise ValueError(f"{model} holds a LoRA group's adapter and base under peft names, not a plain model; "
                             "start from a full-weight group's checkpoint")
    return found


def _peft_named(model_dir: Path) -> bool:
    """Whether the weights in ``model_dir`` carry peft's names (``base_model.model.`` prefix, ``lora_`` tensors)."""
    from safetensors import safe_open

    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as weights:
            if any(key.startswith("base_model.model.") or ".lora_" in key for key in weights.keys()):
                return True
    return False


def _apply(target: Any, fields: dict[str, Any]) -> Any:
    for key, value in fields.items():
        if not hasattr(target, key):
            raise ValueError(f"verl {type(target).__name__} has no field '{key}'")
        object.__setattr__(target, key, value)
    return target


MODEL_FIELDS = ("path", "use_remove_padding", "override_config", "enable_gradient_checkpointing")
"""The ``HFModelConfig`` fields :func:`model_config` sets (the rest are verl's defaults or derived from the weights)."""


def model_config(options: VerlOptions, model_dir: str, adapter: Optional[LoraConfig] = None,
                 tokenizer_dir: Optional[str] = None):
    """verl's view of the weights: an HF dir, sdpa attention (no flash-attn on CPU), no gradient checkpointing;
    with ``adapter``, verl's one LoRA adapter (:mod:`.lora`); the tokenizer from ``tokenizer_dir`` if given
    (a critic's own model dir need not hold one)."""
    from verl.workers.config import HFModelConfig

    return _apply(HFModelConfig(path=model_dir, tokenizer_path=tokenizer_dir, use_remove_padding=options.remove_padding,
                                override_config={"attn_implementation": "sdpa"},
                                enable_gradient_checkpointing=False, **lora.model_fields(adapter)),
                  options.overrides.model)


def engine_config(options: VerlOptions, seed: int, forward_only: bool = False):
    """FSDP2 with float32 master weights and ``options.dtype`` compute."""
    from verl.workers.config import FSDPEngineConfig

    dtype = PRECISION[options.dtype]
    mixed = {"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    budget = options.max_token_len_per_gpu
    return _apply(FSDPEngineConfig(strategy=options.strategy, forward_only=forward_only, param_offload=False,
                                   optimizer_offload=False, use_dynamic_bsz=options.dynamic_batch_size,
                                   max_token_len_per_gpu=budget, infer_max_token_len_per_gpu=budget,
                                   micro_batch_size_per_gpu=1, infer_micro_batch_size_per_gpu=64,
                                   model_dtype="fp32", mixed_precision=mixed, use_torch_compile=False, seed=seed),
                  options.overrides.engine)


def optimizer_config(optim: OptimConfig, options: VerlOptions, total_updates: int):
    """AdamW with unimas's rate, betas, decay, clipping and (constant or cosine) schedule."""
    from verl.workers.config import FSDPOptimizerConfig

    return _apply(FSDPOptimizerConfig(lr=optim.lr, weight_decay=optim.weight_decay, betas=tuple(optim.betas),
                                      clip_grad=optim.grad_clip, lr_warmup_steps=optim.warmup_steps,
                                      lr_scheduler_type=optim.schedule, min_lr_ratio=optim.min_lr_ratio,
                                      total_training_steps=max(total_updates, 1)), options.overrides.optimizer)


def rollout_config(spec: GroupSpec, options: VerlOptions):
    """verl's rollout settings; the group name travels in ``custom`` so servers and sockets are per group."""
    from verl.workers.config import RolloutConfig

    name = SERVER_ROLLOUT if options.serves_hf else ROLLOUT_NAMES[options.rollout]
    return _apply(RolloutConfig(name=name, mode="async",
                                tensor_model_parallel_size=options.tensor_parallel_size,
                                gpu_memory_utilization=options.gpu_memory_utilization, seed=spec.seed,
                                dtype="bfloat16" if options.dtype == "bfloat16" else "float32",
                                load_format="dummy", free_cache_engine=True,
                                custom={"server_name_prefix": names.server_name_prefix(spec.name, options.rollout),
                                        "group": spec.name}),
                  options.overrides.rollout)


@dataclass
class VerlConfigs:
    """Everything verl needs to host one unimas model group."""

    actor: Any
    """TrainingWorkerConfig of the trained model."""
    reference: Optional[Any]
    """TrainingWorkerConfig of the frozen KL reference (forward only); None without a KL term."""
    rollout: Any
    """RolloutConfig."""
    critic: Optional[Any] = None
    """TrainingWorkerConfig of the value model (``model_type: value_model``); None without ``critic``."""


def translate(spec: GroupSpec, model_dir: str) -> VerlConfigs:
    """The verl configs for ``spec``, whose weights and tokenizer are in ``model_dir``."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import TrainingWorkerConfig

    options: VerlOptions = spec.options
    # verl's engine builds its own checkpoint manager from this; unimas never calls it (it unpickles on load),
    # the group's state is saved and loaded by unimas.groups.verl.checkpoint instead
    checkpoints = CheckpointConfig(save_contents=["model", "optimizer", "extra", "hf_model"],
                                   load_contents=["model", "optimizer", "extra"])

    def worker(forward_only: bool, adapter: Optional[LoraConfig] = None):
        return TrainingWorkerConfig(
            model_type="language_model", model_config=model_config(options, model_dir, adapter),
            engine_config=engine_config(options, spec.seed, forward_only),
            optimizer_config=None if forward_only else optimizer_config(spec.config.optim, options,
                                                                       spec.total_updates),
            checkpoint_config=checkpoints)

    reference = worker(True) if spec.config.trainable and spec.algorithm.kl_coef > 0 else None
    adapter = lora.adapter_in_use(spec.config, spec.adapters)  # the reference stays the bare base
    critic = spec.config.critic if spec.config.trainable else None
    # the value model: the group's initial weights (before any adapter) or critic.path, read with its tokenizer
    critic_worker = None if critic is None else TrainingWorkerConfig(
        model_type="value_model", model_config=model_config(options, critic.path or model_dir, None, model_dir),
        engine_config=engine_config(options, spec.seed),
        optimizer_config=optimizer_config(critic.optim, options, spec.total_updates), checkpoint_config=checkpoints)
    return VerlConfigs(actor=worker(not spec.config.trainable, adapter), reference=reference,
                       rollout=rollout_config(spec, options), critic=critic_worker)
