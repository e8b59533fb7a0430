"""A torch group's policy: the network, what its tokenizer says, and its log-prob forwards.

:class:`TorchPolicy` holds one causal LM (plus one LoRA adapter per role,
when the group has a ``lora`` section), the tokenizer facts every sampled or
trained row depends on (pad and EOS ids, the logit bias that bans special
tokens), how a forward is routed through an adapter, the frozen KL
reference, and the forwards that turn rows into per-token log-probs. It does
not train (:mod:`unimas.groups.torch.learner`) and does not sample
(:mod:`unimas.groups.torch.sampler`); both read it.

The log-probs reported at sampling and those recomputed here see the same
logits (logit bias, temperature), so the PPO ratio starts at exactly 1 when
on-policy.
"""

from __future__ import annotations

import contextlib
import copy
from collections import defaultdict
from typing import Iterator, Optional, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from unimas.groups.base import GenRequest, GroupSpec, TrainTurn
from unimas.groups.hf import chat
from unimas.groups.hf.shared_prompts import SplitBatch, UnsharableCache, forward_split
from unimas.groups.lora import check_target_modules
from unimas.groups.prompts import check_prompt_text, cut_left, prompt_limit
from unimas.groups.torch.batches import TurnBatches


def device_for(spec: GroupSpec) -> torch.device:
    """The group's device: a GPU when it asks for one and one is there, else the CPU."""
    return torch.device("cuda" if spec.config.resources.gpus > 0 and torch.cuda.is_available() else "cpu")


class TorchPolicy:
    """One causal LM (plus optional LoRA adapters) and its tokenizer facts."""

    def __init__(self, spec: GroupSpec, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 device: torch.device):
        adapters = list(dict.fromkeys(spec.adapters))
        config = spec.config
        if adapters and config.lora is None:
            raise ValueError(f"model group '{spec.name}': roles use adapters {adapters} but the group has no "
                             "'lora' section")
        self.name = spec.name
        self.config = config
        self.trainable = config.trainable
        self.tokenizer = tokenizer
        self.plain_prompt_ids = chat.PlainPromptIds(tokenizer)
        self.pad_id: int = tokenizer.pad_token_id
        self.unk_id: Optional[int] = tokenizer.unk_token_id  # read per prompt: the tokenizer property is slow
        self.device = device
        self.adapters = adapters
        self.model = self._wrap_lora(model, spec.seed).to(device).eval()
        self.train_params = self._mark_trainable()
        self._reference: Optional[torch.nn.Module] = None
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted({tokenizer.eos_token_id, *eos} - {None})
        if not self.eos_ids:
            raise ValueError(f"model group '{self.name}': the tokenizer has no EOS token")
        self.logit_bias = self._special_token_bias()
        cfg = model.config
        self.max_positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    # ----------------------------------------------------------------- setup

    def _wrap_lora(self, model: PreTrainedModel, seed: int) -> torch.nn.Module:
        """Add one LoRA adapter per name; their random init is seeded and leaves the global RNG alone."""
        if not self.adapters:
            return model
        from peft import LoraConfig, get_peft_model

        lora = self.config.lora
        check_target_modules(model, lora, self.name)

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

    def adapter_params(self, adapter: str) -> list[torch.nn.Parameter]:
        """The trainable LoRA weights of one adapter (PEFT names them ``...lora_A.<adapter>.weight``)."""
        trainable = {id(p) for p in self.train_params}
        return [p for key, p in self.model.named_parameters() if id(p) in trainable
                and any(a.startswith("lora_") and b == adapter for a, b in zip(key.split("."), key.split(".")[1:]))]

    def num_parameters(self) -> dict[str, int]:
        """Total and trainable parameter counts (``benchmarks/sharing.py`` reports them)."""
        return {"total": sum(p.numel() for p in self.model.parameters()),
                "trainable": sum(p.numel() for p in self.train_params)}

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
        """Route forwards of ``model`` (the policy's, its reference copy or a sampling copy) through ``adapter``.

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

    # --------------------------------------------------------------- prompts

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
        if self.unk_id is not None and self.unk_id in ids:
            check_prompt_text(self.tokenizer, text, ids, self.name)
        if not ids:
            ids = [self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.eos_ids[0]]
        limit = prompt_limit(self.max_positions, reserve, self.name)
        return cut_left(ids, limit, self.name) if cut else ids

    # -------------------------------------------------------------- forwards

    def logprobs(self, turns: Sequence[TrainTurn], adapters: Sequence[Optional[str]], batches: TurnBatches, *,
                 model: Optional[torch.nn.Module] = None, entropy: bool = False
                 ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(log-probs, entropies, mask) of the response tokens, (turns, R), rows in ``turns`` order.

        ``model``: the policy's own by default, or its reference copy. Turns of
        different adapters go through separate forwards (one per adapter); the
        results are stitched back into one tensor so that the loss is
        aggregated over the whole mini-batch at once. Logits get the logit
        bias and each turn's sampling temperature, as in sampling.
        ``batches`` lays the turns out (the learner's, which remembers them).
        """
        model = self.model if model is None else model
        width = max(len(t.response_ids) for t in turns)
        by_adapter: dict[Optional[str], list[int]] = defaultdict(list)
        for i, adapter in enumerate(adapters):
            by_adapter[adapter].append(i)
        parts_lp, parts_ent, parts_mask, order = [], [], [], []
        for adapter, rows in by_adapter.items():
            sub = [turns[i] for i in rows]
            temperatures = [t.temperature or 1.0 for t in sub]
            with self.route(model, adapter):
                logits, response, response_mask = _response_logits(model, sub, batches)
            scaled = logits.float() + self.logit_bias
            if any(t != 1.0 for t in temperatures):  # x / 1 is x: no division (and no autograd node) at T = 1
                scaled = scaled / torch.tensor(temperatures, device=self.device)[:, None, None]
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
        inverse = inverse.to(self.device)
        ent = torch.cat(parts_ent)[inverse] if entropy else None
        return torch.cat(parts_lp)[inverse], ent, torch.cat(parts_mask)[inverse]

    def reference_logprobs(self, turns: Sequence[TrainTurn], batches: TurnBatches) -> torch.Tensor:
        """Log-probs under the frozen KL reference: the base with adapters off, or a lazy copy.

        Computed under ``inference_mode`` (no autograd bookkeeping at all) and
        cloned out of it, because the KL term later combines it with tensors
        that do record gradients.
        """
        if self.adapters and not self.config.lora.train_base:
            model, adapters = self.model, [None] * len(turns)
        else:
            model, adapters = self.reference_model(), [t.adapter for t in turns]
        batches(turns)  # built outside inference mode, so that the policy pass reuses it
        with torch.inference_mode():
            reference = self.logprobs(turns, adapters, batches, model=model)[0]
        return reference.clone()

    def score(self, turns: Sequence[TrainTurn], batches: TurnBatches) -> list[float]:
        """Each turn's summed response log-prob under the current weights, without gradients."""
        if not turns:
            return []
        with torch.inference_mode():
            logp, _, mask = self.logprobs(turns, [t.adapter for t in turns], batches)
        return (logp * mask).sum(dim=1).tolist()


def _right_pad(values: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, width): ``values`` with zero columns on the right; no copy when they are that wide already."""
    missing = width - values.shape[1]
    return torch.nn.functional.pad(values, (0, missing)) if missing else values


def _response_logits(model: torch.nn.Module, turns: list[TrainTurn], batches: TurnBatches
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the logits that predict each response token, (rows, R, V); the response ids; their mask).

    When rows share prompts enough, each distinct prompt goes through the model once
    (:mod:`unimas.groups.hf.shared_prompts`); otherwise one ``[prompt | response]`` row per turn.
    """
    batch = batches(turns)
    if isinstance(batch, SplitBatch):
        try:
            first, rest = forward_split(model, batch)
        except UnsharableCache:  # a model whose cache rows cannot be copied: one full row per turn
            batch = batches.full_rows(turns)
        else:  # the prompts' last logits predict each response's first token
            logits = torch.cat([first.logits[batch.rows], rest.logits[:, :-1]], dim=1)
            return logits, batch.response, batch.response_mask
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                use_cache=False, logits_to_keep=batch.response.shape[1] + 1)
    return out.logits[:, :-1], batch.response, batch.response_mask
