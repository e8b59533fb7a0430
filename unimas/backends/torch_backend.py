"""An in-process PyTorch model group: sampling, PPO/GRPO updates, checkpoints.

One :class:`TorchModelGroup` owns one causal LM (a local Hugging Face
directory or a tiny random-init model) and, optionally, one LoRA adapter per
role. It is the reference backend: small enough to read, exact enough that
the log-probs it reports at sampling time equal the ones it recomputes for
the update (the PPO ratio starts at exactly 1 when on-policy).

Layout. Every batch, for sampling and training alike, is laid out as
``[left-padded prompt | right-padded response]`` with explicit
``position_ids = cumsum(attention_mask) - 1``: absolute-position models
(GPT-2) are wrong by nats per token without them, and the same layout in both
paths keeps the two sets of log-probs numerically equal.

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
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from unimas import verl_compat
from unimas.backends.base import GenRequest, GenResult, ModelGroup, SupervisedExample, TrainTurn
from unimas.backends.chars import build_char_tokenizer, check_known
from unimas.backends.tiny import build_tiny_model
from unimas.config import AlgorithmConfig, GenerationConfig, ModelGroupConfig

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODEL_DIR, ADAPTER_DIR, REFERENCE_DIR = "model", "adapters", "reference"
OPTIMIZER_FILE, RNG_FILE = "optimizer.pt", "rng.pt"
UPDATE_METRICS = ("policy_loss", "entropy", "kl", "clip_frac", "ppo_kl", "grad_norm", "tokens", "update_time_s")


@dataclass
class _Batch:
    """Sequences as ``[left-padded prompt | right-padded response]``; ``R = response.shape[1]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response: torch.Tensor
    response_mask: torch.Tensor


def _layout(prompts: Sequence[list[int]], responses: Sequence[list[int]], pad: int, device) -> _Batch:
    """Build the padded batch from Python lists in one tensor call (row-wise tensor writes are slow)."""
    width_p = max(len(p) for p in prompts)
    width_r = max(len(r) for r in responses)
    rows, masks = [], []
    for prompt, response in zip(prompts, responses):
        left, right = width_p - len(prompt), width_r - len(response)
        rows.append([pad] * left + list(prompt) + list(response) + [pad] * right)
        masks.append([0] * left + [1] * (len(prompt) + len(response)) + [0] * right)
    ids = torch.tensor(rows, dtype=torch.long)
    mask = torch.tensor(masks, dtype=torch.long)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    return _Batch(ids, mask, positions, ids[:, width_p:], mask[:, width_p:].float())


def _pad_rows(rows: Sequence[Sequence[float]], width: int, device) -> torch.Tensor:
    padded = [list(row) + [0.0] * (width - len(row)) for row in rows]
    return torch.tensor(padded, dtype=torch.float32).to(device)


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to -inf (the best token always survives)."""
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop_sorted = probs.cumsum(-1) - probs > top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _clean_base_name(key: str) -> Optional[str]:
    """A PEFT-wrapped base-model key as the plain model names it; None for LoRA weights."""
    if "lora_" in key:
        return None
    return key.replace(".base_layer.", ".")


def _group_dir(root: Path, name: str) -> tuple[Path, Path]:
    """(group checkpoint dir, HF model dir) for ``init_from``.

    Accepts a dir written by :meth:`TorchModelGroup.save`, a run checkpoint
    holding one such dir per group name, or a plain Hugging Face model dir.
    """
    for group in (root / name, root):
        if (group / MODEL_DIR / "config.json").exists():
            return group, group / MODEL_DIR
    if (root / "config.json").exists():
        return root, root
    raise FileNotFoundError(f"init_from {root}: no '{MODEL_DIR}/config.json' (a unimas checkpoint) or config.json")


class TorchModelGroup(ModelGroup):
    """One causal LM (plus optional LoRA adapters) in this process."""

    def __init__(
        self,
        name: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: ModelGroupConfig,
        adapters: Sequence[str],
        seed: int,
        device: torch.device,
    ):
        adapters = list(dict.fromkeys(adapters))
        if adapters and config.lora is None:
            raise ValueError(f"model group '{name}': roles use adapters {adapters} but the group has no 'lora' section")
        self.name = name
        self.config = config
        self.trainable = config.trainable
        self.tokenizer = tokenizer
        self.device = device
        self.adapters = adapters
        self.model = self._wrap_lora(model, seed).to(device).eval()
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.truncated_prompts = 0
        self._train_params = self._mark_trainable()
        self._optimizer: Optional[torch.optim.Optimizer] = None
        self._reference: Optional[torch.nn.Module] = None
        self._lock = threading.RLock()
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self._eos_ids = sorted({tokenizer.eos_token_id, *eos} - {None})
        if not self._eos_ids:
            raise ValueError(f"model group '{name}': the tokenizer has no EOS token")
        self._logit_bias = self._special_token_bias()
        cfg = model.config
        self.max_positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    @classmethod
    def from_config(cls, name: str, config: ModelGroupConfig, adapters: list[str], seed: int) -> "TorchModelGroup":
        """Build from a local HF dir (``path``), a tiny spec (``tiny``) or a checkpoint (``init_from``)."""
        use_gpu = config.resources.gpus > 0 and torch.cuda.is_available()
        device = torch.device("cuda" if use_gpu else "cpu")
        dtype = DTYPES[config.dtype]
        source = _group_dir(Path(config.init_from), name) if config.init_from else None
        if source or config.path:
            path = source[1] if source else config.path
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, padding_side="left")
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
        elif config.tiny is not None:
            tokenizer = build_char_tokenizer(config.tiny.alphabet)
            model = build_tiny_model(config.tiny, tokenizer, seed).to(dtype)
        else:
            raise ValueError(f"model group '{name}': the torch backend needs 'path', 'tiny' or 'init_from'")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        group = cls(name, model, tokenizer, config, adapters, seed, device)
        if source:
            group._load_adapters(source[0], missing_ok=True)
            if not group.adapters and (source[0] / ADAPTER_DIR).exists():
                log.warning("model group '%s': ignoring the LoRA adapters in %s (no 'lora' section)", name, source[0])
        return group

    # ----------------------------------------------------------------- setup

    @property
    def _is_peft(self) -> bool:
        return bool(self.adapters)

    def _wrap_lora(self, model: PreTrainedModel, seed: int) -> torch.nn.Module:
        """Add one LoRA adapter per name; their random init is seeded and leaves the global RNG alone."""
        if not self.adapters:
            return model
        from peft import LoraConfig, get_peft_model

        lora = self.config.lora

        def peft_config() -> LoraConfig:
            return LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            )

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = get_peft_model(model, peft_config(), adapter_name=self.adapters[0])
            for adapter in self.adapters[1:]:
                model.add_adapter(adapter, peft_config())
        return model

    def _mark_trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimiser owns: adapters (+ base if train_base), all, or none."""
        train_base = self.config.lora is None or self.config.lora.train_base
        params = [
            p
            for key, p in self.model.named_parameters()
            if self.trainable and ("lora_" in key or train_base)
        ]
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
        size = self._base_model().get_output_embeddings().weight.shape[0]
        banned = {self.tokenizer.pad_token_id, self.tokenizer.bos_token_id, self.tokenizer.unk_token_id}
        bias = torch.zeros(size)
        bias[sorted(banned - set(self._eos_ids) - {None})] = -1e9
        bias[len(self.tokenizer) :] = -1e9
        return bias.to(self.device)

    @contextlib.contextmanager
    def _route(self, model: torch.nn.Module, adapter: Optional[str]) -> Iterator[None]:
        """Route forwards of ``model`` (this group's or its reference copy) through ``adapter``.

        None means the base model with adapters off.
        """
        if adapter is not None and adapter not in self.adapters:
            raise ValueError(f"model group '{self.name}' has no adapter '{adapter}' (it has: {self.adapters})")
        if not self._is_peft:
            yield
        elif adapter is None:
            with model.disable_adapter():
                yield
        else:
            if model.active_adapter != adapter:
                # peft would toggle requires_grad per adapter; every trainable adapter stays trainable here.
                model.set_adapter(adapter, inference_mode=True)
                if model is self.model:
                    for p in self._train_params:
                        p.requires_grad_(True)
            yield

    def _optimizer_for_update(self) -> torch.optim.Optimizer:
        if not self.trainable:
            raise RuntimeError(f"model group '{self.name}' is frozen (trainable: false) and cannot be updated")
        if not self._train_params:
            raise RuntimeError(
                f"model group '{self.name}' has no trainable parameters (lora without adapters and train_base off)"
            )
        if self._optimizer is None:
            optim = self.config.optim
            self._optimizer = torch.optim.AdamW(
                self._train_params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
            )
        return self._optimizer

    # ------------------------------------------------------------ generation

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        check_known(self.tokenizer, text, ids)
        return ids

    def _prompt_ids(self, text: str, reserve: int) -> list[int]:
        return self._prompt_ids_batch([text], reserve)[0]

    def _prompt_ids_batch(self, texts: Sequence[str], reserve: int) -> list[list[int]]:
        """Token ids of prompts (one tokenizer call for the batch), each fitted by :meth:`_fit_prompt`."""
        encoded = self.tokenizer(list(texts), add_special_tokens=True)["input_ids"]
        return [self._fit_prompt(text, ids, reserve) for text, ids in zip(texts, encoded)]

    def _fit_prompt(self, text: str, ids: list[int], reserve: int) -> list[int]:
        """Check the characters and cut the prompt from the left so that ``reserve`` more tokens fit."""
        check_known(self.tokenizer, text, ids)
        if not ids:
            ids = [self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self._eos_ids[0]]
        if self.max_positions is None:
            return ids
        limit = self.max_positions - reserve
        if limit < 1:
            raise ValueError(
                f"{reserve} new tokens do not fit model group '{self.name}' ({self.max_positions} positions)"
            )
        if len(ids) > limit:
            self.truncated_prompts += 1
            log.warning("model group '%s': prompt of %d tokens cut to its last %d", self.name, len(ids), limit)
            ids = ids[-limit:]
        return ids

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Sample every request; requests sharing (adapter, settings) run as one batch."""
        buckets: dict[tuple, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            gen = req.generation
            greedy = req.greedy or gen.temperature == 0
            sampling = () if greedy else (gen.temperature, gen.top_k, gen.top_p)
            buckets[(req.adapter, gen.max_new_tokens, greedy, sampling)].append(i)
        results: list[Optional[GenResult]] = [None] * len(requests)
        with self._lock, torch.inference_mode():
            self.model.eval()
            for (adapter, _, greedy, _), rows in buckets.items():
                first = requests[rows[0]]
                outs = self._generate_batch([requests[i].prompt for i in rows], first.generation, greedy, adapter)
                for i, out in zip(rows, outs):
                    results[i] = out
        return results

    def _pick(self, logits: torch.Tensor, gen: GenerationConfig, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens and their log-probs under softmax(logits / T) (T = 1 when greedy)."""
        if greedy:
            logp = logits.log_softmax(-1)
            tokens = logp.argmax(-1)
        else:
            logp = (logits / gen.temperature).log_softmax(-1)
            probs = _filter_logits(logp, gen.top_k, gen.top_p).softmax(-1)
            tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)

    def _generate_batch(
        self, prompts: list[str], gen: GenerationConfig, greedy: bool, adapter: Optional[str]
    ) -> list[GenResult]:
        prompt_ids = self._prompt_ids_batch(prompts, gen.max_new_tokens)
        batch = _layout(prompt_ids, [[]] * len(prompt_ids), self.tokenizer.pad_token_id, self.device)
        eos = torch.tensor(self._eos_ids, device=self.device)
        mask, position = batch.attention_mask, batch.position_ids[:, -1:]
        done = torch.zeros(len(prompts), dtype=torch.bool, device=self.device)
        tokens, logprobs = [], []
        with self._route(self.model, adapter):
            out = self.model(
                input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids,
                use_cache=True, logits_to_keep=1,
            )
            for step in range(gen.max_new_tokens):
                token, logprob = self._pick(out.logits[:, -1].float() + self._logit_bias, gen, greedy)
                token = token.masked_fill(done, self.tokenizer.pad_token_id)
                tokens.append(token)
                logprobs.append(logprob)
                done = done | torch.isin(token, eos)
                if step + 1 == gen.max_new_tokens or bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                position = position + 1
                out = self.model(
                    input_ids=token[:, None], attention_mask=mask, position_ids=position,
                    past_key_values=out.past_key_values, use_cache=True,
                )
        token_rows = torch.stack(tokens, 1).tolist()
        logprob_rows = torch.stack(logprobs, 1).tolist()
        eos_set = set(self._eos_ids)
        ends = [next((i + 1 for i, t in enumerate(row) if t in eos_set), None) for row in token_rows]
        responses = [row[: end or len(row)] for row, end in zip(token_rows, ends)]
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        results = [
            GenResult(text=text, prompt_ids=ids, response_ids=response, logprobs=lps[: len(response)],
                      finished=end is not None)
            for text, ids, response, lps, end in zip(texts, prompt_ids, responses, logprob_rows, ends)
        ]
        return results

    # -------------------------------------------------------------- training

    def _logprobs(
        self,
        model: torch.nn.Module,
        turns: Sequence[TrainTurn],
        adapters: Sequence[Optional[str]],
        entropy: bool = False,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(log-probs, entropies, mask) of the response tokens, (turns, R), rows in ``turns`` order.

        Turns of different adapters go through separate forwards (one per
        adapter); the results are stitched back into one tensor so that the
        loss is aggregated over the whole mini-batch at once.
        """
        width = max(len(t.response_ids) for t in turns)
        by_adapter: dict[Optional[str], list[int]] = defaultdict(list)
        for i, adapter in enumerate(adapters):
            by_adapter[adapter].append(i)
        parts_lp, parts_ent, parts_mask, order = [], [], [], []
        for adapter, rows in by_adapter.items():
            sub = [turns[i] for i in rows]
            prompts, responses = [t.prompt_ids for t in sub], [t.response_ids for t in sub]
            batch = _layout(prompts, responses, self.tokenizer.pad_token_id, self.device)
            temps = torch.tensor([t.temperature or 1.0 for t in sub], device=self.device)
            size = batch.response.shape[1]
            with self._route(model, adapter):
                out = model(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False, logits_to_keep=size + 1,
                )
            logp_all = ((out.logits[:, :-1].float() + self._logit_bias) / temps[:, None, None]).log_softmax(-1)
            pad = (0, width - size)
            parts_lp.append(torch.nn.functional.pad(logp_all.gather(-1, batch.response[..., None]).squeeze(-1), pad))
            parts_mask.append(torch.nn.functional.pad(batch.response_mask, pad))
            if entropy:
                parts_ent.append(torch.nn.functional.pad(-(logp_all.exp() * logp_all).sum(-1), pad))
            order.extend(rows)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        inverse = inverse.to(self.device)
        ent = torch.cat(parts_ent)[inverse] if entropy else None
        return torch.cat(parts_lp)[inverse], ent, torch.cat(parts_mask)[inverse]

    def _reference_logprobs(self, turns: Sequence[TrainTurn]) -> torch.Tensor:
        """Log-probs under the frozen reference: the base with adapters off, or a lazy copy.

        Computed under ``inference_mode`` (no autograd bookkeeping at all) and
        cloned out of it, because the KL term later combines it with tensors
        that do record gradients.
        """
        if self._is_peft and not self.config.lora.train_base:
            model, adapters = self.model, [None] * len(turns)
        else:
            if self._reference is None:
                self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)
            model, adapters = self._reference, [t.adapter for t in turns]
        with torch.inference_mode():
            reference = self._logprobs(model, turns, adapters)[0]
        return reference.clone()

    def update(self, turns: list[TrainTurn], algorithm: AlgorithmConfig) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches; metrics are means over optimiser steps."""
        with self._lock:
            optimizer = self._optimizer_for_update()
            if not turns:
                return dict.fromkeys(UPDATE_METRICS, 0.0)
            for t in turns:
                if not t.response_ids or len(t.old_logprobs) != len(t.response_ids):
                    raise ValueError("every turn needs a non-empty response and one old log-prob per response token")
            start = time.perf_counter()
            size = algorithm.mini_batch_size or len(turns)
            sums: dict[str, float] = defaultdict(float)
            steps = 0
            self.model.train()
            try:
                for _ in range(algorithm.ppo_epochs):
                    order = list(range(len(turns)))
                    if size < len(turns):
                        order = torch.randperm(len(turns), generator=self.generator, device=self.device).tolist()
                    for begin in range(0, len(turns), size):
                        step = self._ppo_step([turns[i] for i in order[begin : begin + size]], algorithm, optimizer)
                        for key, value in step.items():
                            sums[key] += value
                        steps += 1
            finally:
                self.model.eval()
            metrics = {key: value / max(steps, 1) for key, value in sums.items()}
            metrics["tokens"] = float(sum(len(t.response_ids) for t in turns))
            metrics["update_time_s"] = time.perf_counter() - start
            return metrics

    def _ppo_step(
        self, turns: list[TrainTurn], algorithm: AlgorithmConfig, optimizer: torch.optim.Optimizer
    ) -> dict[str, float]:
        mode = algorithm.loss_agg_mode
        with_entropy_grad = algorithm.entropy_coef > 0
        logp, entropy, mask = self._logprobs(self.model, turns, [t.adapter for t in turns], entropy=True)
        if not with_entropy_grad:
            entropy = entropy.detach()
        width = mask.shape[1]
        old = _pad_rows([t.old_logprobs for t in turns], width, self.device)
        advantages = torch.tensor([float(t.advantage) for t in turns], device=self.device)[:, None] * mask
        pg_loss, pg_metrics = verl_compat.policy_loss(
            algorithm.loss, old, logp, advantages, mask, mode,
            algorithm.clip_ratio, algorithm.clip_ratio_low, algorithm.clip_ratio_high,
        )
        entropy_value = verl_compat.agg_loss(entropy, mask, mode)
        loss = pg_loss - algorithm.entropy_coef * entropy_value if with_entropy_grad else pg_loss
        kl_value = torch.zeros(())
        if algorithm.kl_coef > 0:
            reference = self._reference_logprobs(turns)
            kl_value = verl_compat.agg_loss(verl_compat.kl_penalty(logp, reference, algorithm.kl_type), mask, mode)
            loss = loss + algorithm.kl_coef * kl_value
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self._train_params, self.config.optim.grad_clip)
        optimizer.step()
        return {
            "policy_loss": float(pg_loss.detach()),
            "entropy": float(entropy_value.detach()),
            "kl": float(kl_value.detach()),
            "clip_frac": pg_metrics.get("pg_clipfrac", 0.0),
            "ppo_kl": pg_metrics.get("ppo_kl", 0.0),
            "grad_norm": float(grad_norm),
        }

    def train_supervised(self, examples: list[SupervisedExample]) -> float:
        """One AdamW step on the token-mean cross-entropy of responses (+EOS) given prompts."""
        if not examples:
            raise ValueError("train_supervised needs at least one example")
        with self._lock:
            optimizer = self._optimizer_for_update()
            turns = []
            for ex in examples:
                response = self._encode(ex.response, add_special_tokens=False) + [self._eos_ids[0]]
                prompt = self._prompt_ids(ex.prompt, len(response))
                turns.append(TrainTurn(prompt, response, old_logprobs=[], advantage=0.0, adapter=ex.adapter))
            self.model.train()
            try:
                logp, _, mask = self._logprobs(self.model, turns, [t.adapter for t in turns])
                loss = -(logp * mask).sum() / mask.sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self._train_params, self.config.optim.grad_clip)
                optimizer.step()
            finally:
                self.model.eval()
            return float(loss.detach())

    # ----------------------------------------------------------- checkpoints

    def _base_model(self) -> PreTrainedModel:
        return self.model.get_base_model() if self._is_peft else self.model

    def save(self, directory: Path) -> None:
        """``model/`` (HF dir: base weights + tokenizer), ``adapters/<name>/`` (PEFT dirs),
        ``reference/`` (KL reference, if one was copied), optimiser and RNG state."""
        directory = Path(directory)
        with self._lock:
            base = self._base_model()
            state = {}
            for key, value in base.state_dict().items():
                clean = _clean_base_name(key)
                if clean is not None:
                    state[clean] = value
            base.save_pretrained(directory / MODEL_DIR, state_dict=state)
            self.tokenizer.save_pretrained(directory / MODEL_DIR)
            if self._is_peft:
                from peft import get_peft_model_state_dict

                for adapter in self.adapters:
                    target = directory / ADAPTER_DIR / adapter
                    target.mkdir(parents=True, exist_ok=True)
                    weights = get_peft_model_state_dict(self.model, adapter_name=adapter)
                    weights = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
                    save_file(weights, target / "adapter_model.safetensors")
                    self.model.peft_config[adapter].save_pretrained(str(target))
            if self._reference is not None and not self._is_peft:
                self._reference.save_pretrained(directory / REFERENCE_DIR)
            if self._optimizer is not None:
                torch.save(self._optimizer.state_dict(), directory / OPTIMIZER_FILE)
            torch.save({"generator": self.generator.get_state()}, directory / RNG_FILE)

    def load(self, directory: Path) -> None:
        """Restore weights, adapters, reference, optimiser and RNG in place (resume bit-identically)."""
        directory = Path(directory)
        with self._lock:
            self._copy_weights(self._base_model(), directory / MODEL_DIR, clean_names=True)
            self._load_adapters(directory, missing_ok=False)
            if (directory / REFERENCE_DIR).exists():
                if self._reference is None:
                    self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)
                self._copy_weights(self._reference, directory / REFERENCE_DIR, clean_names=False)
            if (directory / OPTIMIZER_FILE).exists() and self.trainable:
                state = torch.load(directory / OPTIMIZER_FILE, map_location=self.device, weights_only=True)
                self._optimizer_for_update().load_state_dict(state)
            rng = torch.load(directory / RNG_FILE, weights_only=True)
            self.generator.set_state(rng["generator"])

    def _copy_weights(self, target: torch.nn.Module, model_dir: Path, clean_names: bool) -> None:
        """Copy a saved HF model's weights into ``target`` without replacing its parameters
        (the optimiser keeps pointing at them). Loading through ``from_pretrained`` applies
        whatever key conversions transformers does on save."""
        saved = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=DTYPES[self.config.dtype])
        source = saved.state_dict()
        with torch.no_grad():
            for key, value in target.state_dict(keep_vars=True).items():
                name = _clean_base_name(key) if clean_names else key
                if name is None:
                    continue
                if name not in source:
                    raise KeyError(f"checkpoint {model_dir} lacks weight '{name}'")
                value.copy_(source[name])

    def _load_adapters(self, directory: Path, missing_ok: bool) -> None:
        if not self._is_peft:
            return
        from peft import set_peft_model_state_dict

        for adapter in self.adapters:
            path = directory / ADAPTER_DIR / adapter / "adapter_model.safetensors"
            if not path.exists():
                if missing_ok:
                    continue
                raise FileNotFoundError(f"checkpoint {directory} has no adapter '{adapter}'")
            weights = load_file(path, device=str(self.device))
            result = set_peft_model_state_dict(self.model, weights, adapter_name=adapter)
            if result.unexpected_keys:
                raise KeyError(f"adapter '{adapter}' in {directory} has unknown weights: {result.unexpected_keys[:3]}")

    def num_parameters(self) -> dict[str, int]:
        return {
            "total": sum(p.numel() for p in self.model.parameters()),
            "trainable": sum(p.numel() for p in self._train_params),
        }
