"""Prompt ids from chat messages, token-exact across the turns of one conversation.

A role's first turn is rendered with the tokenizer's own chat template
(``add_generation_prompt=True``). A later turn that extends the same
conversation is **not** re-rendered: its ids are the previous turn's prompt
ids + the ids the model sampled + the ids of what the template adds after
them (the rest of the assistant message's closing, the new user messages,
the generation prompt). Sampled text is never re-tokenised, so the ids a
turn is trained on are exactly the ids the model saw and produced.

The added part is found by rendering the conversation twice as text and
taking the difference. When a template does not render a conversation as a
prefix of its continuation (Qwen3-style templates drop earlier reasoning),
the turn is rendered afresh and marked ``continued=False`` — the documented
exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from unimas.groups.base import Continuation


@dataclass
class RenderedPrompt:
    ids: list[int]
    text: str
    """The prompt as the model saw it, special tokens included (role markers of the template)."""
    continued: bool
    """True when ``ids`` extend the previous turn's prompt + response ids exactly."""
    truncated: bool = False
    """Longer than the context allows (cut from the left, unless its request forbids cutting)."""


class PlainPromptIds:
    """Token ids of plain prompts (special tokens added), each distinct text tokenised once.

    The episodes of a GRPO group start from the same task, so most prompts of
    a batch were seen before: their first turns are identical. The tokenizer
    call (about 1 ms for 64 short prompts on CPU, profiled in
    ``benchmarks/overhead.py``) then runs only on the new texts, in one batch.
    Bounded: the memo is emptied when it is full.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, capacity: int = 4096):
        self.tokenizer = tokenizer
        self.capacity = capacity
        self._ids: dict[str, list[int]] = {}

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        distinct = list(dict.fromkeys(texts))
        new = [text for text in distinct if text not in self._ids]
        if len(self._ids) + len(new) > self.capacity:
            self._ids.clear()  # full: start over, keeping nothing this batch still needs from before
            new = distinct
        if new:
            self._ids.update(zip(new, self.tokenizer(new, add_special_tokens=True)["input_ids"]))
        return [list(self._ids[text]) for text in texts]  # copies: callers own their lists


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], generation_prompt: bool,
            tools: Sequence[dict[str, Any]] | None = None) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Template text already holds its special tokens (BOS, role markers): add none."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]],
                continuation: Continuation | None, tools: Sequence[dict[str, Any]] | None = None) -> RenderedPrompt:
    """Ids of ``messages`` + generation prompt; extends ``continuation`` exactly when it is a prefix.

    With ``tools`` (function definitions, rendered by the template, usually into the system block) the
    prompt is rendered whole: the previous turn's ids were rendered with its own tool list.
    """
    full = _render(tokenizer, messages, generation_prompt=True, tools=tools)
    if continuation is not None and not tools:
        extended = _extend(tokenizer, messages, continuation, full)
        if extended is not None:
            return extended
    ids = _encode(tokenizer, full)
    return RenderedPrompt(ids, tokenizer.decode(ids, skip_special_tokens=False), continued=False)


def _extend(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], previous: Continuation,
            full: str) -> RenderedPrompt | None:
    """previous prompt ids + sampled ids + ids of the template text that follows them, or None if no prefix."""
    if not extends(messages, previous):
        return None
    answered = list(messages[: len(previous.messages) + 1])
    opened = _render(tokenizer, previous.messages, generation_prompt=True)  # ... <|im_start|>assistant\n
    closed = _render(tokenizer, answered, generation_prompt=False)  # ... <|im_start|>assistant\n{text}<|im_end|>\n
    content = answered[-1]["content"]
    if not (closed.startswith(opened) and closed[len(opened):].startswith(content) and full.startswith(closed)):
        return None
    closing = closed[len(opened) + len(content):]  # what the template writes after the answer
    sampled_end = tokenizer.decode(previous.response_ids[-1:], skip_special_tokens=False) if previous.finished else ""
    if sampled_end and closing.startswith(sampled_end):
        closing = closing[len(sampled_end):]  # the model already produced the end-of-turn token
    added = _encode(tokenizer, closing + full[len(closed):])
    ids = list(previous.prompt_ids) + list(previous.response_ids) + added
    return RenderedPrompt(ids, tokenizer.decode(ids, skip_special_tokens=False), continued=True)


def extends(messages: Sequence[dict[str, Any]], previous: Continuation) -> bool:
    """``messages`` = the previous turn's messages + its answer + at least one new message."""
    before = len(previous.messages)
    return (list(messages[:before]) == list(previous.messages) and len(messages) > before + 1
            and messages[before].get("role") == "assistant")


def render_plain(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]],
                 continuation: Continuation | None) -> RenderedPrompt:
    """Models without a chat template: contents joined; a later turn appends only its new messages' ids."""
    if continuation is None or not extends(messages, continuation):
        text = "".join(m["content"] for m in messages)
        return RenderedPrompt(tokenizer(text, add_special_tokens=True)["input_ids"], text, continued=False)
    new = "".join(m["content"] for m in messages[len(continuation.messages) + 1:])
    ids = list(continuation.prompt_ids) + list(continuation.response_ids) + _encode(tokenizer, new)
    return RenderedPrompt(ids, tokenizer.decode(ids, skip_special_tokens=False), continued=True)
