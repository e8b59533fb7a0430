"""A torch group's learner: the optimiser, its schedule, and the PPO/GRPO update as methods.

The objective itself is not written here: every mini-batch calls
:func:`unimas.algorithms.losses.compose_loss`, the one loss composition all
backends share. :class:`TorchLearner` only produces its inputs (current, old
and reference log-probs from the policy, entropies, per-token advantages),
runs the optimiser, and owns what an update remembers between its passes:
the batch cache (:class:`~unimas.groups.torch.batches.TurnBatches`) and each
adapter's parameters. A group with a critic hands it here: the critic's
values and GAE come before the policy's epochs.

One update, in one direction: :meth:`TorchLearner.update` -> critic ->
old log-probs -> per mini-batch :meth:`_step`: ``policy.reference_logprobs``,
``policy.logprobs``, ``compose_loss``, backward, clip, optimiser step.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from unimas.algorithms import losses
from unimas.config.schema import AlgorithmConfig
from unimas.groups.base import UPDATE_METRICS, Critique, GroupSpec, TrainTurn
from unimas.groups.hf.layout import pad_rows
from unimas.groups.prompts import check_known
from unimas.groups.torch import optimizer as optim_lib
from unimas.groups.torch.batches import TurnBatches, minibatches
from unimas.groups.torch.critic import Critic
from unimas.groups.torch.policy import TorchPolicy

log = logging.getLogger(__name__)


@dataclass
class SupervisedExample:
    """One prompt -> response pair for ``TorchModelGroup.train_supervised`` (EOS is appended)."""

    prompt: str
    response: str
    adapter: Optional[str] = None


ROLLOUT_TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}
"""Largest |recomputed - sampled| log-prob on the first step before a warning, per weight dtype: float32
noise is ~1e-6; in half precision the cached decoding and the full forward round differently (~1e-2)."""

ADAPTER_METRICS = ("policy_loss", "entropy", "kl", "clip_frac", "ppo_kl", "grad_norm", "tokens")
"""Reported per LoRA adapter as ``adapter/<name>/<metric>`` (the group's own keys stay): one adapter per role
learns on its own turns only, so a group-wide mean can hide the adapter that is not learning."""


class TorchLearner:
    """Trains one policy: AdamW and its learning-rate schedule (made on first use), PPO epochs over shuffled
    mini-batches, the supervised warm-start step, and the group's critic when it has one.

    ``generator`` is the group's random stream (saved in ``rng.pt``): mini-batch orders draw from it, as
    sampling in this process does, in the order the group calls them.
    """

    def __init__(self, spec: GroupSpec, policy: TorchPolicy, generator: torch.Generator,
                 critic: Optional[Critic] = None):
        self.spec = spec
        self.policy = policy
        self.generator = generator
        self.critic = critic
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.scheduler: Optional[torch.optim.lr_scheduler.LambdaLR] = None
        self.batches = TurnBatches(policy.pad_id, policy.device)
        """The batch cache: a mini-batch's reference, policy and critic passes lay its turns out once."""
        self.adapter_params: dict[str, list[torch.nn.Parameter]] = {}
        """Each LoRA adapter's trainable parameters, found on its first gradient norm."""

    @property
    def name(self) -> str:
        return self.spec.name

    def optimizer_for_update(self) -> torch.optim.Optimizer:
        """The AdamW optimiser (and its learning-rate schedule), made on first use."""
        if not self.policy.trainable:
            raise RuntimeError(f"model group '{self.name}' is frozen (trainable: false) and cannot be updated")
        if not self.policy.train_params:
            raise RuntimeError(
                f"model group '{self.name}' has no trainable parameters (lora without adapters and train_base off)")
        if self.optimizer is None:
            optim = self.spec.config.optim
            self.optimizer = optim_lib.build_optimizer(self.policy.train_params, optim)
            self.scheduler = optim_lib.build_scheduler(self.optimizer, optim, self.spec.total_updates)
        return self.optimizer

    def apply_optim_config(self) -> None:
        """After a checkpoint's optimiser and schedule states are loaded: rate, betas and weight decay from the
        config in force (a resume with a changed ``optim.lr`` trains with the new one)."""
        optim_lib.apply_config(self.optimizer, self.scheduler, self.spec.config.optim)

    # ---------------------------------------------------------------- update

    def update(self, turns: list[TrainTurn], version: int) -> dict[str, float]:
        """One update at weight version ``version``: the critic's step first when there is one, then PPO
        epochs; one learning-rate schedule step. ``lr`` in the metrics is the rate this update used."""
        optimizer = self.optimizer_for_update()
        lr = optim_lib.current_lr(optimizer)
        critic_metrics: dict[str, float] = {}
        if self.critic is not None:  # values, GAE over each role's turns, critic epochs (docs/critic.md)
            warming_up = self.critic.warming_up
            turns, critic_metrics = (self.critic.prepare(turns, self.batches, self.generator) if turns
                                     else ([], self.critic.idle()))
            turns = [] if warming_up else turns
        metrics = self._ppo_update(turns, version, optimizer) if turns else dict.fromkeys(UPDATE_METRICS, 0.0)
        metrics.update(critic_metrics)
        metrics["lr"] = lr
        optim_lib.advance(self.scheduler)
        return metrics

    def critique(self, turns: list[TrainTurn]) -> Critique:
        """The centralized critic's step (docs/critic.md)."""
        if self.critic is None:
            raise RuntimeError(f"model group '{self.name}' has no critic (models.{self.name}.critic)")
        return self.critic.critique(self.policy, turns, self.batches, self.generator)

    def score(self, turns: Sequence[TrainTurn]) -> list[float]:
        """Each turn's summed response log-prob under the current weights."""
        return self.policy.score(turns, self.batches)

    def _old_logprobs(self, turns: Sequence[TrainTurn], version: int, chunk: int,
                      defer_stale: bool = False) -> list[Optional[list[float]]]:
        """The "old policy" log-probs of each turn: as reported at sampling when exact, else recomputed now.

        Recomputation (for turns sampled with top-k / top-p, whose log-probs do
        not match their tokens, or sampled by older weights) happens once, before
        the first epoch, with the current weights in eval mode, ``chunk`` turns
        per forward. For a stale turn this is the *proximal* policy of decoupled
        PPO: the clip acts around the current weights while the truncated
        importance ratio corrects for the older behaviour policy (see
        :meth:`_step`). ``defer_stale`` (one optimiser step per update): a stale
        turn's row is None, because that step's own forward, taken before it
        changes the weights, is the proximal policy: no extra pass.
        """
        rows: list[Optional[list[float]]] = [
            list(t.rollout_logprobs) if t.rollout_logprobs_exact and len(t.rollout_logprobs) == len(t.response_ids)
            and not _is_stale(t, version) else None
            for t in turns
        ]
        redo = [i for i, row in enumerate(rows) if row is None and not (defer_stale and _is_stale(turns[i], version))]
        for begin in range(0, len(redo), chunk):
            part = [turns[i] for i in redo[begin: begin + chunk]]
            with torch.inference_mode():
                logp, _, _ = self.policy.logprobs(part, [t.adapter for t in part], self.batches)
            for i, turn, values in zip(redo[begin: begin + chunk], part, logp.tolist()):
                rows[i] = values[: len(turn.response_ids)]
        return rows

    def _ppo_update(self, turns: list[TrainTurn], version: int, optimizer: torch.optim.Optimizer
                    ) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches; metrics are means over optimiser steps."""
        algorithm, policy = self.spec.algorithm, self.policy
        if self.spec.policy_loss is None:
            raise RuntimeError(f"model group '{self.name}': no policy loss was resolved for '{algorithm.loss}'")
        for t in turns:
            if not t.response_ids:
                raise ValueError("every turn needs a non-empty response")
        start = time.perf_counter()
        size = algorithm.mini_batch_size or len(turns)
        old = self._old_logprobs(turns, version, size,
                                 defer_stale=size >= len(turns) and algorithm.ppo_epochs == 1)
        behaviour = [list(t.rollout_logprobs) if _is_stale(t, version) and len(t.rollout_logprobs) == len(
            t.response_ids) else None for t in turns]
        sums: dict[str, float] = defaultdict(float)
        reports: dict[str, int] = defaultdict(int)  # steps that reported each key: an adapter may miss a mini-batch
        steps = 0
        mismatch = 0.0
        policy.model.train()
        try:
            for rows in minibatches(len(turns), size, algorithm.ppo_epochs, self.generator):
                batch = [turns[i] for i in rows]
                step = self._step(batch, [old[i] for i in rows], algorithm, optimizer, check_rollout=steps == 0,
                                  behaviour=[behaviour[i] for i in rows])
                mismatch = max(mismatch, step.pop("rollout_logprob_diff", 0.0))
                for key, value in step.items():
                    sums[key] += value
                    reports[key] += 1
                steps += 1
        finally:
            policy.model.eval()
        metrics = {key: value / reports[key] for key, value in sums.items()}
        metrics["rollout_logprob_diff"] = mismatch
        tolerance = ROLLOUT_TOLERANCE[self.spec.options.dtype]
        if mismatch > tolerance:
            log.warning("model group '%s': log-probs recomputed for training differ from the sampled ones by up to "
                        "%.2e (tolerance %.0e): the trained ids or the sampling distribution differ from what was "
                        "sampled", self.name, mismatch, tolerance)
        metrics["tokens"] = float(sum(len(t.response_ids) for t in turns))
        for turn in turns:
            if turn.adapter is not None and policy.adapters:
                key = f"adapter/{turn.adapter}/tokens"
                metrics[key] = metrics.get(key, 0.0) + len(turn.response_ids)
        metrics["stale_turns"] = float(sum(b is not None for b in behaviour))
        metrics["update_time_s"] = time.perf_counter() - start
        return metrics

    def _step(self, turns: list[TrainTurn], old: list[Optional[list[float]]], algorithm: AlgorithmConfig,
              optimizer: torch.optim.Optimizer, check_rollout: bool = False,
              behaviour: Optional[list[Optional[list[float]]]] = None) -> dict[str, float]:
        """One optimiser step on one mini-batch.

        ``check_rollout`` (the first step of an update, weights still those that
        sampled): report how far the recomputed log-probs of turns with exact
        rollout log-probs are from the sampled ones — a token mismatch between
        what was sampled and what is trained shows up here.

        ``behaviour``: per turn, the log-probs recorded when an older weight
        version sampled it (None: sampled by the current weights). Such a turn's
        per-token advantage is multiplied by min(proximal / behaviour probability,
        ``algorithm.importance_cap``), the truncated importance ratio; an ``old``
        row of None takes this forward's own log-probs as the proximal policy.
        """
        policy, device = self.policy, self.policy.device
        # The reference pass first: its activations are freed before the policy forward allocates the ones
        # backward keeps (measured: the reference pass after it cost ~3 ms more per step, CPU time).
        reference = policy.reference_logprobs(turns, self.batches) if algorithm.kl_coef > 0 else None
        logp, entropy, mask = policy.logprobs(turns, [t.adapter for t in turns], self.batches, entropy=True)
        roles = [t.role for t in turns]
        weight, coefs = losses.token_coefficients(self.spec.role_objectives, roles, algorithm, logp)
        if algorithm.entropy_coef <= 0 and coefs is None:
            entropy = entropy.detach()
        width = mask.shape[1]
        old_logp = pad_rows([row if row is not None else [] for row in old], width, device)
        deferred = [i for i, row in enumerate(old) if row is None]
        if deferred:
            old_logp[deferred] = logp.detach()[deferred]
        diff = {}
        if check_rollout:
            exact = torch.tensor([t.rollout_logprobs_exact for t in turns], device=device)[:, None] * mask
            diff["rollout_logprob_diff"] = (float(((logp.detach() - old_logp).abs() * exact).max()) if exact.any()
                                            else 0.0)
        if turns[0].token_advantages is not None:  # per-token advantages (a critic's GAE), else one per turn
            advantages = pad_rows([t.token_advantages for t in turns], width, device) * mask
        else:
            advantages = torch.tensor([float(t.advantage) for t in turns], device=device)[:, None] * mask
        stale = [i for i, row in enumerate(behaviour or []) if row is not None]
        diff["importance_weight"] = 1.0
        if stale:
            recorded = pad_rows([behaviour[i] for i in stale], width, device)
            ratio = (old_logp[stale] - recorded).exp().clamp(max=algorithm.importance_cap)
            advantages[stale] = advantages[stale] * ratio
            diff["importance_weight"] = float((ratio * mask[stale]).sum() / mask[stale].sum())
        loss, metrics = losses.compose_loss(self.spec.policy_loss, algorithm, log_prob=logp,
                                                old_log_prob=old_logp, advantages=advantages, response_mask=mask,
                                                entropy=entropy, ref_log_prob=reference, token_weight=weight,
                                                entropy_coef=coefs)
        metrics.update(losses.role_entropy(entropy, mask, roles))
        rows = self._adapter_rows(turns)
        metrics.update(self._adapter_loss_metrics(rows, algorithm, log_prob=logp, old_log_prob=old_logp,
                                                  advantages=advantages, response_mask=mask, entropy=entropy,
                                                  ref_log_prob=reference, token_weight=weight, entropy_coef=coefs))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics.update(self._adapter_grad_norms(rows))
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.train_params, self.spec.config.optim.grad_clip)
        if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
            # A NaN/inf step would poison the weights and every later sample: drop it and say so.
            optimizer.zero_grad(set_to_none=True)
            clean = {key: value if math.isfinite(value) and not key.endswith("grad_norm") else 0.0
                     for key, value in metrics.items()}
            return {**clean, **diff, "grad_norm": 0.0, "nonfinite_skipped": 1.0}
        optimizer.step()
        return {**metrics, **diff, "grad_norm": float(grad_norm), "nonfinite_skipped": 0.0}

    # ---------------------------------------------------- per-adapter metrics

    def _adapter_rows(self, turns: Sequence[TrainTurn]) -> dict[str, list[int]]:
        """The mini-batch rows of each LoRA adapter (none for a group without adapters)."""
        rows: dict[str, list[int]] = defaultdict(list)
        if self.policy.adapters:
            for i, turn in enumerate(turns):
                if turn.adapter is not None:
                    rows[turn.adapter].append(i)
        return rows

    def _adapter_loss_metrics(self, rows: dict[str, list[int]], algorithm: AlgorithmConfig,
                              **tensors: Optional[torch.Tensor]) -> dict[str, float]:
        """``compose_loss``'s metrics over each adapter's rows alone, without gradients (the loss trained is the
        mini-batch's, unchanged)."""
        metrics: dict[str, float] = {}
        with torch.no_grad():
            for adapter, index in rows.items():
                part = {name: None if t is None else t.detach()[index] for name, t in tensors.items()}
                _, own = losses.compose_loss(self.spec.policy_loss, algorithm, **part)
                metrics.update({f"adapter/{adapter}/{key}": value for key, value in own.items()})
        return metrics

    def _adapter_grad_norms(self, rows: dict[str, list[int]]) -> dict[str, float]:
        """Each adapter's gradient norm before clipping (its LoRA weights are its own, so the norms are apart)."""
        metrics: dict[str, float] = {}
        for adapter in rows:
            if adapter not in self.adapter_params:
                self.adapter_params[adapter] = self.policy.adapter_params(adapter)
            grads = [p.grad for p in self.adapter_params[adapter] if p.grad is not None]
            norm = (torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) if grads
                    else 0.0)
            metrics[f"adapter/{adapter}/grad_norm"] = float(norm)
        return metrics

    # ------------------------------------------------------------ supervised

    def supervised_turns(self, examples: Sequence[SupervisedExample]) -> list[TrainTurn]:
        """Examples as turns: the response (+EOS) tokenised, the prompt fitted to leave room for it."""
        policy, turns = self.policy, []
        for ex in examples:
            response = policy.tokenizer(ex.response, add_special_tokens=False)["input_ids"]
            check_known(policy.tokenizer, ex.response, response)
            response = response + [policy.eos_ids[0]]
            prompt = policy.fit_prompts([ex.prompt], len(response))[0]
            turns.append(TrainTurn(prompt, response, rollout_logprobs=[], advantage=0.0, adapter=ex.adapter))
        return turns

    def supervised_step(self, examples: Sequence[SupervisedExample]) -> float:
        """One AdamW step on the token-mean cross-entropy of the examples' responses given their prompts."""
        optimizer = self.optimizer_for_update()
        turns, policy = self.supervised_turns(examples), self.policy
        policy.model.train()
        try:
            logp, _, mask = policy.logprobs(turns, [t.adapter for t in turns], self.batches)
            loss = -(logp * mask).sum() / mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.train_params, self.spec.config.optim.grad_clip)
            optimizer.step()
        finally:
            policy.model.eval()
        return float(loss.detach())


def _is_stale(turn: TrainTurn, version: int) -> bool:
    """Sampled by older weights than ``version``, the group's current ones (the asynchronous pipeline)."""
    return turn.weight_version is not None and turn.weight_version < version
