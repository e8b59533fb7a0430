"""Checkpoints of a torch model group's parts: what is written, and how it is read back in place.

:func:`save` and :func:`load` take the parts (policy, learner, the group's
generator) and import no group; the sampler saves its own random stream
beside them (:meth:`unimas.groups.torch.sampler.Sampler.save_rng`).

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
:class:`~unimas.groups.torch.state.RngState`, and a pickle-format weights file (``pytorch_model.bin``
and the like) found among the weights is refused, never skipped silently.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
from safetensors.torch import save_file

from unimas.errors import UserError
from unimas.groups.hf.model_source import MODEL_DIR
from unimas.groups.torch.state import RngState
from unimas.groups.torch.weights import clean_base_name, copy_weights, refuse_pickled_weights
from unimas.safe_load import load_safetensors, load_tensors, reading

if TYPE_CHECKING:
    from unimas.groups.torch.learner import TorchLearner
    from unimas.groups.torch.policy import TorchPolicy

ADAPTER_DIR, REFERENCE_DIR = "adapters", "reference"
CRITIC_DIR = "critic"
"""The group's value model, optimiser and schedule (``unimas.groups.torch.critic``): resume-only."""
OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE = "optimizer.pt", "scheduler.pt", "rng.pt"
RESUME_ONLY_FILES = (OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE)
"""Needed to continue a run exactly, not to start a new one from the weights (``init_from``)."""


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


def save_weights(directory: Path, policy: "TorchPolicy") -> None:
    """``model/`` (base weights and tokenizer, a plain Hugging Face dir) and ``adapters/<name>/``: what
    ``init_from`` or a frozen snapshot reads."""
    base = policy.base_model()
    state = {}
    for key, value in base.state_dict().items():
        clean = clean_base_name(key)
        if clean is not None:
            state[clean] = value
    base.save_pretrained(directory / MODEL_DIR, state_dict=state)
    policy.tokenizer.save_pretrained(directory / MODEL_DIR)
    if policy.adapters:
        from peft import get_peft_model_state_dict

        for adapter in policy.adapters:
            target = directory / ADAPTER_DIR / adapter
            target.mkdir(parents=True, exist_ok=True)
            weights = get_peft_model_state_dict(policy.model, adapter_name=adapter)
            weights = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
            save_file(weights, target / "adapter_model.safetensors")
            policy.model.peft_config[adapter].save_pretrained(str(target))


def save(directory: Path, policy: "TorchPolicy", learner: "TorchLearner", generator: torch.Generator,
         version: int) -> None:
    """Write everything :func:`load` needs to resume (see the module docstring)."""
    directory = Path(directory)
    save_weights(directory, policy)
    if policy.has_reference_copy and not policy.adapters:
        policy.reference_model().save_pretrained(directory / REFERENCE_DIR)
    if learner.optimizer is not None:
        torch.save(learner.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        torch.save(learner.scheduler.state_dict(), directory / SCHEDULER_FILE)
    torch.save({"generator": generator.get_state(), "weight_version": version}, directory / RNG_FILE)
    if learner.critic is not None:
        learner.critic.save(directory / CRITIC_DIR)


def load(directory: Path, policy: "TorchPolicy", learner: "TorchLearner", generator: torch.Generator,
         dtype: torch.dtype) -> Optional[int]:
    """Restore weights, adapters, reference, optimiser, schedule and RNG in place; the saved weight version,
    or None for a weights-only snapshot (no ``rng.pt``: the group keeps its own stream and count)."""
    directory = Path(directory)
    copy_weights(policy.base_model(), directory / MODEL_DIR, clean_names=True, dtype=dtype)
    load_adapters(policy, directory, missing_ok=False)
    if (directory / REFERENCE_DIR).exists():
        copy_weights(policy.reference_model(), directory / REFERENCE_DIR, clean_names=False, dtype=dtype)
    if (directory / OPTIMIZER_FILE).exists() and policy.trainable:
        optimizer = learner.optimizer_for_update()
        state = load_tensors(directory / OPTIMIZER_FILE, policy.device)
        with reading(directory / OPTIMIZER_FILE):
            optimizer.load_state_dict(state)
        if (directory / SCHEDULER_FILE).exists():
            state = load_tensors(directory / SCHEDULER_FILE)
            with reading(directory / SCHEDULER_FILE):
                learner.scheduler.load_state_dict(state)
        learner.apply_optim_config()
    if not (directory / RNG_FILE).exists():
        return None
    saved = load_tensors(directory / RNG_FILE)
    with reading(directory / RNG_FILE):
        state = RngState.model_validate(saved)
        generator.set_state(state.generator)
    if learner.critic is not None:  # a resume, not a weights-only snapshot
        learner.critic.load(directory / CRITIC_DIR)
    return state.weight_version


def keep_weights_only(directory: Path) -> None:
    """Reduce a saved group to its weights (model and adapters): what ``init_from`` or a frozen snapshot reads."""
    directory = Path(directory)
    for name in RESUME_ONLY_FILES:
        (directory / name).unlink(missing_ok=True)
    shutil.rmtree(directory / REFERENCE_DIR, ignore_errors=True)
    shutil.rmtree(directory / CRITIC_DIR, ignore_errors=True)


def load_adapters(policy: "TorchPolicy", directory: Path, missing_ok: bool) -> None:
    """Load each of the policy's adapters from ``directory/adapters/<name>``."""
    if not policy.adapters:
        return
    from peft import set_peft_model_state_dict

    for adapter in policy.adapters:
        path = directory / ADAPTER_DIR / adapter / "adapter_model.safetensors"
        refuse_pickled_weights(path.parent)
        if not path.exists():
            if missing_ok:
                continue
            raise FileNotFoundError(f"checkpoint {directory} has no adapter '{adapter}'")
        weights = load_safetensors(path, device=str(policy.device))
        with reading(path):
            result = set_peft_model_state_dict(policy.model, weights, adapter_name=adapter)
        if result.unexpected_keys:
            raise UserError(f"adapter '{adapter}' has unknown weights: {result.unexpected_keys[:3]}", where=str(path))
