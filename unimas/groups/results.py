"""How a model group batches requests and answers one it will not sample: the same on every backend.

Requests that share their sampling settings run as one batch (:func:`bucket_key`);
a prompt that could not be rendered, or is too long and not allowed to be cut,
gets an empty result that says why (:func:`refused_result`) instead of a sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unimas.groups.base import GenRequest, GenResult

if TYPE_CHECKING:
    from unimas.groups.hf.chat import RenderedPrompt


def is_greedy(request: GenRequest) -> bool:
    """Greedy when asked for or at temperature 0."""
    return request.greedy or request.generation.temperature == 0


def bucket_key(request: GenRequest) -> tuple:
    """(max new tokens, greedy, temperature/top-k/top-p unless greedy): requests with equal keys share a batch."""
    gen, greedy = request.generation, is_greedy(request)
    return gen.max_new_tokens, greedy, () if greedy else (gen.temperature, gen.top_k, gen.top_p)


def is_refused(prompt: "RenderedPrompt", request: GenRequest) -> bool:
    """Not sampled: the prompt could not be rendered, or it is too long and the request does not allow a cut."""
    return bool(prompt.error) or (prompt.truncated and not request.allow_truncation)


def refused_result(prompt: "RenderedPrompt", weight_version: int) -> GenResult:
    """The empty result of a request that is not sampled; ``error`` and ``truncated`` say why."""
    return GenResult(text="", prompt_ids=prompt.ids, response_ids=[], logprobs=[], finished=False,
                     prompt_text=prompt.text, truncated=prompt.truncated, error=prompt.error or None,
                     weight_version=weight_version)
