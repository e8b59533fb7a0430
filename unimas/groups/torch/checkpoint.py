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

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from unimas.errors import UserError
from unimas.groups.hf.model_source import MODEL_DIR
from unimas.groups.torch.state import RngState
from unimas.groups.hf.weight_files import refuse_pickled_weights
from unimas.groups.torch.weights import clean_base_name, copy_weights
from unimas.safe_load import load_safetensors, load_tensors, reading

if TYPE_CHECKING:
    from unimas.groups.torch.learner import TorchLearner
    from unimas.groups.torch.policy import TorchPolicy

ADAPTER_DIR, REFERENCE_DIR = "adapters", "reference"
CRITIC_DIR = "critic"
"""The group's value model, optimiser and schedule (``unimas.groups.torch.critic``): resume-only."""
OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE = "optimizer.pt", "scheduler.pt", "rng.pt"


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


def load_weights(directory: Path, policy: "TorchPolicy", dtype: torch.dtype) -> None:
    """Copy what :func:`save_weights` wrote (by this backend or another) into the policy's base and adapters."""
    directory = Path(directory)
    copy_weights(policy.base_model(), directory / MODEL_DIR, clean_names=True, dtype=dtype)
    load_adapters(policy, directory, missing_ok=False)


def load(directory: Path, policy: "TorchPolicy", learner: "TorchLearner", generator: torch.Generator,
         dtype: torch.dtype) -> int:
    """Restore weights, adapters, reference, optimiser, schedule and RNG in place; the saved weight version.

    A weights-only directory (no ``rng.pt``) is refused by name: it is played (:func:`load_weights`) or
    started from (``options.init_from``), never resumed, which would continue with another random stream.
    """
    directory = Path(directory)
    if not (directory / RNG_FILE).is_file():
        raise UserError(f"has no {RNG_FILE}: it holds weights only (a snapshot or a warm start), which a run "
                        "starts from with options.init_from rather than resumes", where=str(directory))
    load_weights(directory, policy, dtype)
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
    saved = load_tensors(directory / RNG_FILE)
    with reading(directory / RNG_FILE):
        state = RngState.model_validate(saved)
        generator.set_state(state.generator)
    if learner.critic is not None:
        learner.critic.load(directory / CRITIC_DIR)
    return state.weight_version


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
