"""The torch backend's settings under ``models.<group>.options``, validated by the backend itself.

They live here, not in ``unimas.config``, because only this backend reads
them: a tiny char-level model spec means nothing to an API endpoint or to a
verl worker. Unknown keys are errors, as everywhere in the config.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TinyModelConfig(BaseModel):
    """A random-init causal LM built from config: no download, CPU friendly."""

    model_config = ConfigDict(extra="forbid")

    architecture: Literal["qwen2", "llama", "gpt2"] = Field("qwen2", description="transformers model family")
    alphabet: str = Field(..., min_length=1, description="characters of the char-level tokenizer")
    hidden_size: int = Field(64, ge=8, description="width of the residual stream")
    num_layers: int = Field(2, ge=1, description="transformer blocks")
    num_heads: int = Field(4, ge=1, description="attention heads (must divide hidden_size)")
    intermediate_size: Optional[int] = Field(None, description="MLP width; default 4 x hidden_size")
    max_positions: int = Field(128, ge=8, description="longest prompt + response in tokens")
    init_std: float = Field(0.1, gt=0, description="std of the random init (HF's 0.02 is too symmetric for RL)")
    tie_embeddings: bool = Field(False, description="share input and output embeddings")


class TorchOptions(BaseModel):
    """Where the weights come from (exactly one of ``path``, ``tiny``, ``init_from``) and their dtype."""

    model_config = ConfigDict(extra="forbid")

    path: Optional[str] = Field(None, description="local Hugging Face model directory (never downloaded)")
    tiny: Optional[TinyModelConfig] = Field(None, description="build a small random-init model from this spec")
    init_from: Optional[str] = Field(None, description="a unimas checkpoint dir (a group dir, or a run's "
                                     "checkpoints/step_N) or a Hugging Face model dir to start from")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weight dtype")

    @model_validator(mode="after")
    def _one_source(self) -> "TorchOptions":
        given = [key for key in ("path", "tiny", "init_from") if getattr(self, key) is not None]
        if len(given) != 1:
            found = f"got {' and '.join(given)}" if given else "got none"
            raise ValueError("give exactly one of 'path' (local Hugging Face dir), 'tiny' (built from a spec) "
                             f"or 'init_from' (a checkpoint to start from); {found}")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
