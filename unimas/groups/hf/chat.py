"""Prompt ids from chat messages, token-exact across the turns of one conversation.

A role's first turn is rendered with the tokenizer's own chat template
(``add_generation_prompt=True``). A later turn that extends the same
conversation is **not** re-rendered: its ids are the previous turn's prompt
ids + the ids the model sampled + the ids of what the template adds after
them (the rest of the assistant message's closing, the new user messages,
the generation prompt). Sampled text is never re-tokenised, so the ids a
turn is trained on are exactly the ids the model saw and produced.

The added part is found by rendering the conversation twice as text and
taking the difference. The previous answer's place in the conversation is
taken by the ids the model sampled, whatever the agent sends back for it:
its text, or the structured ``tool_calls`` parsed out of it (the template's
own rendering of the call, which may space or order the JSON otherwise, is
never tokenised in its place). Function definitions are part of the
rendering: a turn extends the previous ids only under the same tool list.

A turn is rendered afresh and marked ``continued=False`` with the reason in
``rerendered`` when the messages do not extend the role's previous
conversation, the tool list changed, the template does not render a
conversation as a prefix of its continuation (Qwen3-style templates drop
earlier reasoning), or the end of the answer cannot be told apart in the
template's rendering — the documented exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from unimas.errors import UserError
from unimas.groups.base import Continuation
from unimas.groups.hf.codec import encode_batch


@dataclass
class RenderedPrompt:
    ids: list[int]
    text: str
    """The prompt as the model saw it, special tokens included (role markers of the template)."""
    continued: bool
    """True when ``ids`` extend the previous turn's prompt + response ids exactly."""
    truncated: bool = False
    """Longer than the context allows (cut from the left, unless its request forbids cutting)."""
    rerendered: str = ""
    """Why a continuation that was offered was not used (empty when ``continued`` or none was offered)."""
    forced_ids: list[int] = field(default_factory=list)
    """Ids of a forced answer opening appended to ``ids`` (the request's ``response_prefix``)."""
    error: str = ""
    """Why this request's prompt could not be rendered or tokenised (empty: it was); ``ids`` are then empty."""


def failed_prompt(group: str, exc: Exception) -> RenderedPrompt:
    """The prompt of a request whose messages made the chat template or the tokenizer fail.

    Such a failure belongs to that request (e.g. a template's ``raise_exception`` on roles that do not
    alternate), not to its group or to the other requests of its batch: they go on, and this one is
    answered with the message.
    """
    detail = (str(exc).strip().splitlines() or [""])[0][:500]
    return RenderedPrompt([], "", continued=False,
                          error=f"model group '{group}' cannot turn this request's messages into prompt ids (its chat "
                                f"template or tokenizer failed): {type(exc).__name__}: {detail}")


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
            self._ids.update(zip(new, encode_batch(self.tokenizer, new, add_special_tokens=True)))
        return [list(self._ids[text]) for text in texts]  # copies: callers own their lists


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


TEMPLATE_PROBE = [{"role": "user", "content": "hi"}]
TEMPLATE_SECONDS = 10.0
"""CPU seconds (of the rendering thread) that rendering :data:`TEMPLATE_PROBE` may take: real chat templates need
milliseconds. CPU time, not wall time, so a busy machine cannot make a good template look like a loop."""
TEMPLATE_MAX_CHARACTERS = 1 << 20
"""What it may write: real chat templates write a few hundred characters for it."""


class TemplateTooSlow(Exception):
    """Raised inside a chat template's rendering once it has used :data:`TEMPLATE_SECONDS` of CPU time."""


def check_chat_template(tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """Refuse a chat template that loops for hours or writes megabytes for a one-message conversation.

    A template is a program (Jinja, sandboxed against side effects but not against time): two nested
    ``range(100000)`` loops would stall every prompt of the run. It is rendered once here, at load, under a
    CPU-time budget that a trace function enforces between the template's lines (rendering runs as Python code, and
    a timer thread or a signal could not stop it in every thread). A template that fails on the probe is left
    to fail per request, where the failure is reported with the request (:func:`failed_prompt`).
    """
    if not has_chat_template(tokenizer):
        return
    import sys
    import time

    deadline = time.thread_time() + TEMPLATE_SECONDS

    def stop_when_late(frame: Any, event: str, arg: Any) -> Any:
        if time.thread_time() > deadline:
            raise TemplateTooSlow
        return stop_when_late

    previous = sys.gettrace()
    sys.settrace(stop_when_late)
    try:
        text = _render(tokenizer, TEMPLATE_PROBE, generation_prompt=True)
    except TemplateTooSlow:
        raise UserError(f"the chat template runs for more than {TEMPLATE_SECONDS:g} s of CPU time on a one-message "
                        "conversation (a loop that does not end?): refused", where=where) from None
    except Exception:  # noqa: BLE001 - a template may refuse this conversation; each request reports its own
        return
    finally:
        sys.settrace(previous)
    if len(text) > TEMPLATE_MAX_CHARACTERS:
        raise UserError(f"the chat template writes {len(text)} characters for a one-message conversation (more "
                        f"than {TEMPLATE_MAX_CHARACTERS}): refused", where=where)


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], generation_prompt: bool,
            tools: Sequence[dict[str, Any]] | None = None) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Template text already holds its special tokens (BOS, role markers): add none."""
    return encode_batch(tokenizer, [text], add_special_tokens=False)[0]


ANSWER_PROBE = "\x00unimas-answer\x00"
"""Content of a stand-in answer, rendered to find what a template writes after an assistant message."""


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]],
                continuation: Continuation | None, tools: Sequence[dict[str, Any]] | None = None) -> RenderedPrompt:
    """Ids of ``messages`` + generation prompt; extends ``continuation`` exactly when it is a prefix.

    ``tools``: function definitions, rendered by the template (usually into the system block).
    """
    full = _render(tokenizer, messages, generation_prompt=True, tools=tools)
    reason = ""
    if continuation is not None:
        extended, reason = _extend(tokenizer, messages, continuation, full, tools)
        if extended is not None:
            return extended
    ids = _encode(tokenizer, full)
    return RenderedPrompt(ids, tokenizer.decode(ids, skip_special_tokens=False), continued=False, rerendered=reason)


def _extend(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], previous: Continuation,
            full: str, tools: Sequence[dict[str, Any]] | None) -> tuple[RenderedPrompt | None, str]:
    """(previous prompt ids + sampled ids + ids of the template text that follows them, "") or (None, why not)."""
    if list(previous.tools or []) != list(tools or []):
        return None, "the tool list differs from the role's previous turn"
    if not extends(messages, previous):
        return None, "the messages do not extend the role's previous conversation"
    answered = list(messages[: len(previous.messages) + 1])
    opened = _render(tokenizer, previous.messages, generation_prompt=True, tools=tools)  # ... <|im_start|>assistant\n
    closed = _render(tokenizer, answered, generation_prompt=False, tools=tools)  # ... assistant\n{answer}<|im_end|>\n
    if not (closed.startswith(opened) and full.startswith(closed)):
        return None, "the chat template does not render the conversation as a prefix of its continuation"
    closing = _closing(tokenizer, previous.messages, answered[-1], closed[len(opened):], opened, tools)
    if closing is None:
        return None, "the end of the previous answer cannot be found in the chat template's rendering"
    sampled_end = tokenizer.decode(previous.response_ids[-1:], skip_special_tokens=False) if previous.finished else ""
    if sampled_end and closing.startswith(sampled_end):
        closing = closing[len(sampled_end):]  # the model already produced the end-of-turn token
    added = _encode(tokenizer, closing + full[len(closed):])
    ids = list(previous.prompt_ids) + list(previous.response_ids) + added
    return RenderedPrompt(ids, tokenizer.decode(ids, skip_special_tokens=False), continued=True), ""


def _closing(tokenizer: PreTrainedTokenizerBase, before: Sequence[dict[str, Any]], answer: dict[str, Any],
             rendered: str, opened: str, tools: Sequence[dict[str, Any]] | None) -> str | None:
    """What the template writes after the answer's body in ``rendered`` (the answer as rendered), or None.

    A plain answer's body is its content. One with ``tool_calls`` is written
    by the template in its own way, so the closing is read off a stand-in
    answer and must end ``rendered``.
    """
    content = answer.get("content") or ""
    if not answer.get("tool_calls") and rendered.startswith(content):
        return rendered[len(content):]
    probe = _render(tokenizer, [*before, {"role": "assistant", "content": ANSWER_PROBE}], generation_prompt=False,
                    tools=tools)
    if not probe.startswith(opened + ANSWER_PROBE):
        return None
    closing = probe[len(opened) + len(ANSWER_PROBE):]
    return closing if rendered.endswith(closing) and len(rendered) >= len(closing) else None


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
