"""Where a torch group's sampling runs: the :class:`Sampler` protocol and its engines.

A group samples its responses through one sampler, chosen by
``models.<g>.options.sampler`` (:meth:`TorchOptions.sampler_kind` keeps the
older spellings: ``rollout_process: true`` is ``replica``; without either,
``algorithm.max_staleness > 0`` gives ``copy``, else ``inplace``):

=========  ==========================================================  ==============================
engine     weights it samples with                                     sampling and updates
=========  ==========================================================  ==============================
inplace    the trained weights themselves                              take turns (one lock)
copy       a copy in this process, refreshed by :meth:`publish`        overlap (the GIL allowing)
replica    a copy in a child process (:mod:`.rollout_replica`)         overlap on separate cores
vllm       a vLLM engine in a child process (:mod:`.vllm_sampler`),    overlap on separate cores
           given each update through a safetensors file
=========  ==========================================================  ==============================

Adding an engine is one class (here, or in a module of its own as vLLM's is)
and one name in :data:`unimas.groups.torch.options.SamplerKind` and
:data:`ENGINES`; the group, its learner and its checkpoints do not change.
"""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Mapping, Optional, Protocol, Sequence

import torch

from unimas.config.schema import GenerationConfig
from unimas.groups.base import GroupSpec
from unimas.groups.hf import sampling
from unimas.groups.streaming import TextProgress
from unimas.groups.torch.rollout_replica import RolloutReplica
from unimas.groups.torch.sampled import SampledRows, SamplingPolicy
from unimas.groups.torch.vllm_sampler import VllmSampler

if TYPE_CHECKING:
    from unimas.groups.torch.options import SamplerKind


class Sampler(Protocol):
    """One engine that samples a torch group's responses.

    The group renders prompts and decodes results; an engine only turns
    prompt ids into response ids. Its contract, which a fourth engine (vLLM
    in its own process, weights published through a safetensors file, say)
    implements as the three here do:

    * :meth:`sample` — a batch of prompts sharing one adapter and one
      ``GenerationConfig``: the sampled ids, the log-prob of each id under
      ``softmax(logits / T)`` with the policy's logit bias added and before
      any top-k / top-p filter (the distribution the update recomputes), and
      the version of the weights that sampled them. Each row stops at an EOS
      id (kept as its last id), at ``gen.max_new_tokens``, or at the id that
      completes one of ``stops``'s strings for that row (kept). Rows in
      ``listeners`` get each id as it is sampled (``start()`` then
      ``add(id)``), or all at once when the batch is done.
    * :meth:`publish` — make the policy's current weights (all of them,
      adapters included) the ones later batches sample with, as ``version``;
      never while a batch samples. Returns timing metrics (``weight_sync_s``,
      ``weight_sync_wait_s``) or nothing.
    * :meth:`save_rng` / :meth:`load_rng` — the engine's own random stream, in
      a group checkpoint directory, so a resumed run samples the same tokens.
      An engine drawing from the group's generator (in place, copy) has
      nothing of its own: ``rng.pt`` holds that stream. ``load_rng`` is only
      called on a resume (the checkpoint has ``rng.pt``), after the
      group's generator has been restored.
    * :meth:`close` — stop any process or server; idempotent.
    * :attr:`lock` — held by the group around each generate call (render,
      sample, decode); :meth:`publish` and the RNG methods take it
      themselves. The in-place engine's lock is the group's update lock, so
      generate and update take turns; the others have their own.
    * :attr:`version` — the weight version it samples with now (results
      that sample nothing, refused prompts, carry it too).
    """

    kind: ClassVar[str]
    lock: threading.RLock
    version: int

    def sample(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, adapter: Optional[str],
               stops: sampling.StopStrings, listeners: Mapping[int, TextProgress]) -> SampledRows: ...

    def publish(self, policy: SamplingPolicy, version: int) -> dict[str, float]: ...

    def save_rng(self, directory: Path) -> None: ...

    def load_rng(self, directory: Path) -> None: ...

    def close(self) -> None: ...


def _sample_here(policy: SamplingPolicy, model: torch.nn.Module, generator: torch.Generator,
                 prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, adapter: Optional[str],
                 stops: sampling.StopStrings, listeners: Mapping[int, TextProgress]
                 ) -> tuple[list[list[int]], list[list[float]]]:
    """Sample in this process with ``model`` (the policy's or a copy of it) through ``adapter``."""
    with torch.inference_mode(), policy.route(model, adapter):
        return sampling.sample_tokens(model, prompts, gen, greedy, eos_ids=policy.eos_ids, pad_id=policy.pad_id,
                                      logit_bias=policy.logit_bias, generator=generator, stops=stops,
                                      listeners=listeners)


class InPlaceSampler:
    """Samples with the trained weights themselves, under the group's update lock (generate and update take
    turns): the synchronous loop's engine, which holds no second copy of the weights."""

    kind: ClassVar[str] = "inplace"

    def __init__(self, spec: GroupSpec, policy: SamplingPolicy, generator: torch.Generator,
                 update_lock: threading.RLock, version: int = 0):
        self.policy = policy
        self.generator = generator
        self.lock = update_lock
        self.version = version

    def sample(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, adapter: Optional[str],
               stops: sampling.StopStrings, listeners: Mapping[int, TextProgress]) -> SampledRows:
        model = self.policy.model
        if model.training:  # an update leaves the model in eval mode; the call walks every module (~80 µs, tiny model)
            model.eval()
        tokens, logprobs = _sample_here(self.policy, model, self.generator, prompts, gen, greedy, adapter, stops,
                                        listeners)
        return SampledRows(tokens, logprobs, self.version)

    def publish(self, policy: SamplingPolicy, version: int) -> dict[str, float]:
        """The weights are live already: only the version moves."""
        with self.lock:
            self.version = version
        return {}

    def save_rng(self, directory: Path) -> None:
        """Nothing of its own: it draws from the group's generator, which ``rng.pt`` holds."""

    def load_rng(self, directory: Path) -> None:
        """Nothing of its own (see :meth:`save_rng`)."""

    def close(self) -> None:
        """Nothing to stop."""


class CopySampler(InPlaceSampler):
    """Samples with a copy of the weights in this process, under its own lock, so that generation for the
    next steps runs while the trained weights update (the asynchronous pipeline); :meth:`publish` copies the
    trained weights over between two batches."""

    kind: ClassVar[str] = "copy"

    def __init__(self, spec: GroupSpec, policy: SamplingPolicy, generator: torch.Generator,
                 update_lock: threading.RLock, version: int = 0):
        super().__init__(spec, policy, generator, threading.RLock(), version)
        self.model = copy.deepcopy(policy.model).eval().requires_grad_(False)

    def sample(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, adapter: Optional[str],
               stops: sampling.StopStrings, listeners: Mapping[int, TextProgress]) -> SampledRows:
        tokens, logprobs = _sample_here(self.policy, self.model, self.generator, prompts, gen, greedy, adapter,
                                        stops, listeners)
        return SampledRows(tokens, logprobs, self.version)

    def publish(self, policy: SamplingPolicy, version: int) -> dict[str, float]:
        with self.lock, torch.no_grad():
            for target, source in zip(self.model.parameters(), policy.model.parameters()):
                target.copy_(source)
            self.version = version
        return {}


class ReplicaSampler:
    """Samples in a child process holding a copy of the weights in shared memory
    (:class:`~unimas.groups.torch.rollout_replica.RolloutReplica`): sampling and updates overlap on separate
    cores. Its random stream is the child's, saved as ``rollout_rng.pt``."""

    kind: ClassVar[str] = "replica"

    def __init__(self, spec: GroupSpec, policy: SamplingPolicy, generator: torch.Generator,
                 update_lock: threading.RLock, version: int = 0):
        self.generator = generator
        self.lock = threading.RLock()
        self.version = version
        self.replica = RolloutReplica(spec, policy.model, version)

    def sample(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, adapter: Optional[str],
               stops: sampling.StopStrings, listeners: Mapping[int, TextProgress]) -> SampledRows:
        tokens, logprobs, version, streamed = self.replica.sample(prompts, gen, greedy, adapter, stops.stops,
                                                                  sorted(listeners))
        for row, listener in listeners.items():  # a streamed row's text arrives once its batch is done
            listener.start()
            for token in streamed.get(row, []):
                listener.add(token)
        return SampledRows(tokens, logprobs, version)

    def publish(self, policy: SamplingPolicy, version: int) -> dict[str, float]:
        """Write the weights into the shared file: ``weight_sync_wait_s`` (waiting for a batch the child
        samples) and ``weight_sync_s`` (the copy)."""
        asked = time.perf_counter()
        with self.lock:
            waited = time.perf_counter() - asked
            self.version = version
            return {"weight_sync_wait_s": waited, "weight_sync_s": self.replica.publish(policy.model, version)}

    def save_rng(self, directory: Path) -> None:
        with self.lock:
            self.replica.save_generator(directory)

    def load_rng(self, directory: Path) -> None:
        """The child's stream from the checkpoint; the group's own when it was written without a replica."""
        with self.lock:
            self.replica.load_generator(directory, fallback=self.generator.get_state())

    def close(self) -> None:
        self.replica.close()


ENGINES: dict[str, type[Sampler]] = {engine.kind: engine for engine in (InPlaceSampler, CopySampler, ReplicaSampler,
                                                                    VllmSampler)}
"""Each ``options.sampler`` value's engine; every one is built as ``engine(spec, policy, generator, update_lock,
version)`` — ``generator``: the group's stream (also the learner's shuffles), ``update_lock``: held while the
group updates."""


def build_sampler(kind: "SamplerKind", spec: GroupSpec, policy: SamplingPolicy, generator: torch.Generator,
                  update_lock: threading.RLock, version: int = 0) -> Sampler:
    """The ``kind`` engine for a group (:data:`ENGINES`)."""
    return ENGINES[kind](spec, policy, generator, update_lock, version)

