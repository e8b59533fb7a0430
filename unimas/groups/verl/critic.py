"""A verl group's learned critic: verl's value-model engine beside the actor, and the GAE step of the update.

The value model is verl's own critic machinery: a ``TrainingWorker`` of
``model_type: value_model`` (the FSDP2 ``FSDPEngineWithValueHead``, on CPU
through :mod:`.platform`), built in the same process or rank as the actor
(:mod:`.workers`: in this process, or on every rank of a ``workers: ray``
group), with its own AdamW and schedule from ``critic.optim``.
Its model is a token-classification model with one label (a scalar head on
the last hidden state), loaded from the group's *initial* weights (before any
LoRA adapter) or from ``critic.path``. :func:`install_value_model_loader`
makes verl load it with the group's attention implementation (sdpa), from
safetensors only, with the head at zero: every value is 0 before the first
update, and building a critic draws no random numbers (as the torch critic).
verl's engine reads the value of response token ``j`` at the position before
it (the state before the token), as the torch critic does.

One group update with a critic (:meth:`VerlCritic.prepare`), the same steps
and metrics as the torch backend (docs/critic.md):

1. values of every response token under the critic as it is (a forward);
2. GAE over each (episode, role)'s turns (:mod:`unimas.groups.role_gae`);
3. verl's mini-batch loop (``ppo_epochs`` over ``mini_batch_size``) on the
   clipped value loss (:func:`.loss.unimas_value_loss`), one schedule step.

The policy then trains on the per-token advantages; during the first
``algorithm.critic_warmup`` critic updates it does not train.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from unimas.errors import UserError
from unimas.groups import role_gae
from unimas.groups.base import Critique, GroupSpec, TrainTurn
from unimas.groups.torch.critic import METRICS
from unimas.groups.torch.critic import _advantage_spread as advantage_spread
from unimas.groups.torch.critic import _value_statistics as value_statistics
from unimas.groups.torch.critic import with_context
from unimas.groups.verl import batch as rows_of

if TYPE_CHECKING:
    from unimas.groups.verl.group import VerlModelGroup

_installed = False


def _load_value_model(local_path: str, torch_dtype: torch.dtype, model_config: Any, trust_remote_code: bool):
    """What verl's value engine builds its module with: a one-label token-classification model, zero head.

    verl's own loader asks for flash-attention (absent on CPU) and falls back
    to trl's value-head class; this one keeps the attention the group's config
    names, reads safetensors only and never runs code from the model dir (whatever verl passes as
    ``trust_remote_code``). The head's random init is drawn from a
    forked generator and then zeroed, so the process's RNG streams are untouched.
    """
    from transformers import AutoModelForTokenClassification

    with torch.random.fork_rng(devices=[]):
        model = AutoModelForTokenClassification.from_pretrained(
            local_path, dtype=torch_dtype, config=model_config, trust_remote_code=False,  # never a dir's own code
            attn_implementation=getattr(model_config, "_attn_implementation", None) or "sdpa",
            local_files_only=True, use_safetensors=True)
    heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
    if not heads:
        raise ValueError(f"{type(model).__name__} has no one-output head to value tokens with")
    with torch.no_grad():
        for parameter in heads[-1].parameters():
            parameter.zero_()
    return model


def install_value_model_loader() -> None:
    """Route verl's value-model loading through :func:`_load_value_model` (once per process, every rank)."""
    global _installed
    if _installed:
        return
    import verl.utils.model

    verl.utils.model.load_valuehead_model = _load_value_model  # looked up by name each time an engine builds
    _installed = True


def check_model_dir(spec: GroupSpec, vocabulary: int) -> None:
    """``critic.path``: a local Hugging Face dir with safetensors weights whose vocabulary covers the group's ids."""
    from transformers import AutoConfig

    path = spec.config.critic.path
    where = f"models.{spec.name}.critic.path"
    if path is None:
        return
    if not sorted(Path(path).glob("*.safetensors")):
        raise UserError(f"{path!r} holds no safetensors weights (a local Hugging Face model dir; other weight "
                        "formats are not read)", where=where)
    try:
        size = int(AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False).vocab_size)
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"cannot read a critic model config from {path!r}: {first}", where=where) from None
    if size < vocabulary:
        raise UserError(f"the critic's vocabulary has {size} ids but the group's tokenizer {vocabulary}: the "
                        "critic reads the group's token ids, so it needs the same tokenizer", where=where)


class VerlCritic:
    """The group-side half of a verl group's critic: layout, GAE and metrics; the engine is the trainer's."""

    def __init__(self, spec: GroupSpec):
        self.spec = spec
        self.updates = 0
        """Update calls the critic has trained in (its schedule's steps): saved with the group."""

    @property
    def warming_up(self) -> bool:
        """Within ``algorithm.critic_warmup``: this update trains the critic only."""
        return self.updates < self.spec.algorithm.critic_warmup

    def idle(self, group: "VerlModelGroup") -> dict[str, float]:
        """An update call without turns: nothing trains (as for the verl policy); metrics 0, the current rate."""
        return {**dict.fromkeys((f"critic/{key}" for key in METRICS), 0.0),
                "critic/lr": group.trainer.critic_learning_rate()}

    def _rows(self, group: "VerlModelGroup", turns: Sequence[TrainTurn]) -> tuple[rows_of.Rows, int]:
        """The turns as padded rows (a multiple of the mini-batch, split evenly over the ranks), and the
        mini-batch size."""
        ranks = group.trainer.ranks
        mini = rows_of.padded_size(min(self.spec.algorithm.mini_batch_size or len(turns), len(turns)), ranks)
        return rows_of.layout(turns, group.pad_id, rows_of.padded_size(len(turns), mini)), mini

    def values(self, group: "VerlModelGroup", turns: Sequence[TrainTurn]) -> list[list[float]]:
        """Each turn's per-token values under the current critic."""
        rows, _ = self._rows(group, turns)
        per_rank = rows.size // group.trainer.ranks  # without a token budget, one forward per rank
        batching = {} if self.spec.options.dynamic_batch_size else {"micro_batch_size_per_gpu": per_rank}
        values = group.trainer.values(rows, **batching)
        return [row[: len(t.response_ids)] for row, t in zip(values.tolist(), turns)]

    def prepare(self, group: "VerlModelGroup", turns: list[TrainTurn]) -> tuple[list[TrainTurn], dict[str, float]]:
        """Values, GAE, critic epochs (module docstring): the turns with per-token advantages, and metrics."""
        algorithm = self.spec.algorithm
        old = self.values(group, turns)
        rows, mini = self._rows(group, turns)
        advantages, returns = role_gae.gae_over_turns(self.spec.estimator, turns, old, algorithm.gamma,
                                                      algorithm.lam, algorithm.gae_reward)
        lr = group.trainer.critic_learning_rate()
        extra = {"old_values": rows_of.response_rows(old, rows), "returns": rows_of.response_rows(returns, rows)}
        trained = group.trainer.train_critic(
            rows, extra, calculate_entropy=False, compute_loss=True, global_batch_size=rows.size,
            mini_batch_size=mini, epochs=algorithm.ppo_epochs, seed=self.spec.seed + self.updates,
            dataloader_kwargs={"shuffle": mini < rows.size}, micro_batch_size_per_gpu=mini // group.trainer.ranks,
            use_dynamic_bsz=False)
        self.updates += 1
        metrics = {f"critic/{key}": trained.get(key, 0.0) for key in ("value_loss", "value_clip_frac", "grad_norm")}
        if not math.isfinite(metrics["critic/grad_norm"]):  # verl's engine skipped the step
            metrics.update({"critic/value_loss": 0.0, "critic/value_clip_frac": 0.0, "critic/grad_norm": 0.0})
        metrics["critic/lr"] = lr
        metrics.update(value_statistics(old, returns))
        metrics.update(advantage_spread(turns, advantages))
        return [dataclasses.replace(t, token_advantages=a) for t, a in zip(turns, advantages)], metrics

    def critique(self, group: "VerlModelGroup", turns: list[TrainTurn]) -> Critique:
        """The centralized critic's step (docs/critic.md): each turn read after its ``context`` (the episode
        before it, tokenised by the group), then :meth:`prepare`'s values, GAE and critic epochs."""
        warming_up = self.warming_up
        if not turns:
            return Critique([], self.idle(group), warming_up)
        trained, metrics = self.prepare(group, with_context(group, turns))
        return Critique([t.token_advantages or [] for t in trained], metrics, warming_up)
