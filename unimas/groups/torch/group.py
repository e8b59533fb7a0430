"""An in-process PyTorch model group: the reference backend, composed of three parts.

* the policy (:mod:`.policy`): the network (+ LoRA adapters), tokenizer
  facts, prompt rendering, log-prob forwards, the KL reference;
* the learner (:mod:`.learner`): optimiser, schedule, the PPO update, the
  supervised step, and the critic when the group has one;
* the sampler (:mod:`.sampler`): where sampling runs (in place, a copy, a
  child-process replica; ``options.sampler``).

:class:`TorchModelGroup` builds them, holds the locks and the weight version,
and implements :class:`~unimas.groups.base.ModelGroup` by delegating;
checkpoints are :mod:`.checkpoint`'s. It is small enough to read and exact
enough that the log-probs it reports at sampling time equal the ones it
recomputes for the update (the PPO ratio starts at exactly 1 when on-policy).

Weight versions. ``weight_version`` counts this group's updates; every
result says which version sampled it. After each update the group publishes
its weights and the new version to the sampler; results carry the version
the sampler reports it sampled with.

Randomness. Sampling in this process and mini-batch shuffling draw from one
``torch.Generator`` owned by the group, handed to the learner and the
sampler and saved with the group, so a run resumed from a checkpoint
continues bit-identically. (A replica samples from its own, saved beside it;
LoRA dropout, if configured, draws from the global torch RNG, which the
trainer seeds.)
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from pathlib import Path
from typing import ClassVar, Optional

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from unimas.config.schema import GenerationConfig
from unimas.groups.base import Critique, GenRequest, GenResult, GroupSpec, ModelGroup, TrainTurn
from unimas.groups.hf import sampling
from unimas.groups.hf import source as source_of
from unimas.groups.results import bucket_key, is_refused, refused_result
from unimas.groups.torch import checkpoint
from unimas.groups.torch.critic import Critic
from unimas.groups.torch.learner import SupervisedExample, TorchLearner
from unimas.groups.torch.options import TorchOptions
from unimas.groups.torch.policy import TorchPolicy, device_for
from unimas.groups.torch.sampler import build_sampler

log = logging.getLogger(__name__)


class TorchModelGroup(ModelGroup):
    """One causal LM (plus optional LoRA adapters) in this process: a policy, its learner and its sampler."""

    options: ClassVar[type[TorchOptions]] = TorchOptions
    supports_critic: ClassVar[bool] = True
    """``models.<group>.critic`` works here (``unimas validate`` asks; docs/critic.md)."""

    def __init__(self, spec: GroupSpec, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 device: torch.device):
        self.spec = spec
        self.name = spec.name
        self.trainable = spec.config.trainable
        critic = (Critic(spec, model, len(tokenizer), device)  # copied before any LoRA wrapping
                  if spec.config.critic is not None and spec.config.trainable else None)
        self.policy = TorchPolicy(spec, model, tokenizer, device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(spec.seed)
        self.learner = TorchLearner(spec, self.policy, self.generator, critic)
        self._lock = threading.RLock()
        """Held while the group updates, scores, saves or loads (and, with the in-place sampler, samples)."""
        self.weight_version = 0
        kind = spec.options.sampler_kind(spec.algorithm.max_staleness)
        self.sampler = build_sampler(kind, spec, self.policy, self.generator, self._lock, self.weight_version)

    @classmethod
    def build(cls, spec: GroupSpec) -> "TorchModelGroup":
        """Build from a local HF dir (``path``), a tiny spec (``tiny``) or a checkpoint (``init_from``)."""
        options = spec.options if isinstance(spec.options, TorchOptions) else TorchOptions.model_validate(spec.options)
        spec.options = options
        model, tokenizer, source = source_of.load_model(options, spec.name, spec.seed)
        group = cls(spec, model, tokenizer, device_for(spec))
        if source is not None:
            policy, critic = group.policy, group.learner.critic
            checkpoint.load_adapters(policy, source, missing_ok=True)
            if not policy.adapters and (source / checkpoint.ADAPTER_DIR).exists():
                log.warning("model group '%s': ignoring the LoRA adapters in %s (no 'lora' section)", spec.name, source)
            if critic is not None and Critic.saved_in(source / checkpoint.CRITIC_DIR):
                critic.load_weights(source / checkpoint.CRITIC_DIR)  # a warm critic; fresh optimiser
            elif critic is not None:
                log.info("model group '%s': %s has no critic; the critic starts afresh", spec.name, source)
        return group

    @property
    def critic(self) -> Optional[Critic]:
        """The learner's critic (``models.<group>.critic``), or None."""
        return self.learner.critic

    # ------------------------------------------------------------ generation

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Sample every request; requests sharing (adapter, settings) run as one batch."""
        buckets: dict[tuple, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            buckets[(req.adapter, *bucket_key(req))].append(i)
        results: list[Optional[GenResult]] = [None] * len(requests)
        with self.sampler.lock, torch.inference_mode():
            for (adapter, _, greedy, _), rows in buckets.items():
                first = requests[rows[0]]
                outs = self._generate_batch([requests[i] for i in rows], first.generation, greedy, adapter)
                for i, out in zip(rows, outs):
                    results[i] = out
        return results

    def _generate_batch(self, requests: list[GenRequest], gen: GenerationConfig, greedy: bool,
                        adapter: Optional[str]) -> list[GenResult]:
        """Sample the requests whose prompts fit; a prompt too long and not allowed to be cut gets no response,
        nor does one that could not be rendered (its result carries the ``error``)."""
        policy, tokenizer = self.policy, self.policy.tokenizer
        prompts = policy.render_prompts(requests, gen.max_new_tokens)
        results: list[Optional[GenResult]] = [None] * len(requests)
        for i, prompt in enumerate(prompts):
            if is_refused(prompt, requests[i]):
                results[i] = refused_result(prompt, self.sampler.version)
        run = [i for i, result in enumerate(results) if result is None]
        if run:
            stops = sampling.StopStrings(tokenizer, [requests[i].stop for i in run])
            listeners = sampling.listeners(tokenizer, [requests[i] for i in run])
            rows = self.sampler.sample([prompts[i].ids for i in run], gen, greedy, adapter, stops, listeners)
            sampled = sampling.to_results(tokenizer, [prompts[i] for i in run], rows.tokens, rows.logprobs,
                                          policy.eos_ids, exact=sampling.logprobs_are_exact(gen, greedy),
                                          weight_version=rows.version, stops=stops,
                                          controls=("stop", "response_prefix"))
            for i, result in zip(run, sampled):
                if requests[i].token_texts:
                    result.token_texts = [tokenizer.decode([t]) for t in result.response_ids]
                results[i] = result
        return results  # type: ignore[return-value]

    # -------------------------------------------------------------- training

    def score(self, turns: list[TrainTurn]) -> list[float]:
        with self._lock:
            return self.learner.score(turns)

    def update(self, turns: list[TrainTurn]) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches with ``spec.algorithm``; then one learning-rate schedule step.

        ``lr`` in the metrics is the rate this update used. With a critic, the turns' advantages are first
        computed per token by GAE from its values, and the critic trains; during ``algorithm.critic_warmup``
        only the critic does (the policy's update is empty). The new weights go to the sampler as the next
        version.
        """
        with self._lock:
            metrics = self.learner.update(turns, self.weight_version)
            self.weight_version += 1
            metrics.update(self.sampler.publish(self.policy, self.weight_version))
            metrics["weight_version"] = float(self.weight_version)
            return metrics

    def critique(self, turns: list[TrainTurn]) -> Critique:
        """As the centralized critic group (``algorithm.central_critic``): values of every role's turns read
        after the episode so far, GAE over each (episode, role), one critic update (docs/critic.md)."""
        with self._lock:
            return self.learner.critique(turns)

    def train_supervised(self, examples: list[SupervisedExample]) -> float:
        """One AdamW step on the token-mean cross-entropy of responses (+EOS) given prompts.

        A torch-only warm start (``examples/arith_warm_start.py``); it does not
        advance the learning-rate schedule, which counts RL updates.
        """
        if not examples:
            raise ValueError("train_supervised needs at least one example")
        with self._lock:
            loss = self.learner.supervised_step(examples)
            self.sampler.publish(self.policy, self.weight_version)
            return loss

    def num_parameters(self) -> dict[str, int]:
        """Total and trainable parameter counts (``benchmarks/sharing.py`` reports them)."""
        return self.policy.num_parameters()

    # ----------------------------------------------------------- checkpoints

    def save(self, directory: Path) -> None:
        """``model/``, ``adapters/<name>/``, ``reference/``, optimiser, schedule and RNG state (the sampler's
        own stream beside them)."""
        with self._lock:
            checkpoint.save(Path(directory), self.policy, self.learner, self.generator, self.weight_version)
            self.sampler.save_rng(Path(directory))

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote, in place (resume bit-identically)."""
        directory = Path(directory)
        with self._lock:
            self.weight_version = checkpoint.load(directory, self.policy, self.learner, self.generator,
                                                  self.spec.options.torch_dtype)
            self.sampler.publish(self.policy, self.weight_version)
            self.sampler.load_rng(directory)

    def save_weights(self, directory: Path) -> None:
        """``model/`` and ``adapters/<name>/`` only (:meth:`ModelGroup.save_weights`)."""
        with self._lock:
            checkpoint.save_weights(Path(directory), self.policy)

    def load_weights(self, directory: Path) -> None:
        """Copy a saved policy's weights in place and hand them to the sampler; the version stays, as a
        frozen group's weights count as one version (its turns are never trained)."""
        with self._lock:
            checkpoint.load_weights(Path(directory), self.policy, self.spec.options.torch_dtype)
            self.sampler.publish(self.policy, self.weight_version)

    def close(self) -> None:
        """Stop the sampler's process or server, if it has one."""
        self.sampler.close()
