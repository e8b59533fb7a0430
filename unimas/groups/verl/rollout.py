"""unimas's own rollout for verl where vLLM is absent: an in-process Hugging Face model fed by weight syncs.

verl 0.9.1 ships no usable CPU rollout (its ``HFRollout`` and ``NaiveRollout``
are abstract leftovers), so this class implements verl's ``BaseRollout``
(``resume``, ``update_weights``, ``release``) and is registered in verl's
``_ROLLOUT_REGISTRY`` as ``unimas_hf``; the group looks it up through verl's
``get_rollout_class``, as verl's workers look up vLLM's adapter. It keeps
its own copy of the weights, which only :meth:`update_weights` changes —
with the per-tensor HF-named parameters the engine exports
(``get_per_tensor_param``), the contract vLLM's ``load_weights`` also relies
on — and it records the version each sync brings.

Sampling reuses the torch backend's KV-cache sampler; all randomness comes
from the rollout's own ``torch.Generator`` (saved with checkpoints). Ids past
the tokenizer are banned in sampling and in scoring, as vLLM's servers and
the trainer ban them (:mod:`.vocabulary`).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Iterable, Optional, Sequence, TypeVar

import torch
from transformers import AutoModelForCausalLM

from unimas.config.schema import GenerationConfig
from unimas.groups.hf import sampling
from unimas.groups.hf.layout import layout_batch
from unimas.groups.verl import lora, vocabulary

REGISTRY_KEY = ("unimas_hf", "async")
T = TypeVar("T")


def run_sync(coroutine: Awaitable[T]) -> T:
    """Finish a coroutine from sync code, also when this thread already runs an event loop (the controller's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="unimas-verl-sync")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def register() -> None:
    """Make ``get_rollout_class("unimas_hf")`` find :class:`HFRollout` (idempotent)."""
    from verl.workers.rollout import base

    base._ROLLOUT_REGISTRY[REGISTRY_KEY] = f"{__name__}.HFRollout"


def _base_class() -> type:
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


class HFRollout(_base_class()):
    """Generation from a Hugging Face copy of the trained model; weights arrive only through syncs."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, **kwargs: Any):
        super().__init__(config=config, model_config=model_config, device_mesh=device_mesh)
        dtype = torch.bfloat16 if self.config.dtype == "bfloat16" else torch.float32
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(self.model_config.local_path, dtype=dtype,
                                                     attn_implementation="sdpa", local_files_only=True,
                                                     use_safetensors=True, trust_remote_code=False)
        self.model = lora.wrap_rollout_model(model, self.model_config).to(self.device).eval().requires_grad_(False)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(self.config.seed))
        self.weight_version: Optional[int] = None
        """The trainer step whose weights this rollout holds; None before the first sync."""
        self.logit_bias = vocabulary.past_tokenizer_bias(self.model.get_output_embeddings().weight.shape[0],
                                                         vocabulary.tokenizer_size(self.model_config), self.device)
        """Added to every logit row: bans the ids past the tokenizer."""

    async def resume(self, tags: list[str]) -> None:
        """Weights and cache never leave this process's memory: nothing to bring back."""

    async def release(self) -> None:
        """Nothing to free: the in-process copy is needed for the next generation."""

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], wire_format: str = "named_tensors",
                             global_steps: Optional[int] = None, **kwargs: Any) -> None:
        """Copy the exported HF-named tensors into the model; every parameter must arrive."""
        if wire_format != "named_tensors":
            raise ValueError(f"the unimas_hf rollout takes full named tensors, not {wire_format!r}")
        params = dict(self.model.named_parameters())
        missing = set(params)
        with torch.no_grad():
            for name, tensor in weights:
                if name not in params:
                    raise KeyError(f"weight sync sent '{name}', which the rollout model does not have")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
                missing.discard(name)
        if missing:
            raise KeyError(f"weight sync did not send {sorted(missing)[:5]}")
        self.weight_version = global_steps

    @torch.inference_mode()
    def generate(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, eos_ids: Sequence[int],
                 pad_id: int) -> tuple[list[list[int]], list[list[float]]]:
        """Sample responses (token rows, log-prob rows under softmax((logits + bias) / T)) for prompt-only rows."""
        return sampling.sample_tokens(self.model, prompts, gen, greedy, eos_ids=eos_ids, pad_id=pad_id,
                                      logit_bias=self.logit_bias,
                                      generator=self.generator)

    @torch.inference_mode()
    def logprobs(self, prompts: Sequence[list[int]], responses: Sequence[list[int]],
                 temperatures: Sequence[float]) -> list[list[float]]:
        """Teacher-forced log-probs of ``responses`` as this rollout would sample them (the sync check)."""
        batch = layout_batch(list(prompts), list(responses), 0, self.device)
        out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=batch.position_ids, use_cache=False)
        width = batch.response.shape[1]
        temps = torch.tensor(list(temperatures), device=self.device)[:, None, None]
        logits = (out.logits[:, -width - 1:-1].float() + self.logit_bias) / temps
        values = logits.log_softmax(-1).gather(-1, batch.response[..., None]).squeeze(-1)
        return [row[: len(r)] for row, r in zip(values.tolist(), responses)]
