"""Where a verl group's engine runs: in the group's process (one rank) or as verl's Ray worker group (N ranks).

Both trainers take the group's padded rows (:class:`.batch.Rows`) and give
back per-row tensors in the same order, so :class:`.group.VerlModelGroup`
does not know which one it drives:

* :class:`InProcessTrainer` (``options.workers: in_process``) builds verl's
  ``TrainingWorker`` for the actor and, with a KL term, a forward-only one
  for the reference, on the process's one-rank group (:mod:`.patches`).
* :class:`RayTrainer` (``options.workers: ray``) hosts the group as verl's
  own trainer hosts its actor: a ``RayWorkerGroup`` of
  ``ActorRolloutRefWorker`` ranks (role ``actor_rollout`` or
  ``actor_rollout_ref``) on a ``RayResourcePool`` of ``options.world_size``
  bundles (GPUs, or gloo processes on CPU), configured by
  :mod:`.worker_config`. The ranks split every batch (data parallel); rows
  are dealt round-robin first, so padding rows never pile up on one rank.
  The rollout is then verl's hybrid one, a server replica per rank, synced
  by the ranks themselves (:mod:`.servers`).

A group with a critic also gets verl's value-model ``TrainingWorker`` (in the
process, or on every rank beside the actor), which both trainers reach
through ``values``, ``train_critic`` and ``save_critic``/``load_critic``
(:mod:`.critic`).

In both, the actor's and the reference's logits ban the ids past the
tokenizer (:mod:`.vocabulary`), which no rollout samples.

Both save and load the engine's state through :mod:`.checkpoint` (each rank
its own files), never through verl's checkpoint manager, which unpickles.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Optional

import torch

from unimas.errors import UserError
from unimas.groups.base import GroupSpec
from unimas.groups.verl import checkpoint, lora, patches, turn_rows, vocabulary
from unimas.groups.verl.loss import unimas_loss, unimas_value_loss
from unimas.groups.verl.options import SERVER_ROLLOUT

WORKER_SETUP = "unimas.groups.verl.worker_setup"
"""What every rank imports with verl (``VERL_USE_EXTERNAL_MODULES``): CPU platform and rollout registrations."""


def _metrics(output: Any) -> dict[str, float]:
    from verl.utils import tensordict_utils as tu

    return turn_rows.mean_metrics(tu.get(output, "metrics"))


def _has_log_probs(output: Any) -> bool:
    from verl.utils import tensordict_utils as tu

    return output is not None and tu.get(output, "log_probs") is not None


def value_loss_fn(spec: GroupSpec) -> Any:
    """The critic engine's loss: the clipped value loss with the group's clip range and aggregation."""
    return partial(unimas_value_loss, spec.config.critic.value_clip, spec.algorithm.loss_agg_mode)


class InProcessTrainer:
    """verl's ``TrainingWorker`` (actor, reference with a KL term, critic with ``critic``) in this process."""

    ranks = 1

    def __init__(self, spec: GroupSpec, configs: Any):
        from verl.workers.engine_workers import TrainingWorker

        self.actor = self.reference = self.critic = None
        with patches.rendezvous_environment():
            if spec.config.trainable:
                with lora.seeded_init(configs.actor.model_config, spec.seed):
                    self.actor = TrainingWorker(configs.actor)
                    self.actor.reset()
                vocabulary.ban_ids_past_tokenizer(self.actor.engine)
                self.actor.set_loss_fn(partial(unimas_loss, spec.policy_loss, spec.algorithm))
            if configs.reference is not None:
                self.reference = TrainingWorker(configs.reference)
                self.reference.reset()
                vocabulary.ban_ids_past_tokenizer(self.reference.engine)
            if configs.critic is not None:
                self.critic = TrainingWorker(configs.critic)
                self.critic.reset()
                self.critic.set_loss_fn(value_loss_fn(spec))

    def log_probs(self, rows: turn_rows.Rows, reference: bool = False, **meta: Any) -> Optional[torch.Tensor]:
        """Per-token log-probs of every row's response (rows x response width), or None without outputs."""
        data = turn_rows.engine_input(rows, calculate_entropy=False, compute_loss=False, **meta)
        output = (self.reference if reference else self.actor).infer_batch(data)
        return turn_rows.to_rows(output, "log_probs", data) if _has_log_probs(output) else None

    def train(self, rows: turn_rows.Rows, extra: dict[str, torch.Tensor], **meta: Any) -> dict[str, float]:
        """verl's PPO mini-batch loop over the rows; its metrics averaged over mini-batches."""
        return _metrics(self.actor.train_mini_batch(turn_rows.engine_input(rows, extra, **meta)))

    def learning_rate(self) -> float:
        return float(self.actor.engine.optimizer.param_groups[0]["lr"])

    def values(self, rows: turn_rows.Rows, **meta: Any) -> torch.Tensor:
        """The critic's value of the state before every response token (rows x response width)."""
        data = turn_rows.engine_input(rows, compute_loss=False, **meta)
        return turn_rows.to_rows(self.critic.infer_batch(data), "values", data)

    def train_critic(self, rows: turn_rows.Rows, extra: dict[str, torch.Tensor], **meta: Any) -> dict[str, float]:
        """verl's mini-batch loop of the critic over the rows (``extra``: old values and returns)."""
        return _metrics(self.critic.train_mini_batch(turn_rows.engine_input(rows, extra, **meta)))

    def critic_learning_rate(self) -> float:
        return float(self.critic.engine.optimizer.param_groups[0]["lr"])

    def save(self, directory: Path) -> None:
        checkpoint.save_engine(self.actor.engine, directory)

    def export_weights(self, directory: Path) -> None:
        checkpoint.export_hugging_face(self.actor.engine, directory)

    def load(self, directory: Path) -> None:
        checkpoint.load_engine(self.actor.engine, directory)

    def save_critic(self, directory: Path) -> None:
        checkpoint.save_engine(self.critic.engine, directory, process_state=False)

    def load_critic(self, directory: Path) -> None:
        checkpoint.load_engine(self.critic.engine, directory, process_state=False)


def _worker_class() -> type:
    """verl's hybrid worker, plus what unimas needs of it.

    The optimiser's rate for the metrics; each rank's engine state saved and
    loaded by :mod:`.checkpoint` (a refused file comes back as (message, file),
    since a ``UserError`` raised in a Ray actor arrives without its fields); a
    LoRA adapter's init seeded with the group's seed (verl leaves it to the
    global RNG); for a LoRA group served by unimas's ``hf`` servers, base
    and adapter sent under their peft names, as the in-process group does
    (verl's export merges them in bfloat16); and, with ``critic`` (a value
    model ``TrainingWorkerConfig``), verl's critic ``TrainingWorker`` on each
    rank beside the actor, as the actor is built (``engine`` picks which one
    the rate and the checkpoint calls are about); the actor's and the
    reference's logits banning the ids past the tokenizer, as vLLM's servers
    do (:mod:`.vocabulary`).
    """
    from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

    class UnimasActorRolloutRefWorker(ActorRolloutRefWorker):
        def __init__(self, config: Any, role: str, critic: Any = None, critic_loss: Any = None, **kwargs: Any):
            super().__init__(config, role, **kwargs)
            self._critic_config, self._critic_loss = critic, critic_loss
            self.critic: Optional[TrainingWorker] = None

        def _engine(self, engine: str) -> Any:
            return (self.critic if engine == "critic" else self.actor).engine

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def learning_rate(self, engine: str = "actor") -> float:
            return float(self._engine(engine).optimizer.param_groups[0]["lr"])

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def save_unimas_state(self, directory: str, engine: str = "actor") -> None:
            checkpoint.save_engine(self._engine(engine), Path(directory), process_state=engine == "actor")

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def export_unimas_weights(self, directory: str) -> None:
            checkpoint.export_hugging_face(self.actor.engine, Path(directory))

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def load_unimas_state(self, directory: str, engine: str = "actor") -> Optional[tuple[str, Optional[str]]]:
            try:
                checkpoint.load_engine(self._engine(engine), Path(directory), process_state=engine == "actor")
            except UserError as refused:
                return str(refused).removeprefix(f"{refused.where}: "), refused.where
            return None

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self):
            with lora.seeded_init(self.config.model, int(self.config.actor.fsdp_config.seed)):
                built = super().init_model()
            for worker in (self.actor, self.ref):
                vocabulary.ban_ids_past_tokenizer(None if worker is None else worker.engine)
            if self._critic_config is not None:
                self.critic = TrainingWorker(self._critic_config)
                self.critic.reset()
                self.critic.set_loss_fn(self._critic_loss)
            return built

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
        def compute_values(self, data: Any) -> Any:
            output = self.critic.infer_batch(data)
            return output.cpu() if output is not None else None

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
        def update_critic(self, data: Any) -> Any:
            output = self.critic.train_mini_batch(data)
            return output.cpu() if output is not None else None

        @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
        async def update_weights(self, global_steps: Optional[int] = None, mode: str = "auto"):
            if not (self.config.model.lora_rank and self.config.rollout.name == SERVER_ROLLOUT):
                return await super().update_weights(global_steps=global_steps, mode=mode)
            await self.rollout.update_weights(lora.peft_weights(self.actor.engine), global_steps=global_steps)
            return {}

    return UnimasActorRolloutRefWorker


_shared_gpus: dict[int, Any] = {}
"""One pool per GPU share (0.5 -> 2 groups per GPU): the groups sharing a GPU are placed on the same bundle."""


def _resource_pool(gpus: float, ranks: int, prefix: str) -> tuple[Any, bool]:
    """The group's ``RayResourcePool`` and whether other groups share it.

    A whole-GPU (or CPU) group gets a pool of its own, one bundle per rank.
    Groups with a fraction of one GPU colocate on one pool, each rank asking
    for that fraction, the way verl colocates worker groups on its pools.
    """
    from verl.single_controller.ray import RayResourcePool

    if 0 < gpus < 1 and patches.on_gpu():
        sharers = round(1 / gpus)
        if sharers not in _shared_gpus:
            _shared_gpus[sharers] = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=sharers,
                                                    name_prefix=f"unimas_gpu_share_{sharers}_")
        return _shared_gpus[sharers], True
    return RayResourcePool(process_on_nodes=[ranks], use_gpu=patches.on_gpu(), max_colocate_count=1,
                           name_prefix=prefix), False


class RayTrainer:
    """The group's ranks: verl's ``RayWorkerGroup`` of ``ActorRolloutRefWorker``, data parallel over ``world_size``."""

    def __init__(self, spec: GroupSpec, root: Any, role: str, critic_config: Any = None):
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

        from unimas.groups.verl.servers import ensure_ray

        self.ranks = int(spec.options.world_size)
        self.has_reference = role == "actor_rollout_ref"
        ensure_ray()
        prefix = f"unimas_{spec.name}_"
        device = "cuda" if patches.on_gpu() else "cpu"
        pool, self.shares_pool = _resource_pool(spec.config.resources.gpus, self.ranks, prefix)
        critic = {} if critic_config is None else {"critic": critic_config, "critic_loss": value_loss_fn(spec)}
        worker = RayClassWithInitArgs(cls=ray.remote(_worker_class()), config=root.actor_rollout_ref, role=role,
                                      **critic)
        self.workers = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, name_prefix=prefix,
                                      device_name=device, worker_env={"VERL_USE_EXTERNAL_MODULES": WORKER_SETUP})
        self.pool, self.closed = pool, False
        self.workers.init_model()
        self.workers.set_loss_fn(partial(unimas_loss, spec.policy_loss, spec.algorithm))

    def _deal(self, rows: turn_rows.Rows, extra: Optional[dict[str, torch.Tensor]] = None):
        """Rows (and extra per-row tensors) reordered round-robin over ranks, and the order that undoes it."""
        order = torch.tensor([row for rank in range(self.ranks) for row in range(rank, rows.size, self.ranks)])
        dealt = turn_rows.Rows({key: value[order] for key, value in rows.tensors.items()}, rows.real, rows.prompt_width)
        return dealt, {key: value[order] for key, value in (extra or {}).items()}, torch.argsort(order)

    def log_probs(self, rows: turn_rows.Rows, reference: bool = False, **meta: Any) -> Optional[torch.Tensor]:
        dealt, _, undo = self._deal(rows)
        data = turn_rows.engine_input(dealt, calculate_entropy=False, compute_loss=False, **meta)
        output = (self.workers.compute_ref_log_prob if reference else self.workers.compute_log_prob)(data)
        return turn_rows.to_rows(output, "log_probs", data)[undo] if _has_log_probs(output) else None

    def train(self, rows: turn_rows.Rows, extra: dict[str, torch.Tensor], **meta: Any) -> dict[str, float]:
        dealt, extra, _ = self._deal(rows, extra)
        return _metrics(self.workers.update_actor(turn_rows.engine_input(dealt, extra, **meta)))

    def learning_rate(self) -> float:
        return self.workers.learning_rate()[0]

    def values(self, rows: turn_rows.Rows, **meta: Any) -> torch.Tensor:
        dealt, _, undo = self._deal(rows)
        data = turn_rows.engine_input(dealt, compute_loss=False, **meta)
        return turn_rows.to_rows(self.workers.compute_values(data), "values", data)[undo]

    def train_critic(self, rows: turn_rows.Rows, extra: dict[str, torch.Tensor], **meta: Any) -> dict[str, float]:
        dealt, extra, _ = self._deal(rows, extra)
        return _metrics(self.workers.update_critic(turn_rows.engine_input(dealt, extra, **meta)))

    def critic_learning_rate(self) -> float:
        return self.workers.learning_rate(engine="critic")[0]

    def save(self, directory: Path) -> None:
        self.workers.save_unimas_state(str(directory))

    def export_weights(self, directory: Path) -> None:
        self.workers.export_unimas_weights(str(directory))

    def load(self, directory: Path) -> None:
        self._load(directory, "actor")

    def save_critic(self, directory: Path) -> None:
        self.workers.save_unimas_state(str(directory), engine="critic")

    def load_critic(self, directory: Path) -> None:
        self._load(directory, "critic")

    def _load(self, directory: Path, engine: str) -> None:
        """Every rank loads its own files; the first refusal is raised here, naming its file."""
        for refused in self.workers.load_unimas_state(str(directory), engine=engine):
            if refused is not None:
                message, where = refused
                raise UserError(message, where=where)

    def close(self) -> None:
        """Stop the ranks (their names and placement group are then free for a later group of the same name)."""
        import ray

        if self.closed or not ray.is_initialized():
            return
        self.closed = True
        for handle in self.workers.workers:
            ray.kill(handle)
        for group in [] if self.shares_pool else self.pool.pgs or []:
            ray.util.remove_placement_group(group)
