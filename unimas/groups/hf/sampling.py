"""Batched sampling with a KV cache, and the log-probs that go with it.

Rows that share a prompt (the episodes of a GRPO group start from the same
task) are prefilled once: their key/value cache is then copied to each of
them (:mod:`unimas.groups.hf.shared_prompts`).

The log-prob reported for each sampled token is taken under
``softmax(logits / T)`` *before* any top-k / top-p filtering, because that is
the distribution the update recomputes. When a filter is active the two
differ, so the result says its log-probs are not exact and the update
recomputes them (see :func:`logprobs_are_exact`).

All randomness comes from the group's ``torch.Generator`` (passed in), drawn
once per decoding step in a fixed order, so a resumed run samples the same
tokens as an uninterrupted one.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from unimas.config.schema import GenerationConfig
from unimas.groups.base import GenRequest, GenResult
from unimas.groups.hf.chat import RenderedPrompt
from unimas.groups.hf.codec import decode_batch
from unimas.groups.hf.layout import layout_batch
from unimas.groups.hf.shared_prompts import UnsharableCache, copy_cache_rows, distinct_prompts
from unimas.groups.streaming import TextProgress


def logprobs_are_exact(gen: GenerationConfig, greedy: bool) -> bool:
    """True when the reported log-probs are the ones training recomputes (no renormalising filter)."""
    return greedy or (gen.top_k == 0 and gen.top_p == 1.0)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
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


def pick_tokens(
    logits: torch.Tensor, gen: GenerationConfig, greedy: bool, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens and their log-probs under softmax(logits / T) (T = 1 when greedy)."""
    if greedy:
        logp = logits.log_softmax(-1)
        tokens = logp.argmax(-1)
    else:
        logp = (logits if gen.temperature == 1.0 else logits / gen.temperature).log_softmax(-1)  # x / 1 is x
        probs = filter_logits(logp, gen.top_k, gen.top_p).softmax(-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class StopStrings:
    """Per row of a batch, the stop strings that end its sampling (the gateway's ``stop``).

    After each step a row with stop strings decodes the tail of what it
    sampled; once that text contains one, the row is done, like a row that
    produced EOS. The token that completed the stop string is the row's last
    sampled (and trained) token; :meth:`cut` gives the text before the stop.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: Sequence[Optional[Sequence[str]]]):
        self.tokenizer = tokenizer
        self.stops = [list(s) if s else [] for s in stops]
        self.active = any(self.stops)
        """Whether any row has stop strings (most batches have none: then nothing else is computed)."""
        # a character is at most 4 byte-level tokens: this many tail tokens hold any stop string just completed
        self.window = [4 * max((len(x) for x in s), default=0) + 4 for s in self.stops] if self.active else []

    def hit(self, row: int, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` (the row's sampled ids so far) end with text that completes one of its stops."""
        if not self.stops[row]:
            return False
        tail = self.tokenizer.decode(list(tokens[-self.window[row]:]), skip_special_tokens=True)
        return any(stop in tail for stop in self.stops[row])

    def cut(self, row: int, text: str) -> tuple[str, Optional[str]]:
        """(the text before the earliest stop string, that stop string) — the text unchanged and None when none."""
        found = [(text.find(stop), stop) for stop in self.stops[row] if stop in text]
        if not found:
            return text, None
        at, stop = min(found)
        return text[:at], stop


def listeners(tokenizer: PreTrainedTokenizerBase, requests: Sequence[GenRequest]) -> dict[int, TextProgress]:
    """Row -> its text reporter, for the rows of a batch whose request streams (``GenRequest.progress``)."""
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    return {row: TextProgress(decode, request.stop, request.progress)
            for row, request in enumerate(requests) if request.progress is not None}


def sample_tokens(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    gen: GenerationConfig,
    greedy: bool,
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    logit_bias: torch.Tensor,
    generator: torch.Generator,
    stops: Optional[StopStrings] = None,
    listeners: Optional[Mapping[int, TextProgress]] = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Decode up to ``gen.max_new_tokens`` after each prompt; (token rows, log-prob rows).

    Each distinct prompt is prefilled once (:func:`distinct_prompts`); from the first sampled token on,
    every row decodes on its own copy of the cache. Randomness is drawn for the whole batch at each step,
    so whether rows share a prompt changes no draw.
    Rows that produced EOS keep decoding pad tokens until every row is done
    (cheaper than shrinking the cache); :func:`to_results` cuts them off.
    ``stops``: rows end early when their text completes a stop string (they
    then pad as after EOS; :func:`to_results` cuts at the completing token).
    ``listeners``: rows that stream get each token they sample as it is picked (rows without one cost nothing).
    The caller routes ``model`` to the right adapter and disables autograd.
    """
    device = logit_bias.device

    def prefill(rows: Sequence[list[int]]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """(last logits, cache, attention mask, last position) after a forward over prompt ``rows``."""
        batch = layout_batch(list(rows), [[]] * len(rows), pad_id, device)
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                    use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], out.past_key_values, batch.attention_mask, batch.position_ids[:, -1:]

    eos = torch.tensor(list(eos_ids), device=device)
    stopping = stops is not None and stops.active
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    tokens, logprobs = [], []
    for listener in (listeners or {}).values():
        listener.start()
    distinct, shared = distinct_prompts(prompts)
    logits, cache, mask, position = prefill(distinct)
    if shared is not None:
        rows = torch.tensor(shared, device=device)
        try:
            cache = copy_cache_rows(cache, rows)
            logits, mask, position = logits[rows], mask[rows], position[rows]
        except UnsharableCache:  # a model whose cache rows cannot be copied: prefill every row
            logits, cache, mask, position = prefill(prompts)
    for step in range(gen.max_new_tokens):
        token, logprob = pick_tokens(logits.float() + logit_bias, gen, greedy, generator)
        token = token.masked_fill(done, pad_id)
        if listeners:
            picked, ended = token.tolist(), done.tolist()
            for row, listener in listeners.items():
                if not ended[row]:
                    listener.add(picked[row])
        tokens.append(token)
        logprobs.append(logprob)
        done = done | torch.isin(token, eos)
        if stopping:
            sampled = torch.stack(tokens, 1).tolist()
            hit = [not finished and stops.hit(i, row) for i, (row, finished) in enumerate(zip(sampled, done.tolist()))]
            done = done | torch.tensor(hit, dtype=torch.bool, device=device)
        if step + 1 == gen.max_new_tokens or bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        position = position + 1
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position,
                    past_key_values=cache, use_cache=True)
        logits, cache = out.logits[:, -1], out.past_key_values
    return torch.stack(tokens, 1).tolist(), torch.stack(logprobs, 1).tolist()


def to_results(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[RenderedPrompt],
    token_rows: Sequence[list[int]],
    logprob_rows: Sequence[list[float]],
    eos_ids: Sequence[int],
    exact: bool,
    *,
    weight_version: Optional[int] = None,
    stops: Optional[StopStrings] = None,
    controls: Sequence[str] = (),
) -> list[GenResult]:
    """Each row's result: cut after its first EOS (kept: it is a trained token), its text decoded, and what
    its prompt says about itself (ids, text, continued, truncated, re-rendered, forced ids) carried over.

    With ``stops``, a row ends instead at the token that completed a stop
    string (kept: it was sampled), and its text ends before that string.
    ``weight_version``: the weights that sampled the batch; ``controls``: the request controls the backend
    applied (``GenResult.controls``).
    """
    eos_set = set(eos_ids)
    ends: list[Optional[int]] = [next((i + 1 for i, t in enumerate(row) if t in eos_set), None) for row in token_rows]
    stopped: list[Optional[int]] = [None] * len(token_rows)
    if stops is not None and stops.active:
        for r, row in enumerate(token_rows):
            limit = ends[r] or len(row)
            stopped[r] = next((i + 1 for i in range(limit) if stops.hit(r, row[: i + 1])), None)
    responses = [row[: stop or end or len(row)] for row, end, stop in zip(token_rows, ends, stopped)]
    texts = decode_batch(tokenizer, responses)
    results = []
    for r, (text, prompt, response, lps, end) in enumerate(zip(texts, prompts, responses, logprob_rows, ends)):
        text, stop = stops.cut(r, text) if stopped[r] is not None else (text, None)
        results.append(GenResult(
            text=text, prompt_ids=prompt.ids, response_ids=response, logprobs=lps[: len(response)],
            finished=end is not None and stopped[r] is None, logprobs_exact=exact, stop=stop,
            prompt_text=prompt.text, continued=prompt.continued, truncated=prompt.truncated,
            rerendered=prompt.rerendered, forced_ids=prompt.forced_ids, controls=list(controls),
            weight_version=weight_version))
    return results
