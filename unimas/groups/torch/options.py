"""The torch backend's settings under ``models.<group>.options``, validated by the backend itself.

They live here, not in ``unimas.config.schema``, because only this backend reads
them. Where the weights come from (``path``, ``tiny``, ``init_from``, ``dtype``)
is the kit's :class:`~unimas.groups.hf.model_source.ModelSource`, which the verl
backend reads too. Unknown keys are errors, as everywhere in the config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, model_validator

from unimas.groups.hf.model_source import ModelSource
from unimas.groups.vllm_engine import VllmOptions, serving_problem

SamplerKind = Literal["inplace", "copy", "replica", "vllm"]
"""The sampling engines (:data:`unimas.groups.torch.sampler.ENGINES` maps each to its class)."""


class TorchOptions(ModelSource):
    """Where the weights come from (exactly one of ``path``, ``tiny``, ``init_from``), their dtype, and where sampling
    runs."""

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
