"""The torch backend's settings under ``models.<group>.options``, validated by the backend itself.

They live here, not in ``unimas.config.schema``, because only this backend reads
them: a tiny char-level model spec means nothing to an API endpoint or to a
verl worker. Unknown keys are errors, as everywhere in the config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from unimas.config.loading import missing_model_hint
from unimas.config.strict import Strict
from unimas.groups.vllm_engine import VllmOptions, serving_problem

if TYPE_CHECKING:
    import torch

SamplerKind = Literal["inplace", "copy", "replica", "vllm"]
"""The sampling engines (:data:`unimas.groups.torch.sampler.ENGINES` maps each to its class)."""

MODEL_DIR = "model"
"""The weights folder inside a saved group (``unimas.groups.torch.checkpoint`` writes it): defined here so that
checking options (``unimas validate``) needs neither torch nor transformers."""


class TinyModelConfig(Strict):
    """A random-init causal LM built from config: no download, CPU friendly."""

    architecture: Literal["qwen2", "llama", "gpt2"] = Field("qwen2", description="transformers model family")
    alphabet: str = Field(..., min_length=1, description="characters of the char-level tokenizer")
    hidden_size: int = Field(64, ge=8, description="width of the residual stream")
    num_layers: int = Field(2, ge=1, description="transformer blocks")
    num_heads: int = Field(4, ge=1, description="attention heads (must divide hidden_size)")
    intermediate_size: Optional[int] = Field(None, ge=1, description="MLP width; default 4 x hidden_size")
    max_positions: int = Field(128, ge=8, description="longest prompt + response in tokens")
    init_std: float = Field(0.1, gt=0, description="std of the random init (HF's 0.02 is too symmetric for RL)")
    tie_embeddings: bool = Field(False, description="share input and output embeddings")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; "
                             "pick num_heads among its divisors")
        return self


class TorchOptions(Strict):
    """Where the weights come from (exactly one of ``path``, ``tiny``, ``init_from``) and their dtype."""

    path: Optional[str] = Field(None, description="local Hugging Face model directory (never downloaded)")
    tiny: Optional[TinyModelConfig] = Field(None, description="build a small random-init model from this spec")
    init_from: Optional[str] = Field(None, description="a unimas checkpoint dir (a group dir, or a run's "
                                     "checkpoints/step_N) or a Hugging Face model dir to start from")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weight dtype")
    rollout_process: bool = Field(False, description="sample in a child process holding a copy of the weights, "
                                  "refreshed after each update (with algorithm.max_staleness > 0, sampling and "
                                  "updates then overlap on separate cores; docs/performance.md); the same as "
                                  "sampler: replica")
    sampler: Optional[SamplerKind] = Field(None, description="where sampling runs: 'inplace' (the trained weights, "
                                           "generate and update take turns), 'copy' (a copy of the weights in this "
                                           "process, refreshed after each update), 'replica' (a copy in a child "
                                           "process), 'vllm' (a vLLM engine in a child process, weights sent "
                                           "through a safetensors file; docs/verl.md); default: replica with "
                                           "rollout_process, else copy when algorithm.max_staleness > 0, else inplace")
    vllm: Optional[VllmOptions] = Field(None, description="the vLLM engine's sizes and log-prob check "
                                        "(with sampler: vllm)")

    def sampler_kind(self, max_staleness: int) -> SamplerKind:
        """The sampler this group builds: ``sampler`` when given, else what ``rollout_process`` and the
        pipeline's staleness selected before the option existed (configs written then keep their behaviour)."""
        if self.sampler is not None:
            return self.sampler
        if self.rollout_process:
            return "replica"
        return "copy" if max_staleness > 0 else "inplace"

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: Any) -> Any:
        """Checked before the fields, so that two sources are named as such rather than as a bad path."""
        if not isinstance(data, dict):
            return data
        given = [key for key in ("path", "tiny", "init_from") if data.get(key) is not None]
        if len(given) != 1:
            found = f"got {' and '.join(given)}" if given else "got none"
            raise ValueError("give exactly one of 'path' (local Hugging Face dir), 'tiny' (built from a spec) "
                             f"or 'init_from' (a checkpoint to start from); {found}")
        return data

    @model_validator(mode="after")
    def _one_sampler(self) -> "TorchOptions":
        if self.rollout_process and self.sampler not in (None, "replica"):
            raise ValueError(f"rollout_process: true samples in a replica, but sampler is '{self.sampler}'; give "
                             "one of the two (rollout_process is the older spelling of sampler: replica)")
        return self

    @model_validator(mode="after")
    def _vllm_can_serve(self) -> "TorchOptions":
        """What vLLM cannot serve is refused here (``unimas validate``), not after its engine started."""
        if self.vllm is not None and self.sampler != "vllm":
            raise ValueError("'vllm' settings are given but the sampler is not vllm; add sampler: vllm")
        if self.sampler == "vllm":
            problem = serving_problem(_head_size(self))
            if problem is not None:
                raise ValueError(problem)
        return self

    @field_validator("path")
    @classmethod
    def _model_dir(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _has_file(Path(value), "config.json"):
            hint = "" if _exists(Path(value)) else missing_model_hint(value)
            raise ValueError(f"{value!r} is not a Hugging Face model directory (no config.json in it); give the "
                             f"local directory that holds config.json and the weights (nothing is downloaded){hint}")
        return value

    @field_validator("init_from")
    @classmethod
    def _checkpoint_dir(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _is_checkpoint(Path(value)):
            raise ValueError(f"{value!r} is neither a unimas checkpoint (a group dir with {MODEL_DIR}/config.json, "
                             f"or a run's checkpoints/step_N) nor a Hugging Face model directory (config.json)")
        return value

    @property
    def max_positions(self) -> Optional[int]:
        """Longest prompt + response when known without loading weights (a tiny spec); else None."""
        return self.tiny.max_positions if self.tiny is not None else None

    @property
    def alphabet(self) -> Optional[str]:
        """Every character a prompt may contain, for a char-level tiny model; else None."""
        return self.tiny.alphabet if self.tiny is not None else None

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.dtype)


def _head_size(options: TorchOptions) -> Optional[int]:
    """The attention head size of the model the options load, when known without loading it."""
    if options.tiny is not None:
        return options.tiny.hidden_size // options.tiny.num_heads
    try:
        config = json.loads((Path(options.path or options.init_from or "") / "config.json").read_text())
    except (OSError, ValueError):
        return None
    width, heads = config.get("hidden_size"), config.get("num_attention_heads")
    explicit = config.get("head_dim")
    return int(explicit) if isinstance(explicit, int) else (width // heads if isinstance(width, int) and
                                                          isinstance(heads, int) and heads > 0 else None)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _has_file(directory: Path, name: str) -> bool:
    """Whether ``directory/name`` is a file; False for names the file system cannot hold."""
    try:
        return (directory / name).is_file()
    except (OSError, ValueError):
        return False


def _is_checkpoint(root: Path) -> bool:
    """A layout ``checkpoint.group_dir`` accepts: group dir, run checkpoint of group dirs, or HF dir."""
    if _has_file(root, "config.json") or _has_file(root / MODEL_DIR, "config.json"):
        return True
    try:
        return root.is_dir() and any(_has_file(child / MODEL_DIR, "config.json") for child in root.iterdir())
    except OSError:
        return False
