"""Log-probs for training, and the PPO/GRPO update loop.

The objective itself is not written here: every mini-batch calls
:func:`unimas.algorithms.functions.compose_loss`, the one loss composition all backends
share. This module only produces its inputs (current, old and reference
log-probs, entropies, per-token advantages) and runs the optimiser.

The loops reach the two forwards through the group's ``response_logprobs``
and ``reference_logprobs`` methods, so a profiler can wrap them on one
instance (``benchmarks/common.py`` does) without touching this module.
"""

from __future__ import annotations

import logging
import math
import operator
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import torch

from unimas.algorithms import functions as algorithms
from unimas.config.schema import AlgorithmConfig
from unimas.groups.base import TrainTurn
from unimas.groups.torch.chars import check_known
from unimas.groups.torch.layout import PaddedBatch, layout_batch, pad_rows
from unimas.groups.torch.shared_prompts import (SplitBatch, UnsharableCache, forward_split, split_batch,
                                                 split_forward)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from unimas.groups.torch.group import TorchModelGroup

@dataclass
class SupervisedExample:
    """One prompt -> response pair for ``TorchModelGroup.train_supervised`` (EOS is appended)."""

    prompt: str
    response: str
    adapter: Optional[str] = None


ROLLOUT_TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}
"""Largest |recomputed - sampled| log-prob on the first step before a warning, per weight dtype: float32
noise is ~1e-6; in half precision the cached decoding and the full forward round differently (~1e-2)."""

UPDATE_METRICS = ("policy_loss", "entropy", "kl", "clip_frac", "ppo_kl", "grad_norm", "nonfinite_skipped",
                  "rollout_logprob_diff", "lr", "tokens", "update_time_s", "stale_turns", "importance_weight")

ADAPTER_METRICS = ("policy_loss", "entropy", "kl", "clip_frac", "ppo_kl", "grad_norm", "tokens")
"""Reported per LoRA adapter as ``adapter/<name>/<metric>`` (the group's own keys stay): one adapter per role
learns on its own turns only, so a group-wide mean can hide the adapter that is not learning."""


def compute_logprobs(
    group: "TorchModelGroup",
    model: torch.nn.Module,
    turns: Sequence[TrainTurn],
    adapters: Sequence[Optional[str]],
    entropy: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """(log-probs, entropies, mask) of the response tokens, (turns, R), rows in ``turns`` order.

    Turns of different adapters go through separate forwards (one per
    adapter); the results are stitched back into one tensor so that the loss
    is aggregated over the whole mini-batch at once. Logits get the group's
    logit bias and each turn's sampling temperature, as in sampling.
    """
    width = max(len(t.response_ids) for t in turns)
    by_adapter: dict[Optional[str], list[int]] = defaultdict(list)
    for i, adapter in enumerate(adapters):
        by_adapter[adapter].append(i)
    parts_lp, parts_ent, parts_mask, order = [], [], [], []
    for adapter, rows in by_adapter.items():
        sub = [turns[i] for i in rows]
        temperatures = [t.temperature or 1.0 for t in sub]
        with group.route(model, adapter):
            logits, response, response_mask = _response_logits(group, model, sub)
        scaled = logits.float() + group.logit_bias
        if any(t != 1.0 for t in temperatures):  # x / 1 is x: no division (and no autograd node) at T = 1
            scaled = scaled / torch.tensor(temperatures, device=group.device)[:, None, None]
        logp_all = scaled.log_softmax(-1)
        parts_lp.append(_right_pad(logp_all.gather(-1, response[..., None]).squeeze(-1), width))
        parts_mask.append(_right_pad(response_mask, width))
        if entropy:
            parts_ent.append(_right_pad(-(logp_all.exp() * logp_all).sum(-1), width))
        order.extend(rows)
    if len(by_adapter) == 1:  # one forward (no adapters, or one for every turn): rows in order, nothing padded
        return parts_lp[0], parts_ent[0] if entropy else None, parts_mask[0]
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    inverse = inverse.to(group.device)
    ent = torch.cat(parts_ent)[inverse] if entropy else None
    return torch.cat(parts_lp)[inverse], ent, torch.cat(parts_mask)[inverse]


def _right_pad(values: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, width): ``values`` with zero columns on the right; no copy when they are that wide already."""
    missing = width - values.shape[1]
    return torch.nn.functional.pad(values, (0, missing)) if missing else values


def _response_logits(group: "TorchModelGroup", model: torch.nn.Module, turns: list[TrainTurn]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the logits that predict each response token, (rows, R, V); the response ids; their mask).

    When rows share prompts enough (:func:`split_turns`), each distinct prompt goes through the model once
    (:mod:`unimas.groups.torch.shared_prompts`); otherwise one ``[prompt | response]`` row per turn.
    """
    batch = turn_batch(group, turns)
    if isinstance(batch, SplitBatch):
        try:
            first, rest = forward_split(model, batch)
        except UnsharableCache:  # a model whose cache rows cannot be copied: one full row per turn
            batch = full_rows(group, turns)
        else:  # the prompts' last logits predict each response's first token
            logits = torch.cat([first.logits[batch.rows], rest.logits[:, :-1]], dim=1)
            return logits, batch.response, batch.response_mask
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                use_cache=False, logits_to_keep=batch.response.shape[1] + 1)
    return out.logits[:, :-1], batch.response, batch.response_mask


def split_turns(group: "TorchModelGroup", turns: Sequence[TrainTurn]) -> Optional[SplitBatch]:
    """The turns as a :class:`SplitBatch` when :func:`split_forward` says sharing their prompts pays, else None."""
    if not all(t.response_ids for t in turns):
        return None
    plan = split_forward([t.prompt_ids for t in turns])
    if plan is None:
        return None
    return split_batch(*plan, [t.response_ids for t in turns], group.pad_id, group.device)


def full_rows(group: "TorchModelGroup", turns: Sequence[TrainTurn]) -> PaddedBatch:
    """The turns as one ``[prompt | response]`` row each."""
    return layout_batch([t.prompt_ids for t in turns], [t.response_ids for t in turns], group.pad_id, group.device)


def turn_batch(group: "TorchModelGroup", turns: Sequence[TrainTurn]) -> PaddedBatch | SplitBatch:
    """The batch of exactly these turn objects — split (:func:`split_turns`) when sharing their prompts pays,
    else :func:`full_rows` — remembered once: a mini-batch's policy pass reuses the batch its reference pass
    built, and neither decides the split again. Only batches built outside inference mode are remembered (an
    inference tensor cannot enter a later pass that records gradients)."""
    remembered = getattr(group, "_remembered_batch", None)
    if remembered is not None and len(remembered[0]) == len(turns) and all(map(operator.is_, remembered[0], turns)):
        return remembered[1]
    batch = split_turns(group, turns) or full_rows(group, turns)
    if not torch.is_inference_mode_enabled():
        group._remembered_batch = (list(turns), batch)
    return batch


def compute_reference_logprobs(group: "TorchModelGroup", turns: Sequence[TrainTurn]) -> torch.Tensor:
    """Log-probs under the frozen reference: the base with adapters off, or a lazy copy.

    Computed under ``inference_mode`` (no autograd bookkeeping at all) and
    cloned out of it, because the KL term later combines it with tensors
    that do record gradients.
    """
    if group.adapters and not group.config.lora.train_base:
        model, adapters = group.model, [None] * len(turns)
    else:
        model, adapters = group.reference_model(), [t.adapter for t in turns]
    turn_batch(group, turns)  # built outside inference mode, so that the policy pass reuses it
    with torch.inference_mode():
        reference = group.response_logprobs(model, turns, adapters)[0]
    return reference.clone()


def score_turns(group: "TorchModelGroup", turns: Sequence[TrainTurn]) -> list[float]:
    """Each turn's summed response log-prob under the current policy weights, without gradients."""
    if not turns:
        return []
    with torch.inference_mode():
        logp, _, mask = group.response_logprobs(group.model, turns, [t.adapter for t in turns])
    return (logp * mask).sum(dim=1).tolist()


def is_stale(group: "TorchModelGroup", turn: TrainTurn) -> bool:
    """Sampled by older weights than the group's current ones (the asynchronous pipeline)."""
    return turn.weight_version is not None and turn.weight_version < group.weight_version


def old_logprobs(group: "TorchModelGroup", turns: Sequence[TrainTurn], chunk: int,
                 defer_stale: bool = False) -> list[Optional[list[float]]]:
    """The "old policy" log-probs of each turn: as reported at sampling when exact, else recomputed now.

    Recomputation (for turns sampled with top-k / top-p, whose log-probs do
    not match their tokens, or sampled by older weights) happens once, before
    the first epoch, with the current weights in eval mode, ``chunk`` turns
    per forward. For a stale turn this is the *proximal* policy of decoupled
    PPO: the clip acts around the current weights while the truncated
    importance ratio corrects for the older behaviour policy (see
    :func:`ppo_step`). ``defer_stale`` (one optimiser step per update): a stale
    turn's row is None, because that step's own forward, taken before it
    changes the weights, is the proximal policy: no extra pass.
    """
    rows: list[Optional[list[float]]] = [
        list(t.rollout_logprobs) if t.rollout_logprobs_exact and len(t.rollout_logprobs) == len(t.response_ids)
        and not is_stale(group, t) else None
        for t in turns
    ]
    redo = [i for i, row in enumerate(rows) if row is None and not (defer_stale and is_stale(group, turns[i]))]
    for begin in range(0, len(redo), chunk):
        part = [turns[i] for i in redo[begin: begin + chunk]]
        with torch.inference_mode():
            logp, _, _ = group.response_logprobs(group.model, part, [t.adapter for t in part])
        for i, turn, values in zip(redo[begin: begin + chunk], part, logp.tolist()):
            rows[i] = values[: len(turn.response_ids)]
    return rows


def minibatches(group: "TorchModelGroup", count: int, size: int, epochs: int) -> Iterator[list[int]]:
    """Row indices of each mini-batch, epoch after epoch: in order when one batch holds all rows, else shuffled by
    the group's generator (saved with checkpoints, so a resumed run draws the same orders)."""
    for _ in range(epochs):
        order = list(range(count))
        if size < count:
            order = torch.randperm(count, generator=group.generator, device=group.device).tolist()
        for begin in range(0, count, size):
            yield order[begin: begin + size]


def ppo_update(group: "TorchModelGroup", turns: list[TrainTurn], optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """PPO epochs over shuffled mini-batches; metrics are means over optimiser steps."""
    algorithm = group.spec.algorithm
    if group.spec.policy_loss is None:
        raise RuntimeError(f"model group '{group.name}': no policy loss was resolved for '{algorithm.loss}'")
    for t in turns:
        if not t.response_ids:
            raise ValueError("every turn needs a non-empty response")
    start = time.perf_counter()
    size = algorithm.mini_batch_size or len(turns)
    old = old_logprobs(group, turns, size, defer_stale=size >= len(turns) and algorithm.ppo_epochs == 1)
    behaviour = [list(t.rollout_logprobs) if is_stale(group, t) and len(t.rollout_logprobs) == len(t.response_ids)
                 else None for t in turns]
    sums: dict[str, float] = defaultdict(float)
    reports: dict[str, int] = defaultdict(int)  # steps that reported each key: an adapter may miss a mini-batch
    steps = 0
    mismatch = 0.0
    group.model.train()
    try:
        for rows in minibatches(group, len(turns), size, algorithm.ppo_epochs):
            batch = [turns[i] for i in rows]
            step = ppo_step(group, batch, [old[i] for i in rows], algorithm, optimizer, check_rollout=steps == 0,
                            behaviour=[behaviour[i] for i in rows])
            mismatch = max(mismatch, step.pop("rollout_logprob_diff", 0.0))
            for key, value in step.items():
                sums[key] += value
                reports[key] += 1
            steps += 1
    finally:
        group.model.eval()
    metrics = {key: value / reports[key] for key, value in sums.items()}
    metrics["rollout_logprob_diff"] = mismatch
    tolerance = ROLLOUT_TOLERANCE[group.spec.options.dtype]
    if mismatch > tolerance:
        log.warning("model group '%s': log-probs recomputed for training differ from the sampled ones by up to %.2e "
                    "(tolerance %.0e): the trained ids or the sampling distribution differ from what was sampled",
                    group.name, mismatch, tolerance)
    metrics["tokens"] = float(sum(len(t.response_ids) for t in turns))
    for turn in turns:
        if turn.adapter is not None and group.adapters:
            key = f"adapter/{turn.adapter}/tokens"
            metrics[key] = metrics.get(key, 0.0) + len(turn.response_ids)
    metrics["stale_turns"] = float(sum(b is not None for b in behaviour))
    metrics["update_time_s"] = time.perf_counter() - start
    return metrics


def ppo_step(
    group: "TorchModelGroup",
    turns: list[TrainTurn],
    old: list[Optional[list[float]]],
    algorithm: AlgorithmConfig,
    optimizer: torch.optim.Optimizer,
    check_rollout: bool = False,
    behaviour: Optional[list[Optional[list[float]]]] = None,
) -> dict[str, float]:
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
    # The reference pass first: its activations are freed before the policy forward allocates the ones
    # backward keeps (measured: the reference pass after it cost ~3 ms more per step, CPU time).
    reference = group.reference_logprobs(turns) if algorithm.kl_coef > 0 else None
    logp, entropy, mask = group.response_logprobs(group.model, turns, [t.adapter for t in turns], entropy=True)
    roles = [t.role for t in turns]
    weight, coefs = algorithms.token_coefficients(group.spec.role_objectives, roles, algorithm, logp)
    if algorithm.entropy_coef <= 0 and coefs is None:
        entropy = entropy.detach()
    width = mask.shape[1]
    old_logp = pad_rows([row if row is not None else [] for row in old], width, group.device)
    deferred = [i for i, row in enumerate(old) if row is None]
    if deferred:
        old_logp[deferred] = logp.detach()[deferred]
    diff = {}
    if check_rollout:
        exact = torch.tensor([t.rollout_logprobs_exact for t in turns], device=group.device)[:, None] * mask
        diff["rollout_logprob_diff"] = float(((logp.detach() - old_logp).abs() * exact).max()) if exact.any() else 0.0
    if turns[0].token_advantages is not None:  # per-token advantages (a critic's GAE), else one per turn
        advantages = pad_rows([t.token_advantages for t in turns], width, group.device) * mask
    else:
        advantages = torch.tensor([float(t.advantage) for t in turns], device=group.device)[:, None] * mask
    stale = [i for i, row in enumerate(behaviour or []) if row is not None]
    diff["importance_weight"] = 1.0
    if stale:
        recorded = pad_rows([behaviour[i] for i in stale], width, group.device)
        ratio = (old_logp[stale] - recorded).exp().clamp(max=algorithm.importance_cap)
        advantages[stale] = advantages[stale] * ratio
        diff["importance_weight"] = float((ratio * mask[stale]).sum() / mask[stale].sum())
    loss, metrics = algorithms.compose_loss(group.spec.policy_loss, algorithm, log_prob=logp, old_log_prob=old_logp,
                                            advantages=advantages, response_mask=mask, entropy=entropy,
                                            ref_log_prob=reference, token_weight=weight, entropy_coef=coefs)
    metrics.update(algorithms.role_entropy(entropy, mask, roles))
    rows = _adapter_rows(group, turns)
    metrics.update(_adapter_loss_metrics(group, rows, algorithm, log_prob=logp, old_log_prob=old_logp,
                                         advantages=advantages, response_mask=mask, entropy=entropy,
                                         ref_log_prob=reference, token_weight=weight, entropy_coef=coefs))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    metrics.update(_adapter_grad_norms(group, rows))
    grad_norm = torch.nn.utils.clip_grad_norm_(group.train_params, group.config.optim.grad_clip)
    if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
        # A NaN/inf step would poison the weights and every later sample: drop it and say so.
        optimizer.zero_grad(set_to_none=True)
        clean = {key: value if math.isfinite(value) and not key.endswith("grad_norm") else 0.0
                 for key, value in metrics.items()}
        return {**clean, **diff, "grad_norm": 0.0, "nonfinite_skipped": 1.0}
    optimizer.step()
    return {**metrics, **diff, "grad_norm": float(grad_norm), "nonfinite_skipped": 0.0}


def _adapter_rows(group: "TorchModelGroup", turns: Sequence[TrainTurn]) -> dict[str, list[int]]:
    """The mini-batch rows of each LoRA adapter (none for a group without adapters)."""
    rows: dict[str, list[int]] = defaultdict(list)
    if group.adapters:
        for i, turn in enumerate(turns):
            if turn.adapter is not None:
                rows[turn.adapter].append(i)
    return rows


def _adapter_loss_metrics(group: "TorchModelGroup", rows: dict[str, list[int]], algorithm: AlgorithmConfig,
                          **tensors: Optional[torch.Tensor]) -> dict[str, float]:
    """``compose_loss``'s metrics over each adapter's rows alone, without gradients (the loss trained is the
    mini-batch's, unchanged)."""
    metrics: dict[str, float] = {}
    with torch.no_grad():
        for adapter, index in rows.items():
            part = {name: None if t is None else t.detach()[index] for name, t in tensors.items()}
            _, own = algorithms.compose_loss(group.spec.policy_loss, algorithm, **part)
            metrics.update({f"adapter/{adapter}/{key}": value for key, value in own.items()})
    return metrics


def _adapter_grad_norms(group: "TorchModelGroup", rows: dict[str, list[int]]) -> dict[str, float]:
    """Each adapter's gradient norm before clipping (its LoRA weights are its own, so the norms are apart)."""
    metrics: dict[str, float] = {}
    for adapter in rows:
        grads = [p.grad for p in _adapter_params(group, adapter) if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) if grads else 0.0
        metrics[f"adapter/{adapter}/grad_norm"] = float(norm)
    return metrics


def _adapter_params(group: "TorchModelGroup", adapter: str) -> list[torch.nn.Parameter]:
    """The trainable LoRA weights of one adapter (PEFT names them ``...lora_A.<adapter>.weight``), found once."""
    found = getattr(group, "_adapter_params", None)
    if found is None:
        found = group._adapter_params = {}
    if adapter not in found:
        trainable = {id(p) for p in group.train_params}
        found[adapter] = [p for key, p in group.model.named_parameters() if id(p) in trainable
                          and any(a.startswith("lora_") and b == adapter for a, b in zip(key.split("."),
                                                                                        key.split(".")[1:]))]
    return found[adapter]


def supervised_turns(group: "TorchModelGroup", examples: Sequence[SupervisedExample]) -> list[TrainTurn]:
    """Examples as turns: the response (+EOS) tokenised, the prompt fitted to leave room for it."""
    turns = []
    for ex in examples:
        response = group.tokenizer(ex.response, add_special_tokens=False)["input_ids"]
        check_known(group.tokenizer, ex.response, response)
        response = response + [group.eos_ids[0]]
        prompt = group.fit_prompts([ex.prompt], len(response))[0]
        turns.append(TrainTurn(prompt, response, rollout_logprobs=[], advantage=0.0, adapter=ex.adapter))
    return turns


def supervised_step(group: "TorchModelGroup", turns: list[TrainTurn], optimizer: torch.optim.Optimizer) -> float:
    """One AdamW step on the token-mean cross-entropy of the turns' responses given their prompts."""
    group.model.train()
    try:
        logp, _, mask = group.response_logprobs(group.model, turns, [t.adapter for t in turns])
        loss = -(logp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(group.train_params, group.config.optim.grad_clip)
        optimizer.step()
    finally:
        group.model.eval()
    return float(loss.detach())
