"""LoRA settings checked against a model, the same way for every backend that wraps one with peft."""

from __future__ import annotations

from typing import TYPE_CHECKING

from unimas.config.schema import LoraConfig
from unimas.errors import UserError

if TYPE_CHECKING:
    import torch


def check_target_modules(model: "torch.nn.Module", lora: LoraConfig, group: str) -> None:
    """Every LoRA target names a module of the model (peft matches a name or a dotted suffix)."""
    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in lora.target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        leaves = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                         if name and next(module.children(), None) is None})
        raise UserError(f"{', '.join(repr(t) for t in missing)} is not a module of model group '{group}'; modules "
                        f"it has: {', '.join(leaves[:20])}", where=f"models.{group}.lora.target_modules")
