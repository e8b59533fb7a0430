"""An in-process PyTorch model group: the reference backend.

One :class:`TorchModelGroup` owns one causal LM (a local Hugging Face
directory, a tiny random-init model, or a checkpoint) and, optionally, one
LoRA adapter per role. It is small enough to read and exact enough that the
log-probs it reports at sampling time equal the ones it recomputes for the
update (the PPO ratio starts at exactly 1 when on-policy).

This module builds the group and ties the parts together; each part lives
beside it: the batch layout (``layout``), sampling (``sampling``), log-probs
and the update loop (``training``), optimiser and learning-rate schedule
(``optimizer``), checkpoints (``checkpoint``), settings (``options``),
where weights and tokenizer come from (``source``).

Weight versions. ``weight_version`` counts this group's updates; every
result says which version sampled it. Sampling runs in one engine
(:mod:`unimas.groups.torch.sampler`, ``options.sampler``): in place, under
the update lock (the synchronous loop); a copy of the weights in this
process; or a copy in a child process. After each update the group
publishes its weights and the new version to the engine; results carry the
version the engine reports it sampled with.

Randomness. Sampling and mini-batch shuffling draw from one
``torch.Generator`` owned by the group and saved with it, so a run resumed
from a checkpoint continues bit-identically. (LoRA dropout, if configured,
draws from the global torch RNG, which the trainer seeds.)
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections import defaultdict
from pathlib import Path
from typing import ClassVar, Iterator, Optional, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from unimas.config.schema import GenerationConfig, LoraConfig
from unimas.errors import UserError
from unimas.groups.base import Critique, GenRequest, GenResult, GroupSpec, ModelGroup, TrainTurn
from unimas.groups.torch import chat, checkpoint, optimizer, sampling, training
from unimas.groups.torch import critic as critic_lib
from unimas.groups.torch import source as source_of
from unimas.groups.torch.chars import check_known
from unimas.groups.torch.options import TorchOptions
from unimas.groups.torch.sampler import build_sampler
from unimas.groups.torch.training import SupervisedExample

log = logging.getLogger(__name__)


class TorchModelGroup(ModelGroup):
    """One causal LM (plus optional LoRA adapters) in this process."""

    options: ClassVar[type[TorchOptions]] = TorchOptions
    supports_critic: ClassVar[bool] = True
    """``models.<group>.critic`` works here (``unimas validate`` asks; docs/critic.md)."""

    def __init__(self, spec: GroupSpec, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 device: torch.device):
        adapters = list(dict.fromkeys(spec.adapters))
        config = spec.config
        if adapters and config.lora is None:
            raise ValueError(f"model group '{spec.name}': roles use adapters {adapters} but the group has no "
                             "'lora' section")
        self.spec = spec
        self.name = spec.name
        self.config = config
        self.trainable = config.trainable
        self.tokenizer = tokenizer
        self.plain_prompt_ids = chat.PlainPromptIds(tokenizer)
        self.pad_id: int = tokenizer.pad_token_id
        self.unk_id: Optional[int] = tokenizer.unk_token_id  # read per prompt: the tokenizer property is slow
        self.device = device
        self.adapters = adapters
        self.critic = (critic_lib.Critic(spec, model, len(tokenizer), device)  # copied before any LoRA wrapping
                       if config.critic is not None and config.trainable else None)
        self.model = self._wrap_lora(model, spec.seed).to(device).eval()
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(spec.seed)
        self.train_params = self._mark_trainable()
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.scheduler: Optional[torch.optim.lr_scheduler.LambdaLR] = None
        self._reference: Optional[torch.nn.Module] = None
        self._lock = threading.RLock()
        self.weight_version = 0
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted({tokenizer.eos_token_id, *eos} - {None})
        if not self.eos_ids:
            raise ValueError(f"model group '{self.name}': the tokenizer has no EOS token")
        self.logit_bias = self._special_token_bias()
        cfg = model.config
        self.max_positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        kind = spec.options.sampler_kind(spec.algorithm.max_staleness)
        self.sampler = build_sampler(kind, spec, self, self.generator, self._lock, self.weight_version)

    @classmethod
    def build(cls, spec: GroupSpec) -> "TorchModelGroup":
        """Build from a local HF dir (``path``), a tiny spec (``tiny``) or a checkpoint (``init_from``)."""
        options = spec.options if isinstance(spec.options, TorchOptions) else TorchOptions.model_validate(spec.options)
        spec.options = options
        use_gpu = spec.config.resources.gpus > 0 and torch.cuda.is_available()
        model, tokenizer, source = source_of.load_model(options, spec.name, spec.seed)
        group = cls(spec, model, tokenizer, torch.device("cuda" if use_gpu else "cpu"))
        if source is not None:
            checkpoint.load_adapters(group, source, missing_ok=True)
            if not group.adapters and (source / checkpoint.ADAPTER_DIR).exists():
                log.warning("model group '%s': ignoring the LoRA adapters in %s (no 'lora' section)", spec.name, source)
            if group.critic is not None and critic_lib.Critic.saved_in(source / checkpoint.CRITIC_DIR):
                group.critic.load_weights(source / checkpoint.CRITIC_DIR)  # a warm critic; fresh optimiser
            elif group.critic is not None:
                log.info("model group '%s': %s has no critic; the critic starts afresh", spec.name, source)
        return group

    # ----------------------------------------------------------------- setup

    def _wrap_lora(self, model: PreTrainedModel, seed: int) -> torch.nn.Module:
        """Add one LoRA adapter per name; their random init is seeded and leaves the global RNG alone."""
        if not self.adapters:
            return model
        from peft import LoraConfig, get_peft_model

        lora = self.config.lora
        _check_target_modules(model, lora, self.name)

        def peft_config() -> LoraConfig:
            return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                              target_modules=list(lora.target_modules), task_type="CAUSAL_LM")

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = get_peft_model(model, peft_config(), adapter_name=self.adapters[0])
            for adapter in self.adapters[1:]:
                model.add_adapter(adapter, peft_config())
        return model

    def _mark_trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimiser owns: adapters (+ base if train_base), all, or none."""
        train_base = self.config.lora is None or self.config.lora.train_base
        params = [p for key, p in self.model.named_parameters() if self.trainable and ("lora_" in key or train_base)]
        for p in self.model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        return params

    def _special_token_bias(self) -> torch.Tensor:
        """-1e9 on ids a response must never contain: pad/bos/unk (unless EOS) and ids past the tokenizer.

        Applied to the logits in sampling and in training alike, so log-probs
        stay consistent; finite so that entropies stay finite (0 * -1e9 = 0).
        """
        size = self.base_model().get_output_embeddings().weight.shape[0]
        banned = {self.tokenizer.pad_token_id, self.tokenizer.bos_token_id, self.tokenizer.unk_token_id}
        bias = torch.zeros(size)
        bias[sorted(banned - set(self.eos_ids) - {None})] = -1e9
        bias[len(self.tokenizer):] = -1e9
        return bias.to(self.device)

    def base_model(self) -> PreTrainedModel:
        """The plain transformers model under any PEFT wrapper."""
        return self.model.get_base_model() if self.adapters else self.model

    @property
    def has_reference_copy(self) -> bool:
        return self._reference is not None

    def reference_model(self) -> torch.nn.Module:
        """The frozen copy of the weights the KL term compares against, made on first use."""
        if self._reference is None:
            self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        return self._reference

    @contextlib.contextmanager
    def route(self, model: torch.nn.Module, adapter: Optional[str]) -> Iterator[None]:
        """Route forwards of ``model`` (this group's or its reference copy) through ``adapter``.

        None means the base model with adapters off.
        """
        if adapter is not None and adapter not in self.adapters:
            raise ValueError(f"model group '{self.name}' has no adapter '{adapter}' (it has: {self.adapters})")
        if not self.adapters:
            yield
        elif adapter is None:
            with model.disable_adapter():
                yield
        else:
            if model.active_adapter != adapter:
                # peft would toggle requires_grad per adapter; every trainable adapter stays trainable here.
                model.set_adapter(adapter, inference_mode=True)
                if model is self.model:
                    for p in self.train_params:
                        p.requires_grad_(True)
            yield

    def optimizer_for_update(self) -> torch.optim.Optimizer:
        """The AdamW optimiser (and its learning-rate schedule), made on first use."""
        if not self.trainable:
            raise RuntimeError(f"model group '{self.name}' is frozen (trainable: false) and cannot be updated")
        if not self.train_params:
            raise RuntimeError(
                f"model group '{self.name}' has no trainable parameters (lora without adapters and train_base off)")
        if self.optimizer is None:
            self.optimizer = optimizer.build_optimizer(self.train_params, self.config.optim)
            self.scheduler = optimizer.build_scheduler(self.optimizer, self.config.optim, self.spec.total_updates)
        return self.optimizer

    # ------------------------------------------------------------ generation

    def fit_prompts(self, texts: Sequence[str], reserve: int) -> list[list[int]]:
        """Token ids of plain prompts (tokenised once per distinct text), each fitted by :meth:`_fit_prompt`."""
        encoded = self.plain_prompt_ids(texts)
        return [self._fit_prompt(text, ids, reserve) for text, ids in zip(texts, encoded)]

    def render_prompts(self, requests: Sequence[GenRequest], reserve: int) -> list[chat.RenderedPrompt]:
        """Each request's prompt ids: plain prompts batched, chat and continued conversations one by one.

        A prompt too long for the context is cut from the left (``truncated``)
        or, when its request does not allow that, left uncut for the caller to refuse.
        A request whose messages make the chat template or the tokenizer fail
        gets a prompt with ``error`` set; the others are rendered as usual.
        """
        templated = chat.has_chat_template(self.tokenizer)
        uses_chat = [bool(r.messages) and r.use_chat_template and templated for r in requests]
        plain = [i for i, r in enumerate(requests) if r.continuation is None and not uses_chat[i]]
        prompts: list[Optional[chat.RenderedPrompt]] = [None] * len(requests)
        if plain:
            try:
                for i, ids in zip(plain, self.plain_prompt_ids([requests[i].prompt for i in plain])):
                    prompts[i] = chat.RenderedPrompt(ids, "", continued=False)
            except Exception:  # noqa: BLE001 - an odd text in the batch: the loop below tokenises them one by one
                pass
        for i, request in enumerate(requests):
            try:
                prompts[i] = prompts[i] or self._render_one(request, uses_chat[i])
                if request.response_prefix:  # forced answer opening: prompt-side context, never trained as sampled
                    prompt = prompts[i]
                    prompt.forced_ids = self.tokenizer(request.response_prefix, add_special_tokens=False)["input_ids"]
                    prompt.ids = prompt.ids + prompt.forced_ids
                    prompt.text = (prompt.text or request.prompt) + request.response_prefix
            except Exception as exc:  # noqa: BLE001 - this request's messages are at fault, not the group
                prompts[i] = chat.failed_prompt(self.name, exc)
        limit = None if self.max_positions is None else self.max_positions - reserve
        for prompt, request in zip(prompts, requests):
            if prompt.error:
                continue
            prompt.truncated = limit is not None and len(prompt.ids) > limit
            prompt.ids = self._fit_prompt(prompt.text or request.prompt, prompt.ids, reserve,
                                          cut=request.allow_truncation)
        return prompts  # type: ignore[return-value]

    def _render_one(self, request: GenRequest, uses_chat: bool) -> chat.RenderedPrompt:
        """One request's prompt: its plain text, its messages through the chat template, or joined."""
        if request.continuation is None and not uses_chat:
            return chat.RenderedPrompt(self.plain_prompt_ids([request.prompt])[0], "", continued=False)
        if uses_chat:
            return chat.render_chat(self.tokenizer, request.messages or [], request.continuation, tools=request.tools)
        return chat.render_plain(self.tokenizer, request.messages or [], request.continuation)

    def _fit_prompt(self, text: str, ids: list[int], reserve: int, cut: bool = True) -> list[int]:
        """Check the characters and cut the prompt from the left so that ``reserve`` more tokens fit."""
        try:
            if self.unk_id is not None and self.unk_id in ids:
                check_known(self.tokenizer, text, ids)
        except ValueError as exc:
            raise UserError(f"{exc}; add them to models.{self.name}.options.tiny.alphabet (a tiny model) or change "
                            "the role's system, template or task data", where=f"model group '{self.name}'") from None
        if not ids:
            ids = [self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.eos_ids[0]]
        if self.max_positions is None:
            return ids
        limit = self.max_positions - reserve
        if limit < 1:
            raise UserError(f"{reserve} new tokens do not fit ({self.max_positions} positions); lower the role's "
                            "generation.max_new_tokens", where=f"model group '{self.name}'")
        if len(ids) > limit and cut:
            log.warning("model group '%s': prompt of %d tokens cut to its last %d", self.name, len(ids), limit)
            ids = ids[-limit:]
        return ids

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Sample every request; requests sharing (adapter, settings) run as one batch."""
        buckets: dict[tuple, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            gen = req.generation
            greedy = req.greedy or gen.temperature == 0
            sampling_key = () if greedy else (gen.temperature, gen.top_k, gen.top_p)
            buckets[(req.adapter, gen.max_new_tokens, greedy, sampling_key)].append(i)
        results: list[Optional[GenResult]] = [None] * len(requests)
        with self.sampler.lock, torch.inference_mode():
            for (adapter, _, greedy, _), rows in buckets.items():
                first = requests[rows[0]]
                outs = self._generate_batch([requests[i] for i in rows], first.generation, greedy, adapter)
                for i, out in zip(rows, outs):
                    results[i] = out
        return results

    def _publish(self) -> dict[str, float]:
        """Hand the current weights and version to the sampler (its timing metrics, if any)."""
        return self.sampler.publish(self, self.weight_version)

    def _generate_batch(self, requests: list[GenRequest], gen: GenerationConfig, greedy: bool,
                        adapter: Optional[str]) -> list[GenResult]:
        """Sample the requests whose prompts fit; a prompt too long and not allowed to be cut gets no response,
        nor does one that could not be rendered (its result carries the ``error``)."""
        prompts = self.render_prompts(requests, gen.max_new_tokens)
        results: list[Optional[GenResult]] = [None] * len(requests)
        for i, prompt in enumerate(prompts):
            if prompt.error or (prompt.truncated and not requests[i].allow_truncation):
                results[i] = GenResult(text="", prompt_ids=prompt.ids, response_ids=[], logprobs=[], finished=False,
                                       prompt_text=prompt.text, truncated=prompt.truncated, error=prompt.error or None,
                                       weight_version=self.sampler.version)
        run = [i for i, result in enumerate(results) if result is None]
        if run:
            stops = sampling.StopStrings(self.tokenizer, [requests[i].stop for i in run])
            listeners = sampling.listeners(self.tokenizer, [requests[i] for i in run])
            rows = self.sampler.sample([prompts[i].ids for i in run], gen, greedy, adapter, stops, listeners)
            sampled = sampling.to_results(self.tokenizer, [prompts[i] for i in run], rows.tokens, rows.logprobs,
                                          self.eos_ids, exact=sampling.logprobs_are_exact(gen, greedy),
                                          weight_version=rows.version, stops=stops,
                                          controls=("stop", "response_prefix"))
            for i, result in zip(run, sampled):
                if requests[i].token_texts:
                    result.token_texts = [self.tokenizer.decode([t]) for t in result.response_ids]
                results[i] = result
        return results  # type: ignore[return-value]

    # -------------------------------------------------------------- training

    def response_logprobs(self, model: torch.nn.Module, turns: Sequence[TrainTurn],
                          adapters: Sequence[Optional[str]],
                          entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(log-probs, entropies, mask) of the turns' responses; see :func:`training.compute_logprobs`."""
        return training.compute_logprobs(self, model, turns, adapters, entropy)

    def reference_logprobs(self, turns: Sequence[TrainTurn]) -> torch.Tensor:
        """Log-probs under the frozen KL reference; see :func:`training.compute_reference_logprobs`."""
        return training.compute_reference_logprobs(self, turns)

    def score(self, turns: list[TrainTurn]) -> list[float]:
        with self._lock:
            return training.score_turns(self, turns)

    def update(self, turns: list[TrainTurn]) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches with ``spec.algorithm``; then one learning-rate schedule step.

        ``lr`` in the metrics is the rate this update used. With a critic, the turns' advantages are first
        computed per token by GAE from its values, and the critic trains; during ``algorithm.critic_warmup``
        only the critic does (the policy's update is empty).
        """
        with self._lock:
            opt = self.optimizer_for_update()
            lr = optimizer.current_lr(opt)
            critic_metrics: dict[str, float] = {}
            if self.critic is not None:  # values, GAE over each role's turns, critic epochs (docs/critic.md)
                warming_up = self.critic.warming_up
                turns, critic_metrics = self.critic.prepare(self, turns) if turns else ([], self.critic.idle())
                turns = [] if warming_up else turns
            metrics = training.ppo_update(self, turns, opt) if turns else dict.fromkeys(training.UPDATE_METRICS, 0.0)
            metrics.update(critic_metrics)
            metrics["lr"] = lr
            optimizer.advance(self.scheduler)
            self.weight_version += 1
            metrics.update(self._publish())
            metrics["weight_version"] = float(self.weight_version)
            return metrics

    def critique(self, turns: list[TrainTurn]) -> Critique:
        """As the centralized critic group (``algorithm.central_critic``): values of every role's turns read
        after the episode so far, GAE over each (episode, role), one critic update (docs/critic.md)."""
        if self.critic is None:
            raise RuntimeError(f"model group '{self.name}' has no critic (models.{self.name}.critic)")
        with self._lock:
            return self.critic.critique(self, turns)

    def train_supervised(self, examples: list[SupervisedExample]) -> float:
        """One AdamW step on the token-mean cross-entropy of responses (+EOS) given prompts.

        A torch-only warm start (``examples/arith_warm_start.py``); it does not
        advance the learning-rate schedule, which counts RL updates.
        """
        if not examples:
            raise ValueError("train_supervised needs at least one example")
        with self._lock:
            opt = self.optimizer_for_update()
            loss = training.supervised_step(self, training.supervised_turns(self, examples), opt)
            self._publish()
            return loss

    def num_parameters(self) -> dict[str, int]:
        """Total and trainable parameter counts (``benchmarks/sharing.py`` reports them)."""
        return {"total": sum(p.numel() for p in self.model.parameters()),
                "trainable": sum(p.numel() for p in self.train_params)}

    # ----------------------------------------------------------- checkpoints

    def save(self, directory: Path) -> None:
        """``model/``, ``adapters/<name>/``, ``reference/``, optimiser, schedule and RNG state."""
        with self._lock:
            checkpoint.save_group(self, Path(directory))
            self.sampler.save_rng(Path(directory))

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote, in place (resume bit-identically)."""
        directory = Path(directory)
        with self._lock:
            checkpoint.load_group(self, directory)
            self._publish()
            if (directory / checkpoint.RNG_FILE).exists():  # a resume, not a weights-only snapshot
                self.sampler.load_rng(directory)

    def close(self) -> None:
        """Stop the sampler's process or server, if it has one."""
        self.sampler.close()


def _check_target_modules(model: torch.nn.Module, lora: LoraConfig, group: str) -> None:
    """Every LoRA target names a module of the model (peft matches a name or a dotted suffix)."""
    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in lora.target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        leaves = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                         if name and next(module.children(), None) is None})
        raise UserError(f"{', '.join(repr(t) for t in missing)} is not a module of model group '{group}'; modules "
                        f"it has: {', '.join(leaves[:20])}", where=f"models.{group}.lora.target_modules")
