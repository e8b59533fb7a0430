"""A torch model group's learned critic: a value model, its optimiser, and the GAE step of the update.

The value model is a causal-LM backbone with a scalar head on its last hidden
state: a copy of the group's own initial backbone (``models.<g>.critic`` with
no ``path``), or a separate local Hugging Face model dir (``critic.path``,
e.g. a smaller model with the same tokenizer). The head starts at zero, so
every value is 0 before the first update and building a critic draws no
random numbers. The value of the state before response token ``j`` is read
from the hidden state at the position preceding it (the last prompt token for
``j = 0``): the same positions whose logits give the log-prob of token ``j``.

One group update with a critic (:meth:`Critic.prepare`, called by the group's learner with its batch cache
and the group's generator):

1. values of every response token under the critic as it is (no gradient);
2. GAE over each (episode, role)'s turns (:mod:`unimas.groups.role_gae`) with the
   run's estimator (verl's ``gae``): per-token advantages for the policy
   loss, returns for the critic;
3. critic epochs (``ppo_epochs`` over ``mini_batch_size`` mini-batches, as
   the policy) on verl's clipped value loss, with the critic's own AdamW and
   schedule.

The policy update then trains with the per-token advantages; during the
first ``algorithm.critic_warmup`` update calls it is skipped. The critic
stays in eval mode (no dropout), so values are a pure function of weights.
Checkpoint: ``critic/model/`` (``save_pretrained``), ``critic/value_head.safetensors``,
``critic/optimizer.pt`` and ``critic/scheduler.pt`` (state dicts, read back with
``torch.load(weights_only=True)``); the schedule's step count is the critic's
update count.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors.torch import save_file
from transformers import PreTrainedModel

from unimas.algorithms import losses
from unimas.config.schema import CriticConfig
from unimas.errors import UserError
from unimas.groups import role_gae
from unimas.groups.base import Critique, GroupSpec, TrainTurn
from unimas.groups.critic_common import METRICS, advantage_spread, value_statistics, with_context
from unimas.groups.hf.layout import PaddedBatch, pad_rows
from unimas.groups.hf.pretrained import pretrained_model
from unimas.groups.hf.shared_prompts import SplitBatch, UnsharableCache, forward_split
from unimas.groups.torch import optimizer as optim_lib
from unimas.groups.torch.batches import TurnBatches, minibatches
from unimas.groups.torch.weights import copy_weights
from unimas.safe_load import load_safetensors, load_tensors, reading

if TYPE_CHECKING:
    from unimas.groups.torch.policy import TorchPolicy

BACKBONE_DIR = "model"
HEAD_FILE, OPTIMIZER_FILE, SCHEDULER_FILE = "value_head.safetensors", "optimizer.pt", "scheduler.pt"


class ValueModel(torch.nn.Module):
    """A causal-LM backbone and a scalar head: one value per response token."""

    def __init__(self, backbone: PreTrainedModel):
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(backbone.config.hidden_size, 1, dtype=torch.float32)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()

    def forward(self, batch: PaddedBatch | SplitBatch) -> torch.Tensor:
        """(rows, R): the value of the state before each response column (padding columns included)."""
        if isinstance(batch, SplitBatch):  # the prompts' last state comes before each response's first token
            first, rest = forward_split(self.backbone, batch, output_hidden_states=True)
            hidden = torch.cat([first.hidden_states[-1][batch.rows, -1:], rest.hidden_states[-1][:, :-1]], dim=1)
        else:
            size = batch.response.shape[1]
            out = self.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                position_ids=batch.position_ids, use_cache=False, output_hidden_states=True,
                                logits_to_keep=1)
            hidden = out.hidden_states[-1][:, -(size + 1):-1]
        return self.head(hidden.float()).squeeze(-1)


def backbone_for(spec: GroupSpec, group_model: PreTrainedModel, vocabulary: int) -> PreTrainedModel:
    """The critic's backbone: ``critic.path`` loaded from safetensors, or a copy of the group's model."""
    config: CriticConfig = spec.config.critic
    if config.path is None:
        return copy.deepcopy(group_model)
    where = f"models.{spec.name}.critic.path"
    try:
        backbone = pretrained_model(Path(config.path), spec.options.torch_dtype)
    except (OSError, ValueError, KeyError, RuntimeError, StrictDataclassError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"cannot load a critic model from {config.path!r}: {first}", where=where) from None
    size = backbone.get_input_embeddings().weight.shape[0]
    if size < vocabulary:
        raise UserError(f"the critic's vocabulary has {size} ids but the group's tokenizer {vocabulary}: the "
                        "critic reads the group's token ids, so it needs the same tokenizer", where=where)
    return backbone


class Critic:
    """The value model of one torch group, with its own AdamW and learning-rate schedule."""

    def __init__(self, spec: GroupSpec, group_model: PreTrainedModel, vocabulary: int, device: torch.device):
        self.config: CriticConfig = spec.config.critic
        self.spec = spec
        self.device = device
        self.model = ValueModel(backbone_for(spec, group_model, vocabulary)).to(device).eval()
        self.params = list(self.model.parameters())
        for p in self.params:
            p.requires_grad_(True)
        self.optimizer = optim_lib.build_optimizer(self.params, self.config.optim)
        self.scheduler = optim_lib.build_scheduler(self.optimizer, self.config.optim, spec.total_updates)

    @property
    def updates(self) -> int:
        """Update calls the critic has made (its schedule's step count)."""
        return int(self.scheduler.last_epoch)

    @property
    def warming_up(self) -> bool:
        """Within ``algorithm.critic_warmup``: this update trains the critic only."""
        return self.updates < self.spec.algorithm.critic_warmup

    def idle(self) -> dict[str, float]:
        """An update call without turns: the schedule still advances (as the policy's does); metrics are 0."""
        optim_lib.advance(self.scheduler)
        return dict.fromkeys((f"critic/{key}" for key in METRICS), 0.0)

    def values(self, turns: Sequence[TrainTurn], chunk: int, batches: TurnBatches) -> list[list[float]]:
        """Each turn's per-token values under the current critic, ``chunk`` turns per forward."""
        rows: list[list[float]] = []
        with torch.inference_mode():
            for begin in range(0, len(turns), chunk):
                part = turns[begin: begin + chunk]
                values = _values(self.model, part, batches)[0].tolist()
                rows.extend(row[: len(t.response_ids)] for row, t in zip(values, part))
        return rows

    def prepare(self, turns: list[TrainTurn], batches: TurnBatches, generator: torch.Generator
                ) -> tuple[list[TrainTurn], dict[str, float]]:
        """Values, GAE, critic epochs (module docstring): the turns with per-token advantages, and metrics.
        ``batches`` lays turns out (the learner's cache); ``generator`` shuffles the mini-batches."""
        algorithm = self.spec.algorithm
        size = algorithm.mini_batch_size or len(turns)
        old = self.values(turns, size, batches)
        advantages, returns = role_gae.gae_over_turns(self.spec.estimator, turns, old, algorithm.gamma,
                                                      algorithm.lam, algorithm.gae_reward)
        trained = self._train(turns, old, returns, batches, generator)
        metrics = {f"critic/{key}": value for key, value in trained.items()}
        metrics.update(value_statistics(old, returns))
        metrics.update(advantage_spread(turns, advantages))
        return [dataclasses.replace(t, token_advantages=a) for t, a in zip(turns, advantages)], metrics

    def critique(self, policy: "TorchPolicy", turns: list[TrainTurn], batches: TurnBatches,
                 generator: torch.Generator) -> Critique:
        """The centralized critic's step (docs/critic.md): each turn read after its ``context`` (the episode
        before it, tokenised by ``policy``'s tokenizer), then :meth:`prepare`'s values, GAE and critic epochs."""
        warming_up = self.warming_up
        if not turns:
            return Critique([], self.idle(), warming_up)
        read = with_context(turns, policy.tokenizer, policy.name, policy.max_positions)
        trained, metrics = self.prepare(read, batches, generator)
        return Critique([t.token_advantages or [] for t in trained], metrics, warming_up)

    def _train(self, turns: list[TrainTurn], old: list[list[float]], returns: list[list[float]],
               batches: TurnBatches, generator: torch.Generator) -> dict[str, float]:
        algorithm = self.spec.algorithm
        size = algorithm.mini_batch_size or len(turns)
        sums: dict[str, float] = defaultdict(float)
        steps = 0
        lr = optim_lib.current_lr(self.optimizer)
        for rows in minibatches(len(turns), size, algorithm.ppo_epochs, generator):
            for key, value in self._step([turns[i] for i in rows], [old[i] for i in rows],
                                         [returns[i] for i in rows], batches).items():
                sums[key] += value
            steps += 1
        optim_lib.advance(self.scheduler)
        return {**{key: value / max(steps, 1) for key, value in sums.items()}, "lr": lr}

    def _step(self, turns: list[TrainTurn], old: list[list[float]], returns: list[list[float]],
              batches: TurnBatches) -> dict[str, float]:
        """One AdamW step on verl's clipped value loss over one mini-batch; a non-finite step is dropped."""
        values, response_mask = _values(self.model, turns, batches)
        width = values.shape[1]
        loss, clip_frac = losses.value_loss(values, pad_rows(old, width, self.device),
                                                pad_rows(returns, width, self.device), response_mask,
                                                self.config.value_clip, self.spec.algorithm.loss_agg_mode)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.optim.grad_clip)
        if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            return {"value_loss": 0.0, "value_clip_frac": 0.0, "grad_norm": 0.0}
        self.optimizer.step()
        return {"value_loss": float(loss.detach()), "value_clip_frac": clip_frac, "grad_norm": float(grad_norm)}

    # ----------------------------------------------------------- checkpoints

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.model.backbone.save_pretrained(directory / BACKBONE_DIR)
        head = {key: value.detach().contiguous().cpu() for key, value in self.model.head.state_dict().items()}
        save_file(head, directory / HEAD_FILE)
        torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        torch.save(self.scheduler.state_dict(), directory / SCHEDULER_FILE)

    def load(self, directory: Path) -> None:
        """Restore :meth:`save`'s files in place (the optimiser keeps pointing at the same tensors)."""
        if not (directory / HEAD_FILE).exists():
            raise UserError(f"has no critic ({HEAD_FILE}): the checkpoint was written by a run without "
                            f"models.{self.spec.name}.critic", where=str(directory))
        self.load_weights(directory)
        state = load_tensors(directory / OPTIMIZER_FILE, self.device)
        with reading(directory / OPTIMIZER_FILE):
            self.optimizer.load_state_dict(state)
        state = load_tensors(directory / SCHEDULER_FILE)
        with reading(directory / SCHEDULER_FILE):
            self.scheduler.load_state_dict(state)
        optim_lib.apply_config(self.optimizer, self.scheduler, self.config.optim)

    def load_weights(self, directory: Path) -> None:
        """The value model alone (backbone and head), in place: what ``init_from`` carries into a new run,
        whose critic keeps a fresh optimiser and schedule as the policy does."""
        copy_weights(self.model.backbone, directory / BACKBONE_DIR, clean_names=False,
                     dtype=self.spec.options.torch_dtype)
        head = load_safetensors(directory / HEAD_FILE, device=str(self.device))
        with reading(directory / HEAD_FILE):
            self.model.head.load_state_dict(head)

    @staticmethod
    def saved_in(directory: Path) -> bool:
        """Whether ``directory`` (a group's ``critic/`` dir) holds a value model."""
        return (directory / HEAD_FILE).exists() and (directory / BACKBONE_DIR).is_dir()


def _values(model: ValueModel, turns: Sequence[TrainTurn], batches: TurnBatches
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, response mask) of the turns: their distinct prompts forwarded once when sharing pays (as the
    policy's log-probs are), else one full row per turn."""
    batch = batches(turns)
    if isinstance(batch, SplitBatch):
        try:
            return model(batch), batch.response_mask
        except UnsharableCache:  # a backbone whose cache rows cannot be copied
            batch = batches.full_rows(turns)
    return model(batch), batch.response_mask
