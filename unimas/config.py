"""The typed experiment config: one pydantic model, loaded from YAML.

Unknown keys are errors everywhere (``extra="forbid"``) so a typo never
silently falls back to a default. ``--set a.b=c`` overrides are applied to
the raw YAML tree before validation, so they get the same checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from unimas.errors import UserError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TinyModelConfig(Strict):
    """A random-init causal LM built from config: no download, CPU friendly."""

    architecture: Literal["qwen2", "llama", "gpt2"] = "qwen2"
    alphabet: str = Field(..., min_length=1, description="characters of the char-level tokenizer")
    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: Optional[int] = None
    max_positions: int = Field(128, ge=8)
    init_std: float = Field(0.1, gt=0)
    tie_embeddings: bool = False


class LoraConfig(Strict):
    r: int = Field(8, ge=1)
    alpha: float = 16.0
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    train_base: bool = False


class OptimConfig(Strict):
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0)


class ResourcesConfig(Strict):
    cpus: float = Field(1.0, ge=0)
    gpus: float = Field(0.0, ge=0)
    memory_gb: Optional[float] = Field(None, gt=0)


class ModelGroupConfig(Strict):
    """One set of weights. Several roles may map to it."""

    backend: str = "torch"
    path: Optional[str] = Field(None, description="local Hugging Face model directory")
    tiny: Optional[TinyModelConfig] = None
    init_from: Optional[str] = Field(None, description="checkpoint dir written by unimas (e.g. `unimas sft`)")
    trainable: bool = True
    optim: OptimConfig = Field(default_factory=OptimConfig)
    lora: Optional[LoraConfig] = Field(None, description="set to allow LoRA adapters per role on this group")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    endpoint: Optional[str] = Field(None, description="OpenAI-compatible base URL for frozen API roles (backend: openai)")
    api_model: Optional[str] = Field(None, description="model name sent to the endpoint")
    api_key_env: Optional[str] = Field(None, description="environment variable that holds the endpoint's API key")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _one_source(self) -> "ModelGroupConfig":
        sources = [s for s in (self.path, self.tiny, self.endpoint) if s is not None]
        if len(sources) != 1 and self.init_from is None:
            raise ValueError("give exactly one of 'path' (local HF dir), 'tiny' (built from config) or 'endpoint'")
        return self


class GenerationConfig(Strict):
    max_new_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    require_eos: bool = Field(True, description="no EOS within max_new_tokens = format error")


class RoleConfig(Strict):
    """A logical agent: a prompt template on top of a model group."""

    model: str
    adapter: Optional[str] = Field(None, description="LoRA adapter name; needs `lora` on the model group")
    system: str = ""
    template: str = Field(..., description="Python format string, e.g. 'S:{target}'")
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    eval_generation: Optional[GenerationConfig] = None
    trainable: bool = True
    parser: Optional[str] = Field(None, description="regex whose first group is the parsed answer")


class GraphNodeConfig(Strict):
    kind: Literal["llm", "tool"]
    role: Optional[str] = None
    tool: Optional[str] = None
    inputs: dict[str, str] = Field(default_factory=dict, description="template var -> expression")
    max_visits: int = Field(1, ge=1)


class GraphEdgeConfig(Strict):
    source: str = Field(..., alias="from")
    target: str = Field(..., alias="to")
    when: Optional[str] = None
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class GraphConfig(Strict):
    start: str
    nodes: dict[str, GraphNodeConfig]
    edges: list[GraphEdgeConfig] = Field(default_factory=list)
    outcome: dict[str, str] = Field(default_factory=dict, description="outcome key -> expression")
    max_steps: int = Field(32, ge=1)


class WorkflowConfig(Strict):
    name: Optional[str] = None
    graph: Optional[GraphConfig] = None
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_kind(self) -> "WorkflowConfig":
        if (self.name is None) == (self.graph is None):
            raise ValueError("give exactly one of 'name' (a registered workflow) or 'graph' (inline)")
        return self


class DataConfig(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    eval_params: Optional[dict[str, Any]] = None


class RewardConfig(Strict):
    name: str
    level: Literal["trajectory", "role", "turn"] = "trajectory"
    weight: float = 1.0
    roles: Optional[list[str]] = Field(None, description="roles that receive it; default all")
    params: dict[str, Any] = Field(default_factory=dict)


class AlgorithmConfig(Strict):
    estimator: str = "grpo"
    grouping: Literal["role", "role_turn", "trajectory"] = "role"
    group_size: int = Field(8, ge=1)
    norm_by_std: bool = True
    loss: str = "vanilla"
    loss_agg_mode: str = "token-mean"
    clip_ratio: float = Field(0.2, gt=0)
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    kl_coef: float = Field(0.0, ge=0)
    kl_type: str = "low_var_kl"
    entropy_coef: float = Field(0.0, ge=0)
    ppo_epochs: int = Field(1, ge=1)
    mini_batch_size: int = Field(0, ge=0, description="turns per optimiser step; 0 = whole batch")
    gamma: float = 1.0


class TrainerConfig(Strict):
    steps: int = Field(100, ge=0)
    seed: int = 0
    tasks_per_step: int = Field(32, ge=1)
    save_every: int = Field(0, ge=0, description="0 = only at the end")
    eval_every: int = Field(10, ge=0, description="0 = only at start and end")
    eval_size: int = Field(64, ge=1)
    eval_samples: int = Field(1, ge=1, description="episodes per eval task; >1 also reports pass@k")
    sample_trajectories: int = Field(4, ge=0, description="trajectories per step written to JSONL")
    torch_threads: int = Field(1, ge=1)
    stop_at_accuracy: Optional[float] = Field(None, ge=0, le=1, description="end early once eval reaches this")
    failure_budget: float = Field(0.5, ge=0, le=1, description="max fraction of failed episodes per step")


class RuntimeConfig(Strict):
    kind: Literal["local", "ray"] = "local"
    max_batch_size: int = Field(256, ge=1)
    max_wait_ms: float = Field(5.0, ge=0)
    max_concurrent_episodes: int = Field(1024, ge=1)
    address: Optional[str] = None
    restart_failed_groups: bool = False


class LoggingConfig(Strict):
    console: bool = True
    tensorboard: bool = False
    wandb: Optional[dict[str, Any]] = None
    report: bool = True


class ExperimentConfig(Strict):
    name: str = "experiment"
    plugins: list[str] = Field(default_factory=list)
    models: dict[str, ModelGroupConfig]
    roles: dict[str, RoleConfig]
    workflow: WorkflowConfig
    data: DataConfig
    rewards: list[RewardConfig] = Field(default_factory=list)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)


def _parse_scalar(text: str) -> Any:
    """Interpret a ``--set`` value the way YAML would (numbers, bools, null, lists)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(tree: dict, assignment: str) -> None:
    if "=" not in assignment:
        raise UserError(f"override '{assignment}' must look like key.path=value", where="--set")
    path, value = assignment.split("=", 1)
    keys = path.strip().split(".")
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise UserError(f"'{key}' in '{path}' is not a mapping", where="--set")
        node = child
    node[keys[-1]] = _parse_scalar(value)


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check spelling; unknown keys are errors)"
        lines.append(f"  {loc}: {msg}")
    return f"invalid config {source}:\n" + "\n".join(lines)


def config_from_dict(tree: dict, source: str = "<dict>") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(tree)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, source)) from None


def load_config(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    path = Path(path)
    try:
        tree = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError("config file not found", where=str(path)) from None
    except yaml.YAMLError as exc:
        raise UserError(f"not valid YAML: {exc}", where=str(path)) from None
    if not isinstance(tree, dict):
        raise UserError("the config must be a YAML mapping", where=str(path))
    for assignment in overrides:
        apply_override(tree, assignment)
    config = config_from_dict(tree, str(path))
    return _resolve_relative_paths(config, path.parent)


def _resolve_relative_paths(config: ExperimentConfig, base: Path) -> ExperimentConfig:
    """Model paths in a config are relative to the config file, not the cwd."""
    for group in config.models.values():
        for attr in ("path", "init_from"):
            value = getattr(group, attr)
            if value and not Path(value).is_absolute() and (base / value).exists():
                setattr(group, attr, str((base / value).resolve()))
    return config


def dump_config(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)
