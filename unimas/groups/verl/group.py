"""``backend: verl``: a model group trained by verl's FSDP2 engine, generating through a verl rollout.

One :class:`VerlModelGroup` hosts, in this process (``options.workers:
in_process``) or on a Ray worker group of ``options.world_size`` ranks
(``workers: ray``, see :mod:`.workers`):

* the **actor**: verl's engine (FSDP2; gloo on CPU through :mod:`.patches`,
  NCCL on GPU) that computes log-probs and runs the PPO/GRPO mini-batch loop.
  Its loss is :func:`unimas.algorithms.losses.compose_loss`, the composition every
  backend shares, fed with unimas's advantages (the credit
  path); verl's own advantage estimators are never called;
* the **reference** (only with ``kl_coef > 0``): a forward-only
  ``TrainingWorker`` holding the initial weights;
* the **critic** (only with ``models.<g>.critic``): verl's value-model
  ``TrainingWorker`` beside the actor, whose values give per-token GAE
  advantages inside the update (:mod:`.critic`, docs/critic.md);
* the **rollout**: the class verl's ``get_rollout_class`` returns for the
  group's rollout (``unimas_hf``, see :mod:`.rollout`). It holds its own copy
  of the weights, which change only through a weight sync after each update;
  every sync is checked: the rollout's log-probs on the tokens just trained
  must equal the trainer's (``options.sync_tolerance``). With
  ``options.rollout_server`` or ``workers: ray`` the rollout is served by Ray
  actors (one per rank) reached through verl's server and checkpoint-engine
  managers instead (:mod:`.servers`).

Several groups in one process each build their own FSDP2 module on the same
one-rank process group, so their weights never mix. The groups' verl-side
settings come from :mod:`.options` (one translation module).

Asynchronous pipeline (``algorithm.max_staleness > 0``): the rollout holds its
own weights, so generation (under the rollout lock) runs while the engine
updates (under the training lock); the sync at the end of an update takes both.
Turns sampled by an older weight version train with their advantages scaled by
the truncated importance ratio min(proximal / behaviour probability,
``algorithm.importance_cap``), the proximal log-probs being the engine's
recomputation at the start of the update, as in the torch backend.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import weakref
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar, Optional

import torch

from unimas.config.schema import GenerationConfig
from unimas.errors import UserError
from unimas.groups.base import UPDATE_METRICS, Critique, GenRequest, GenResult, GroupSpec, ModelGroup, TrainTurn
from unimas.groups.hf import sampling
from unimas.groups.hf import source as source_of
from unimas.groups.hf.model_source import MODEL_DIR
from unimas.groups.hf.pretrained import pretrained_model
from unimas.groups.hf.weight_files import refuse_pickled_weights
from unimas.groups.lora import check_target_modules
from unimas.groups.results import bucket_key, is_refused, refused_result
from unimas.groups.verl import checkpoint, critic, lora, patches, prompts, turn_rows
from unimas.groups.verl.options import VerlOptions, translate
from unimas.groups.verl.preflight import group_problems
from unimas.groups.verl.workers import InProcessTrainer

SYNC_PROBE_TURNS, SYNC_PROBE_TOKENS = 4, 4
"""How much a rollout that cannot score given tokens samples to check a sync (prompts, tokens each)."""


class VerlModelGroup(ModelGroup):
    """One model trained by verl's engine; generation from a rollout that only weight syncs update."""

    options: ClassVar[type[VerlOptions]] = VerlOptions
    supports_critic: ClassVar[bool] = True
    """``models.<group>.critic`` works here (``unimas validate`` asks; docs/critic.md)."""

    def __init__(self, spec: GroupSpec, model_dir: str, tokenizer: Any, eos_ids: list[int],
                 max_positions: Optional[int]):
        from verl.workers.rollout.base import get_rollout_class

        from unimas.groups.verl import rollout

        self.spec, self.name, self.trainable = spec, spec.name, spec.config.trainable
        self.tokenizer, self.pad_id, self.eos_ids = tokenizer, tokenizer.pad_token_id, eos_ids
        self.max_positions = max_positions
        self._rollout_lock = threading.RLock()
        self._train_lock = threading.RLock()
        self.configs = translate(spec, model_dir)
        self._closers: list[weakref.finalize] = []
        self.served = spec.options.serves_hf or spec.options.rollout == "vllm"
        self.waits_on_workers = spec.options.workers == "ray"  # its engine and rollout live in Ray actors
        if spec.options.workers == "ray":
            from unimas.groups.verl import worker_config
            from unimas.groups.verl.servers import ServerRollout
            from unimas.groups.verl.workers import RayTrainer

            root = worker_config.compose(spec, model_dir)
            self.trainer = RayTrainer(spec, root, worker_config.role(spec), self.configs.critic)
            self._closers.append(weakref.finalize(self, self.trainer.close))
            self.rollout = ServerRollout(root, self.trainer.workers)
        else:
            self.trainer = InProcessTrainer(spec, self.configs)
            if self.served:
                from unimas.groups.verl.servers import ServerRollout

                self.rollout = ServerRollout.in_process(self.configs, self.trainer.actor)
            else:
                rollout.register()
                rollout_class = get_rollout_class(self.configs.rollout.name, self.configs.rollout.mode)
                self.rollout = rollout_class(config=self.configs.rollout,
                                             model_config=self.configs.actor.model_config)
        if self.served:
            self._closers.append(weakref.finalize(self, self.rollout.close))
        self.critic = (critic.VerlCritic(spec, self.trainer, self.pad_id) if self.configs.critic is not None
                       else None)
        self.weight_version = 0
        self.last_sync_diff: Optional[float] = None
        """Largest |rollout - trainer| log-prob measured after the latest sync (None before any check)."""
        if self.trainable:
            self.sync_weights()
        else:
            self.rollout.weight_version = 0  # a frozen group keeps the weights it was built with

    def close(self) -> None:
        """Stop the group's rollout servers, then its ranks (each at most once; also run at garbage collection)."""
        for closer in reversed(self._closers):
            closer()

    @property
    def actor(self) -> Any:
        """The in-process actor ``TrainingWorker`` (None when frozen or hosted on a Ray worker group)."""
        return getattr(self.trainer, "actor", None)

    @property
    def reference(self) -> Any:
        """The in-process reference ``TrainingWorker`` (None without a KL term or on a Ray worker group)."""
        return getattr(self.trainer, "reference", None)

    @classmethod
    def build(cls, spec: GroupSpec) -> "VerlModelGroup":
        """Load or build the weights, write them as the HF dir verl reads, and start engine and rollout."""
        options = spec.options if isinstance(spec.options, VerlOptions) else VerlOptions.model_validate(spec.options)
        spec.options = options
        problems = group_problems(spec.name, spec.config, options, spec.adapters, gpu_present=patches.on_gpu())
        if problems:
            raise UserError("; ".join(problem for _, problem in problems), where=problems[0][0])
        patches.prepare()
        source = options.source(spec.name)
        if source is None:
            raise UserError(f"{options.init_from} holds verl group checkpoints, none of them named '{spec.name}'",
                            where=f"models.{spec.name}.options.init_from")
        model, tokenizer, _ = source_of.load_model(source, spec.name, spec.seed)
        if spec.config.critic is not None and spec.config.trainable:
            critic.check_model_dir(spec, len(tokenizer))
        if lora.adapter_in_use(spec.config, spec.adapters):
            check_target_modules(model, spec.config.lora, spec.name)  # a UserError naming the field, not peft's
        eos = model.generation_config.eos_token_id
        eos_ids = sorted({tokenizer.eos_token_id, *([eos] if isinstance(eos, int) else list(eos or []))} - {None})
        config = model.config
        max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        model_dir = tempfile.mkdtemp(prefix=f"unimas-verl-{spec.name}-")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        del model
        group = cls(spec, model_dir, tokenizer, eos_ids, max_positions)
        weakref.finalize(group, shutil.rmtree, model_dir, True)
        return group

    @classmethod
    def vocabulary(cls, options: Any) -> Optional[list[str]]:
        options = options if isinstance(options, VerlOptions) else VerlOptions.model_validate(options)
        source = options.source()
        return None if source is None else source_of.vocabulary(source)

    @classmethod
    def has_chat_template(cls, options: Any) -> Optional[bool]:
        options = options if isinstance(options, VerlOptions) else VerlOptions.model_validate(options)
        source = options.source()
        return None if source is None else source_of.has_chat_template(source)

    # ------------------------------------------------------------- weights

    def sync_weights(self) -> None:
        """Send the actor's weights (HF-named full tensors) to the rollout, tagged with the weight version."""
        from unimas.groups.verl.rollout import run_sync

        if self.served:
            with self._rollout_lock:
                self.rollout.sync(self.weight_version)  # verl's checkpoint-engine manager (servers.py)
            return
        weights = (lora.peft_weights(self.actor.engine) if self.configs.actor.model_config.lora_rank
                   else self.actor.engine.get_per_tensor_param()[0])
        with self._rollout_lock:
            run_sync(self.rollout.update_weights(weights, global_steps=self.weight_version))

    def trainer_logprobs(self, turns: list[TrainTurn], reference: bool = False) -> list[list[float]]:
        """Per-token log-probs of the turns' responses under the actor (or reference), at each turn's temperature."""
        rows = turn_rows.layout(turns, self.pad_id, turn_rows.padded_size(len(turns), self.trainer.ranks))
        return [row[: len(t.response_ids)] for row, t in zip(self._logprobs(rows, reference).tolist(), turns)]

    def score(self, turns: list[TrainTurn]) -> list[float]:
        with self._train_lock:
            return [sum(row) for row in self.trainer_logprobs(turns)] if turns else []

    def _logprobs(self, rows: turn_rows.Rows, reference: bool = False) -> Optional[torch.Tensor]:
        # Without a token budget, one forward for the whole batch (verl needs micro-batches that divide it).
        per_rank = rows.size // self.trainer.ranks
        batching = {} if self.spec.options.dynamic_batch_size else {"micro_batch_size_per_gpu": per_rank}
        values = self.trainer.log_probs(rows, reference, **batching)
        return None if values is None else values * rows.tensors["response_mask"].float()

    def _check_sync(self, turns: list[TrainTurn]) -> None:
        """After a sync, the rollout must score the just-trained tokens exactly as the trainer does.

        A rollout that cannot score given tokens (vLLM's servers) is checked on
        tokens it samples instead: its reported log-probs against the trainer's.
        """
        scores = getattr(self.rollout, "can_score", True)
        if not scores:
            turns = self._sampled_probe(turns[:SYNC_PROBE_TURNS])
        trainer = self.trainer_logprobs(turns)
        asked = ([t.prompt_ids for t in turns], [t.response_ids for t in turns], [t.temperature or 1.0 for t in turns])
        if not scores:
            answers = [[list(t.rollout_logprobs) for t in turns]]
        elif hasattr(self.rollout, "logprobs_per_server"):
            answers = self.rollout.logprobs_per_server(*asked)
        else:
            answers = [self.rollout.logprobs(*asked)]
        diff = max((abs(a - b) for served in answers for x, y in zip(trainer, served) for a, b in zip(x, y)),
                   default=0.0)
        self.last_sync_diff = diff
        if diff > self.spec.options.sync_tolerance or self.rollout.weight_version != self.weight_version:
            raise RuntimeError(f"model group '{self.name}': after the weight sync the rollout (version "
                               f"{self.rollout.weight_version}) differs from the trainer (version "
                               f"{self.weight_version}) by {diff:.2e} in log-prob (tolerance "
                               f"{self.spec.options.sync_tolerance:.0e})")

    def _sampled_probe(self, turns: list[TrainTurn]) -> list[TrainTurn]:
        """A few tokens sampled at temperature 1 from the trained prompts, with the rollout's log-probs."""
        gen = GenerationConfig(max_new_tokens=SYNC_PROBE_TOKENS, temperature=1.0, require_eos=False)
        with self._rollout_lock:
            tokens, logprobs = self.rollout.generate([t.prompt_ids for t in turns], gen, False, self.eos_ids,
                                                     self.pad_id)
        return [TrainTurn(list(t.prompt_ids), list(ids), list(lps), 0.0, temperature=1.0)
                for t, ids, lps in zip(turns, tokens, logprobs) if ids]

    # ----------------------------------------------------------- generation

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Sample every request through the rollout; requests sharing settings run as one batch."""
        buckets: dict[tuple, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            if request.adapter not in (None, *self.spec.adapters):  # the rollout holds the group's one adapter
                raise ValueError(f"model group '{self.name}' (verl) has no LoRA adapter '{request.adapter}'")
            buckets[bucket_key(request)].append(i)
        results: list[Optional[GenResult]] = [None] * len(requests)
        fallback = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.eos_ids[0]
        with self._rollout_lock:
            for (_, greedy, _), members in buckets.items():
                gen = requests[members[0]].generation
                rendered = [prompts.render(self.tokenizer, requests[i], self.name, self.max_positions, fallback)
                            for i in members]
                run = [k for k, (p, i) in enumerate(zip(rendered, members)) if not is_refused(p, requests[i])]
                for k, i in enumerate(members):  # placeholders: refused (too long, or not renderable) unless run
                    results[i] = refused_result(rendered[k], self.rollout.weight_version)
                if not run:
                    continue
                ids = [rendered[k].ids for k in run]
                tokens, logprobs = self.rollout.generate(ids, gen, greedy, self.eos_ids, self.pad_id)
                sampled = sampling.to_results(self.tokenizer, [rendered[k] for k in run], tokens, logprobs,
                                              self.eos_ids, exact=sampling.logprobs_are_exact(gen, greedy),
                                              weight_version=self.rollout.weight_version)
                for k, result in zip(run, sampled):
                    results[members[k]] = result
        return results  # type: ignore[return-value]

    # -------------------------------------------------------------- training

    def update(self, turns: list[TrainTurn]) -> dict[str, float]:
        """One PPO/GRPO update through verl's mini-batch loop, then a checked weight sync.

        With a critic, the turns' advantages are first computed per token by GAE from its values, and the
        critic trains; during ``algorithm.critic_warmup`` only the critic does (the policy's update is empty).
        """
        if not self.trainable:
            raise RuntimeError(f"model group '{self.name}' is frozen (trainable: false) and cannot be updated")
        with self._train_lock:
            critic_metrics: dict[str, float] = {}
            if self.critic is not None:  # values, GAE over each role's turns, critic epochs (docs/critic.md)
                warming_up = self.critic.warming_up
                turns, critic_metrics = self.critic.prepare(turns) if turns else ([], self.critic.idle())
                turns = [] if warming_up else turns
            if turns:
                metrics = self._update(turns)
            else:
                metrics = dict.fromkeys(UPDATE_METRICS, 0.0)
                metrics.update(lr=self._lr(), importance_weight=1.0, weight_version=float(self.weight_version))
            return {**metrics, **critic_metrics}

    def critique(self, turns: list[TrainTurn]) -> Critique:
        """As the centralized critic group (``algorithm.central_critic``): values of every role's turns read
        after the episode so far, GAE over each (episode, role), one critic update (docs/critic.md)."""
        if self.critic is None:
            raise RuntimeError(f"model group '{self.name}' has no critic (models.{self.name}.critic)")
        with self._train_lock:
            return self.critic.critique(turns, self.tokenizer, self.max_positions)

    def _lr(self) -> float:
        return self.trainer.learning_rate()

    def _update(self, turns: list[TrainTurn]) -> dict[str, float]:
        start = time.perf_counter()
        algorithm = self.spec.algorithm
        ranks = self.trainer.ranks  # every mini-batch is split evenly over the ranks
        mini = turn_rows.padded_size(min(algorithm.mini_batch_size or len(turns), len(turns)), ranks)
        rows = turn_rows.layout(turns, self.pad_id, turn_rows.padded_size(len(turns), mini))
        old = self._logprobs(rows)
        stale = [t.weight_version is not None and t.weight_version < self.weight_version for t in turns]
        exact = [t.rollout_logprobs_exact and len(t.rollout_logprobs) == len(t.response_ids) and not late
                 for t, late in zip(turns, stale)]
        sampled = turn_rows.response_rows([t.rollout_logprobs if ok else [] for t, ok in zip(turns, exact)], rows)
        known = turn_rows.response_rows([[1.0] * len(t.response_ids) if ok else [] for t, ok in zip(turns, exact)],
                                        rows)
        mismatch = float(((old - sampled).abs() * known).max()) if any(exact) else 0.0
        importance = self._reweight_stale(rows, old, turns, stale)
        extra = {"old_log_probs": old, **turn_rows.role_coefficients(turns, rows, self.spec.role_objectives, algorithm)}
        if self.configs.reference is not None:
            extra["ref_log_prob"] = self._logprobs(rows, reference=True)
        lr = self._lr()
        if self.served and self.spec.algorithm.max_staleness == 0:
            with self._rollout_lock:
                self.rollout.sleep()  # vLLM frees its memory for the update; the sync below wakes it
        verl_metrics = self.trainer.train(
            rows, extra, calculate_entropy=True, compute_loss=True, global_batch_size=rows.size,
            mini_batch_size=mini, epochs=algorithm.ppo_epochs, seed=self.spec.seed + self.weight_version,
            dataloader_kwargs={"shuffle": mini < rows.size}, micro_batch_size_per_gpu=mini // ranks,
            use_dynamic_bsz=False)
        self.weight_version += 1
        self.sync_weights()
        self._check_sync(turns)
        grad_norm = verl_metrics.get("grad_norm", 0.0)
        finite = bool(torch.isfinite(torch.tensor(grad_norm)))
        metrics = {key: verl_metrics.get(key, 0.0) for key in ("policy_loss", "entropy", "kl", "clip_frac", "ppo_kl")}
        metrics.update(grad_norm=grad_norm if finite else 0.0, nonfinite_skipped=0.0 if finite else 1.0,
                       rollout_logprob_diff=mismatch, lr=lr, tokens=float(sum(len(t.response_ids) for t in turns)),
                       update_time_s=time.perf_counter() - start, stale_turns=float(sum(stale)),
                       importance_weight=importance, weight_version=float(self.weight_version))
        return metrics

    def _reweight_stale(self, rows: turn_rows.Rows, old: torch.Tensor, turns: list[TrainTurn],
                        stale: list[bool]) -> float:
        """Scale stale turns' advantages by the truncated importance ratio; its mean over their tokens (1 if none)."""
        behaviour = [t.rollout_logprobs if late and len(t.rollout_logprobs) == len(t.response_ids) else []
                     for t, late in zip(turns, stale)]
        mask = turn_rows.response_rows([[1.0] * len(b) for b in behaviour], rows)
        if not mask.any():
            return 1.0
        ratio = (old - turn_rows.response_rows(behaviour, rows)).exp().clamp(max=self.spec.algorithm.importance_cap)
        ratio = torch.where(mask > 0, ratio, torch.ones_like(ratio))
        rows.tensors["advantages"] = rows.tensors["advantages"] * ratio
        return float((ratio * mask).sum() / mask.sum())

    # ----------------------------------------------------------- checkpoints

    def save(self, directory: Path) -> None:
        """``verl_actor/`` (each rank's engine state and the ``huggingface/`` export), ``verl_critic/`` with a
        critic, the rollout RNG and the weight version: the layout of :mod:`.checkpoint`, nothing pickled."""
        directory = Path(directory)
        with self._train_lock, self._rollout_lock:
            directory.mkdir(parents=True, exist_ok=True)
            if self.trainable:
                self.trainer.save(directory / checkpoint.ACTOR_DIR)
            if self.critic is not None:
                self.trainer.save_critic(directory / checkpoint.CRITIC_DIR)
            state = checkpoint.GroupState(backend="verl", weight_version=self.weight_version,
                                          world_size=self.trainer.ranks,
                                          critic_updates=0 if self.critic is None else self.critic.updates)
            checkpoint.save_group_state(directory, state, self.rollout.generator)

    def save_weights(self, directory: Path) -> None:
        """``model/``: the actor's full weights, config and tokenizer as a Hugging Face model (every rank
        gathers, rank 0 writes), what a frozen snapshot group of either backend plays."""
        if not self.trainable or lora.adapter_in_use(self.spec.config, self.spec.adapters):
            raise UserError(f"model group '{self.name}' saves weights only when it trains its full weights (a "
                            "frozen verl group keeps none in a trainer; a LoRA group's export is in peft names)",
                            where=f"models.{self.name}")
        with self._train_lock:
            self.trainer.export_weights(Path(directory) / MODEL_DIR)

    def load_weights(self, directory: Path) -> None:
        """Play a saved policy's weights (``model/``, either backend's): sent to the rollout as a weight sync
        is, the group's weight version kept. Only the in-process ``hf`` rollout takes them: vLLM servers and
        Ray-hosted ranks get weights from the group's own trainer, which a frozen group does not have."""
        from unimas.groups.verl.rollout import run_sync

        if self.served or self.waits_on_workers:
            raise UserError(f"model group '{self.name}' plays saved weights only with the in-process hf rollout "
                            "(options.rollout: hf, options.workers: in_process)", where=f"models.{self.name}.options")
        model_dir = Path(directory) / MODEL_DIR
        refuse_pickled_weights(model_dir)  # pretrained_model reads safetensors only, checked
        saved = pretrained_model(model_dir, torch.float32)
        with self._rollout_lock:
            run_sync(self.rollout.update_weights(saved.named_parameters(), global_steps=self.weight_version))

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote and sync the rollout, so generation continues bit-identically.

        A file that does not load (missing, damaged, a pickle) is a :class:`UserError` naming it, which a
        resume answers by falling back to the previous checkpoint."""
        directory = Path(directory)
        with self._train_lock, self._rollout_lock:
            state = checkpoint.load_group_state(directory)
            if state.world_size != self.trainer.ranks:
                raise UserError(f"the checkpoint was saved by {state.world_size} ranks and model group "
                                f"'{self.name}' has {self.trainer.ranks}; resume with the same "
                                "options.world_size", where=str(directory / checkpoint.STATE_FILE))
            if self.critic is not None and not (directory / checkpoint.CRITIC_DIR).is_dir():
                raise UserError(f"has no critic ({checkpoint.CRITIC_DIR}/): the checkpoint was written by a run "
                                f"without models.{self.name}.critic", where=str(directory))
            if self.trainable:
                self.trainer.load(directory / checkpoint.ACTOR_DIR)
            if self.critic is not None:
                self.trainer.load_critic(directory / checkpoint.CRITIC_DIR)
                self.critic.updates = state.critic_updates
            checkpoint.load_rollout_rng(directory, self.rollout.generator)
            self.weight_version = state.weight_version
            if self.trainable:
                self.sync_weights()
