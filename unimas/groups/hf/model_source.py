"""Where a model group's weights come from: a local Hugging Face dir, a tiny spec, or a unimas checkpoint.

The torch and verl backends read the same three sources with the same
checks and messages (:class:`ModelSource`), and the torch backend's checkpoint
layout (``<group>/model/``, :data:`MODEL_DIR`) is what ``init_from`` reads on
either. Checking a source imports neither torch nor transformers, so
``unimas validate`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from unimas.config.loading import missing_model_hint
from unimas.config.strict import Strict

if TYPE_CHECKING:
    import torch

MODEL_DIR = "model"
"""The weights folder inside a saved torch group (``unimas.groups.torch.checkpoint`` writes it, ``init_from`` reads
it): defined here so that checking options (``unimas validate``) needs neither torch nor transformers."""


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


class TinyModelFacts:
    """What options with a ``tiny`` field say about the model without loading it (the torch and verl options)."""

    @property
    def max_positions(self) -> Optional[int]:
        """Longest prompt + response when known without loading weights (a tiny spec); else None."""
        return self.tiny.max_positions if self.tiny is not None else None

    @property
    def alphabet(self) -> Optional[str]:
        """Every character a prompt may contain, for a char-level tiny model; else None."""
        return self.tiny.alphabet if self.tiny is not None else None


class ModelSource(Strict, TinyModelFacts):
    """Where the weights come from (exactly one of ``path``, ``tiny``, ``init_from``) and their dtype."""

    path: Optional[str] = Field(None, description="local Hugging Face model directory (never downloaded)")
    tiny: Optional[TinyModelConfig] = Field(None, description="build a small random-init model from this spec")
    init_from: Optional[str] = Field(None, description="a unimas checkpoint dir (a group dir, or a run's "
                                     "checkpoints/step_N) or a Hugging Face model dir to start from")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weight dtype")
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
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.dtype)


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
    """A layout :func:`unimas.groups.hf.source.group_dir` accepts: group dir, run checkpoint of group dirs, or HF dir."""
    if _has_file(root, "config.json") or _has_file(root / MODEL_DIR, "config.json"):
        return True
    try:
        return root.is_dir() and any(_has_file(child / MODEL_DIR, "config.json") for child in root.iterdir())
    except OSError:
        return False
