"""Saved weights read into live models: copied in place, pickle formats refused.

Shared by the group checkpoint (:mod:`unimas.groups.torch.checkpoint`) and the
critic's value model (:mod:`unimas.groups.torch.critic`), neither of which
imports the other. Copying in place, rather than replacing parameters, keeps
an optimiser pointing at the right tensors, so a resumed run continues
bit-identically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from unimas.errors import UserError
from unimas.groups.hf.pretrained import pretrained_model
from unimas.groups.hf.weight_files import refuse_pickled_weights
from unimas.safe_load import reading

def clean_base_name(key: str) -> Optional[str]:
    """A PEFT-wrapped base-model key as the plain model names it; None for LoRA weights."""
    if "lora_" in key:
        return None
    return key.replace(".base_layer.", ".")


def copy_weights(target: torch.nn.Module, model_dir: Path, clean_names: bool, dtype: torch.dtype) -> None:
    """Copy a saved HF model's weights into ``target`` without replacing its parameters
    (the optimiser keeps pointing at them). Loading through ``from_pretrained`` applies
    whatever key conversions transformers does on save."""
    weights = model_dir / "model.safetensors"
    refuse_pickled_weights(model_dir)
    with reading(weights if weights.exists() else model_dir):
        saved = pretrained_model(model_dir, dtype)  # checked config, safetensors only, no code, every weight there
    source = saved.state_dict()
    with torch.no_grad():
        for key, value in target.state_dict(keep_vars=True).items():
            name = clean_base_name(key) if clean_names else key
            if name is None:
                continue
            if name not in source:
                raise UserError(f"lacks weight '{name}' (a different model?)", where=str(model_dir))
            if source[name].shape != value.shape:
                raise UserError(f"weight '{name}' has shape {tuple(source[name].shape)} here but "
                                f"{tuple(value.shape)} in the configured model (model size changed?)",
                                where=str(weights))
            value.copy_(source[name])
