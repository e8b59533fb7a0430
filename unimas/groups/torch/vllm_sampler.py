"""The torch group's fourth sampling engine: vLLM in a process of its own (``options.sampler: vllm``).

The group's policy trains in torch as with every sampler; its responses are
sampled by a :class:`~unimas.groups.vllm_engine.VllmEngine`. After each
update :meth:`VllmSampler.publish` hands the engine the new weights through a
safetensors file (the engine reloads them in place and resets its prefix
cache); every batch comes back with the weight version the engine sampled it
with, which drives staleness and importance weights as the replica's does.

What it honours, as the torch sampler does: token-id prompts (multi-turn
continuations and forced openings stay token-exact: the group renders the
ids, the engine never re-tokenises), ``max_new_tokens``, EOS (kept as the
row's last, trained token; ``require_eos`` reads it), the policy's banned
ids, temperature / top-k / top-p (log-probs under a filter are marked
inexact and recomputed, as in the torch sampler), stop strings (the row is
cut after the id that completes one; the engine samples on to EOS or the
token limit, and those ids are dropped), per-token log-probs and streamed
answers (each id reaches the row's listener as the engine samples it). LoRA
adapters are refused when the group is built: the engine serves the base
weights only.

The log-prob check. vLLM's kernels are not the trainer's, so their
log-probs of the same tokens differ by float rounding (measured: ≤ 2e-6 in
float32 on the tiny chat model). On the first batch with exact log-probs,
the sampler recomputes them with the trainer's own model; the largest
difference is reported with the next update's metrics
(``vllm_logprob_diff``), and a difference past
``options.vllm.logprob_tolerance`` stops the run with
:class:`LogprobMismatch` — a wrong weight name, dtype or bias would
otherwise train silently off-policy.

Randomness: each row's seed is drawn from the group's generator, which the
group's checkpoint saves (``rng.pt``); nothing of its own to save.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import ClassVar, Mapping, Optional, Sequence

import torch

from unimas.config.schema import GenerationConfig
from unimas.errors import UserError
from unimas.groups.base import GroupSpec
from unimas.groups.hf import sampling
from unimas.groups.streaming import TextProgress
from unimas.groups.torch.sampled import SampledRows, SamplingPolicy
from unimas.groups.vllm_engine import (EngineError, EngineSettings, SampleSettings, VllmEngine, VllmOptions,
                                       default_kv_cache_bytes, kv_bytes_per_token)

CHECKED_ROWS = 16
"""Rows of the first batch whose log-probs the trainer's forward recomputes (the check's cost is bounded)."""
SEED_LIMIT = 2 ** 62


class LogprobMismatch(EngineError):
    """vLLM's log-probs and the trainer's differ past the tolerance on the first checked batch."""


class VllmSampler:
    """Samples in a vLLM engine process; weights reach it through a safetensors file after each update."""

    kind: ClassVar[str] = "vllm"

    def __init__(self, spec: GroupSpec, policy: SamplingPolicy, generator: torch.Generator,
                 update_lock: threading.RLock, version: int = 0):
        if spec.adapters:
            raise UserError("sampler 'vllm' serves the base weights only; LoRA adapters "
                            f"({', '.join(spec.adapters)}) need another sampler", where=f"models.{spec.name}.lora")
        options = getattr(spec.options, "vllm", None) or VllmOptions()
        dtype = str(getattr(spec.options, "dtype", "float32"))
        model = policy.model
        config = model.config
        length = int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions"))
        per_token = kv_bytes_per_token(config, torch.empty((), dtype=getattr(torch, dtype)).element_size())
        kv_bytes = ((options.kv_cache_mb << 20) if options.kv_cache_mb
                    else default_kv_cache_bytes(per_token, length, options.max_num_seqs))
        self.policy = policy
        self.generator = generator
        self.update_lock = update_lock
        self.lock = threading.RLock()
        self.version = version
        self.tolerance = options.tolerance(dtype)
        self.banned = sorted(torch.nonzero(policy.logit_bias < 0).flatten().tolist())
        self.checked: Optional[float] = None
        """The first batch's largest log-prob difference, once checked."""
        self._unreported: dict[str, float] = {}
        self.engine = VllmEngine(spec.name, model, EngineSettings(
            max_model_len=length, seed=spec.seed, dtype=dtype, max_num_seqs=options.max_num_seqs,
            kv_cache_bytes=kv_bytes, threads=torch.get_num_threads()), version)

    def sample(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, adapter: Optional[str],
               stops: sampling.StopStrings, listeners: Mapping[int, TextProgress]) -> SampledRows:
        seeds = torch.randint(0, SEED_LIMIT, (len(prompts),), generator=self.generator,
                              device=self.generator.device).tolist()
        settings = SampleSettings(max_tokens=gen.max_new_tokens, temperature=gen.temperature, top_k=gen.top_k,
                                  top_p=gen.top_p, greedy=greedy, stop_token_ids=list(self.policy.eos_ids),
                                  banned=self.banned)
        for listener in listeners.values():
            listener.start()
        tokens, logprobs, version = self.engine.sample(prompts, settings, seeds,
                                                       {row: listener.add for row, listener in listeners.items()})
        if stops.active:
            tokens, logprobs = _cut_at_stops(tokens, logprobs, stops)
        if self.checked is None and sampling.logprobs_are_exact(gen, greedy):
            self._check(prompts, tokens, logprobs, 1.0 if greedy else gen.temperature)
        return SampledRows(tokens, logprobs, version)

    def publish(self, policy: SamplingPolicy, version: int) -> dict[str, float]:
        """Write the weights to the engine's file and have it reload them: ``weight_sync_wait_s`` (waiting for a
        batch it samples), ``weight_sync_s`` (write, reload, cache reset), and the first batch's check once."""
        asked = time.perf_counter()
        with self.lock:
            waited = time.perf_counter() - asked
            seconds = self.engine.publish(policy.model, version)
            self.version = version
            metrics, self._unreported = {**self._unreported, "weight_sync_wait_s": waited,
                                         "weight_sync_s": seconds}, {}
            return metrics

    def save_rng(self, directory: Path) -> None:
        """Nothing of its own: the rows' seeds come from the group's generator, which ``rng.pt`` holds."""

    def load_rng(self, directory: Path) -> None:
        """Nothing of its own (see :meth:`save_rng`)."""

    def close(self) -> None:
        self.engine.close()

    def _check(self, prompts: Sequence[list[int]], tokens: list[list[int]], logprobs: list[list[float]],
               temperature: float) -> None:
        """Recompute the first rows' log-probs with the trainer's model; record the largest difference and
        raise :class:`LogprobMismatch` past the tolerance."""
        policy, worst = self.policy, 0.0
        with self.update_lock, torch.inference_mode():
            for prompt, row, reported in list(zip(prompts, tokens, logprobs))[:CHECKED_ROWS]:
                if not row:
                    continue
                ids = torch.tensor([list(prompt) + row], device=policy.logit_bias.device)
                logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1: -1].float() + policy.logit_bias
                mine = (logits / temperature).log_softmax(-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
                worst = max(worst, (mine.cpu() - torch.tensor(reported)).abs().max().item())
        self.checked = worst
        self._unreported["vllm_logprob_diff"] = worst
        if worst > self.tolerance:
            raise LogprobMismatch(
                f"model group '{self.engine.name}': vLLM's log-probs differ from the trainer's forward of the same "
                f"tokens by up to {worst:.3g} on the first batch, past the tolerance {self.tolerance:g} "
                "(models.<group>.options.vllm.logprob_tolerance); the engine is not sampling the trained policy "
                "(weights, dtype or logit bias differ), and training on its samples would be off-policy")


def _cut_at_stops(tokens: list[list[int]], logprobs: list[list[float]], stops: sampling.StopStrings
                  ) -> tuple[list[list[int]], list[list[float]]]:
    """Each row up to and including the id that completes one of its stop strings (the engine sampled on)."""
    cut_tokens, cut_logprobs = [], []
    for row, (ids, lps) in enumerate(zip(tokens, logprobs)):
        end = next((i + 1 for i in range(len(ids)) if stops.hit(row, ids[: i + 1])), len(ids))
        cut_tokens.append(ids[:end])
        cut_logprobs.append(lps[:end])
    return cut_tokens, cut_logprobs
