"""Prompt ids for a verl group's requests: the torch backend's rendering rules, without its model.

Plain prompts, chat templates and continued conversations render exactly as
in the torch backend (``unimas.groups.hf.chat``), so a role behaves the
same on either backend; prompts too long for the context are cut from the
left when the role allows it and refused otherwise.
"""

from __future__ import annotations

from typing import Optional

from transformers import PreTrainedTokenizerBase

from unimas.groups.base import GenRequest
from unimas.groups.hf import chat
from unimas.groups.prompts import check_prompt_text, cut_left, prompt_limit


def render(tokenizer: PreTrainedTokenizerBase, request: GenRequest, group: str, max_positions: Optional[int],
           fallback_id: int) -> chat.RenderedPrompt:
    """The request's prompt ids; ``truncated`` set when they do not fit with the new tokens.

    Messages that make the chat template or the tokenizer fail give a prompt with ``error`` set (that
    request's failure, not the batch's: see :func:`unimas.groups.hf.chat.failed_prompt`).
    """
    templated = bool(request.messages) and request.use_chat_template and chat.has_chat_template(tokenizer)
    try:
        if request.continuation is None and not templated:
            prompt = chat.RenderedPrompt(tokenizer(request.prompt, add_special_tokens=True)["input_ids"], "",
                                         continued=False)
        else:
            renderer = chat.render_chat if templated else chat.render_plain
            prompt = renderer(tokenizer, request.messages or [], request.continuation)
    except Exception as exc:  # noqa: BLE001 - this request's messages are at fault, not the group
        return chat.failed_prompt(group, exc)
    check_prompt_text(tokenizer, prompt.text or request.prompt, prompt.ids, group)
    if not prompt.ids:
        prompt.ids = [fallback_id]
    limit = prompt_limit(max_positions, request.generation.max_new_tokens, group)
    if limit is not None and len(prompt.ids) > limit:
        prompt.truncated = True
        if request.allow_truncation:
            prompt.ids = cut_left(prompt.ids, limit, group)
    return prompt
