"""A verl group's learned critic: verl's value-model engine beside the actor, and the GAE step of the update.

The value model is verl's own critic machinery: a ``TrainingWorker`` of
``model_type: value_model`` (the FSDP2 ``FSDPEngineWithValueHead``, on CPU
through :mod:`.patches`), built in the same process or rank as the actor
(:mod:`.workers`: in this process, or on every rank of a ``workers: ray``
group), with its own AdamW and schedule from ``critic.optim``.
Its model is a token-classification model with one label (a scalar head on
the last hidden state), loaded from the group's *initial* weights (before any
LoRA adapter) or from ``critic.path``. :func:`.patches.install_value_model_loader` makes verl load it with the group's attention implementation (sdpa), from
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
from typing import TYPE_CHECKING, Optional, Sequence


from unimas.errors import UserError
from unimas.groups import role_gae
from unimas.groups.base import Critique, GroupSpec, TrainTurn
from unimas.groups.critic_common import METRICS, advantage_spread, value_statistics, with_context
from unimas.groups.verl import turn_rows

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from unimas.groups.verl.workers import InProcessTrainer, RayTrainer

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
    """The group-side half of a verl group's critic: layout, GAE and metrics; the engine is ``trainer``'s.

    Built by the group with the two things it reads of it: the trainer whose value engine trains (in this
    process or on Ray ranks) and the pad id rows are laid out with.
    """

    def __init__(self, spec: GroupSpec, trainer: "InProcessTrainer | RayTrainer", pad_id: int):
        self.spec = spec
        self.trainer = trainer
        self.pad_id = pad_id
        self.updates = 0
        """Update calls the critic has trained in (its schedule's steps): saved with the group."""

    @property
    def warming_up(self) -> bool:
        """Within ``algorithm.critic_warmup``: this update trains the critic only."""
        return self.updates < self.spec.algorithm.critic_warmup

    def idle(self) -> dict[str, float]:
        """An update call without turns: nothing trains (as for the verl policy); metrics 0, the current rate."""
        return {**dict.fromkeys((f"critic/{key}" for key in METRICS), 0.0),
                "critic/lr": self.trainer.critic_learning_rate()}

    def _rows(self, turns: Sequence[TrainTurn]) -> tuple[turn_rows.Rows, int]:
        """The turns as padded rows (a multiple of the mini-batch, split evenly over the ranks), and the
        mini-batch size."""
        ranks = self.trainer.ranks
        mini = turn_rows.padded_size(min(self.spec.algorithm.mini_batch_size or len(turns), len(turns)), ranks)
        return turn_rows.layout(turns, self.pad_id, turn_rows.padded_size(len(turns), mini)), mini

    def values(self, turns: Sequence[TrainTurn]) -> list[list[float]]:
        """Each turn's per-token values under the current critic."""
        rows, _ = self._rows(turns)
        per_rank = rows.size // self.trainer.ranks  # without a token budget, one forward per rank
        batching = {} if self.spec.options.dynamic_batch_size else {"micro_batch_size_per_gpu": per_rank}
        values = self.trainer.values(rows, **batching)
        return [row[: len(t.response_ids)] for row, t in zip(values.tolist(), turns)]

    def prepare(self, turns: list[TrainTurn]) -> tuple[list[TrainTurn], dict[str, float]]:
        """Values, GAE, critic epochs (module docstring): the turns with per-token advantages, and metrics."""
        algorithm, trainer = self.spec.algorithm, self.trainer
        old = self.values(turns)
        rows, mini = self._rows(turns)
        advantages, returns = role_gae.gae_over_turns(self.spec.estimator, turns, old, algorithm.gamma,
                                                      algorithm.lam, algorithm.gae_reward)
        lr = trainer.critic_learning_rate()
        extra = {"old_values": turn_rows.response_rows(old, rows), "returns": turn_rows.response_rows(returns, rows)}
        trained = trainer.train_critic(
            rows, extra, calculate_entropy=False, compute_loss=True, global_batch_size=rows.size,
            mini_batch_size=mini, epochs=algorithm.ppo_epochs, seed=self.spec.seed + self.updates,
            dataloader_kwargs={"shuffle": mini < rows.size}, micro_batch_size_per_gpu=mini // trainer.ranks,
            use_dynamic_bsz=False)
        self.updates += 1
        metrics = {f"critic/{key}": trained.get(key, 0.0) for key in ("value_loss", "value_clip_frac", "grad_norm")}
        if not math.isfinite(metrics["critic/grad_norm"]):  # verl's engine skipped the step
            metrics.update({"critic/value_loss": 0.0, "critic/value_clip_frac": 0.0, "critic/grad_norm": 0.0})
        metrics["critic/lr"] = lr
        metrics.update(value_statistics(old, returns))
        metrics.update(advantage_spread(turns, advantages))
        return [dataclasses.replace(t, token_advantages=a) for t, a in zip(turns, advantages)], metrics

    def critique(self, turns: list[TrainTurn], tokenizer: "PreTrainedTokenizerBase",
                 max_positions: Optional[int]) -> Critique:
        """The centralized critic's step (docs/critic.md): each turn read after its ``context`` (the episode
        before it, tokenised by the group's ``tokenizer``), then :meth:`prepare`'s values, GAE and critic
        epochs."""
        warming_up = self.warming_up
        if not turns:
            return Critique([], self.idle(), warming_up)
        trained, metrics = self.prepare(with_context(turns, tokenizer, self.spec.name, max_positions))
        return Critique([t.token_advantages or [] for t in trained], metrics, warming_up)
