"""Checkpoints of a torch model group: what is written, and how it is read back in place.

A group directory holds ``model/`` (a Hugging Face dir: base weights and
tokenizer, loadable without unimas), ``adapters/<name>/`` (PEFT adapter
dirs), ``reference/`` (the KL reference when it is a separate copy), and the
optimiser, learning-rate schedule and sampling-RNG state. Loading copies
weights into the existing parameters rather than replacing them, so the
optimiser keeps pointing at the right tensors and a resumed run continues
bit-identically. Nothing is unpickled: tensors load with
``torch.load(weights_only=True)`` or safetensors, and any file that fails to
load (truncated, foreign, a pickle payload, other shapes) is a
:class:`UserError` naming it. The optimiser's rate, betas and weight decay
come from the config in force, not from the saved state, so a resume with a
changed ``optim.lr`` trains with the new one. ``rng.pt`` is checked against
:class:`RngState`, and a pickle-format weights file (``pytorch_model.bin``
and the like) found among the weights is refused, never skipped silently.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from safetensors.torch import save_file

from unimas.errors import UserError
from unimas.groups.torch.options import MODEL_DIR
from unimas.groups.torch.pretrained import pretrained_model
from unimas.safe_load import load_safetensors, load_tensors, reading

if TYPE_CHECKING:
    from unimas.groups.torch.group import TorchModelGroup

ADAPTER_DIR, REFERENCE_DIR = "adapters", "reference"
CRITIC_DIR = "critic"
"""The group's value model, optimiser and schedule (``unimas.groups.torch.critic``): resume-only."""
OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE = "optimizer.pt", "scheduler.pt", "rng.pt"
RESUME_ONLY_FILES = (OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE)
"""Needed to continue a run exactly, not to start a new one from the weights (``init_from``)."""
PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
"""Weight-file suffixes of pickle formats: a checkpoint's weights are safetensors, so one of these is planted."""


class RngState(BaseModel):
    """``rng.pt``: the group's sampling generator state and its update count."""

    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)
    generator: torch.Tensor
    weight_version: int = Field(0, ge=0, description="absent in states saved before versions were counted")

    @field_validator("generator")
    @classmethod
    def _generator_bytes(cls, value: torch.Tensor) -> torch.Tensor:
        if value.dtype != torch.uint8 or value.dim() != 1:
            raise ValueError(f"must be a 1-D uint8 tensor (a torch.Generator state), not {value.dtype} "
                             f"with shape {tuple(value.shape)}")
        return value


def refuse_pickled_weights(directory: Path) -> None:
    """A :class:`UserError` naming the first pickle-format file in a weights dir (``model/``, an adapter)."""
    for path in sorted(Path(directory).rglob("*")):
        if path.suffix in PICKLED_WEIGHTS and path.is_file():
            raise UserError("refused: a pickle-format weights file; unimas writes weights as safetensors and "
                            "never unpickles, so this file was put here by something else (delete it)",
                            where=str(path))


def check_weights(directory: Path) -> None:
    """Check a saved group's weights without loading them: no pickle-format file, every safetensors header readable.

    What a resume checks in a snapshot it may play later, so a bad snapshot
    makes its checkpoint unusable instead of stopping the run when it is played.
    """
    from safetensors import safe_open

    refuse_pickled_weights(directory)
    for path in sorted(Path(directory).rglob("*.safetensors")):
        if not path.is_file():  # a FIFO would block the header read for ever
            raise UserError("not a regular file (a pipe or a device is no weights file)", where=str(path))
        with reading(path), safe_open(path, framework="pt") as handle:
            handle.keys()


def clean_base_name(key: str) -> Optional[str]:
    """A PEFT-wrapped base-model key as the plain model names it; None for LoRA weights."""
    if "lora_" in key:
        return None
    return key.replace(".base_layer.", ".")


def group_dir(root: Path, name: str) -> tuple[Path, Path]:
    """(group checkpoint dir, HF model dir) for ``init_from``.

    Accepts a dir written by :func:`save_group`, a run checkpoint holding one
    such dir per group name, or a plain Hugging Face model dir.
    """
    for group in (root / name, root):
        if (group / MODEL_DIR / "config.json").exists():
            return group, group / MODEL_DIR
    if (root / "config.json").exists():
        return root, root
    raise FileNotFoundError(f"init_from {root}: no '{MODEL_DIR}/config.json' (a unimas checkpoint) or config.json")


def save_group(group: "TorchModelGroup", directory: Path) -> None:
    """Write everything :func:`load_group` needs to resume (see the module docstring)."""
    directory = Path(directory)
    base = group.base_model()
    state = {}
    for key, value in base.state_dict().items():
        clean = clean_base_name(key)
        if clean is not None:
            state[clean] = value
    base.save_pretrained(directory / MODEL_DIR, state_dict=state)
    group.tokenizer.save_pretrained(directory / MODEL_DIR)
    if group.adapters:
        from peft import get_peft_model_state_dict

        for adapter in group.adapters:
            target = directory / ADAPTER_DIR / adapter
            target.mkdir(parents=True, exist_ok=True)
            weights = get_peft_model_state_dict(group.model, adapter_name=adapter)
            weights = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
            save_file(weights, target / "adapter_model.safetensors")
            group.model.peft_config[adapter].save_pretrained(str(target))
    if group.has_reference_copy and not group.adapters:
        group.reference_model().save_pretrained(directory / REFERENCE_DIR)
    if group.optimizer is not None:
        torch.save(group.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        torch.save(group.scheduler.state_dict(), directory / SCHEDULER_FILE)
    torch.save({"generator": group.generator.get_state(), "weight_version": group.weight_version},
               directory / RNG_FILE)
    if group.critic is not None:
        group.critic.save(directory / CRITIC_DIR)


def load_group(group: "TorchModelGroup", directory: Path) -> None:
    """Restore weights, adapters, reference, optimiser, schedule and RNG in place."""
    directory = Path(directory)
    copy_weights(group.base_model(), directory / MODEL_DIR, clean_names=True, dtype=group.spec.options.torch_dtype)
    load_adapters(group, directory, missing_ok=False)
    if (directory / REFERENCE_DIR).exists():
        copy_weights(group.reference_model(), directory / REFERENCE_DIR, clean_names=False,
                     dtype=group.spec.options.torch_dtype)
    if (directory / OPTIMIZER_FILE).exists() and group.trainable:
        optimizer = group.optimizer_for_update()
        state = load_tensors(directory / OPTIMIZER_FILE, group.device)
        with reading(directory / OPTIMIZER_FILE):
            optimizer.load_state_dict(state)
        if (directory / SCHEDULER_FILE).exists():
            state = load_tensors(directory / SCHEDULER_FILE)
            with reading(directory / SCHEDULER_FILE):
                group.scheduler.load_state_dict(state)
        apply_optim_config(group)
    if (directory / RNG_FILE).exists():  # absent in a weights-only snapshot: the group keeps its own stream
        saved = load_tensors(directory / RNG_FILE)
        with reading(directory / RNG_FILE):
            state = RngState.model_validate(saved)
            group.generator.set_state(state.generator)
        group.weight_version = state.weight_version
    if group.critic is not None and (directory / RNG_FILE).exists():  # a resume, not a weights-only snapshot
        group.critic.load(directory / CRITIC_DIR)


def keep_weights_only(directory: Path) -> None:
    """Reduce a saved group to its weights (model and adapters): what ``init_from`` or a frozen snapshot reads."""
    directory = Path(directory)
    for name in RESUME_ONLY_FILES:
        (directory / name).unlink(missing_ok=True)
    shutil.rmtree(directory / REFERENCE_DIR, ignore_errors=True)
    shutil.rmtree(directory / CRITIC_DIR, ignore_errors=True)


def apply_optim_config(group: "TorchModelGroup") -> None:
    """Set rate, betas and weight decay from the config in force (a loaded state dict carries the saved ones),
    the rate at the schedule's current position: the same value an uninterrupted run has when unchanged."""
    optim, scheduler = group.config.optim, group.scheduler
    scheduler.base_lrs = [optim.lr] * len(group.optimizer.param_groups)
    for params, factor in zip(group.optimizer.param_groups, scheduler.lr_lambdas):
        params.update(initial_lr=optim.lr, lr=optim.lr * factor(scheduler.last_epoch),
                      betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    scheduler._last_lr = [params["lr"] for params in group.optimizer.param_groups]


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


def load_adapters(group: "TorchModelGroup", directory: Path, missing_ok: bool) -> None:
    """Load each of the group's adapters from ``directory/adapters/<name>``."""
    if not group.adapters:
        return
    from peft import set_peft_model_state_dict

    for adapter in group.adapters:
        path = directory / ADAPTER_DIR / adapter / "adapter_model.safetensors"
        refuse_pickled_weights(path.parent)
        if not path.exists():
            if missing_ok:
                continue
            raise FileNotFoundError(f"checkpoint {directory} has no adapter '{adapter}'")
        weights = load_safetensors(path, device=str(group.device))
        with reading(path):
            result = set_peft_model_state_dict(group.model, weights, adapter_name=adapter)
        if result.unexpected_keys:
            raise UserError(f"adapter '{adapter}' has unknown weights: {result.unexpected_keys[:3]}", where=str(path))
