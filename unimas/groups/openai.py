"""A frozen model group served by any OpenAI-compatible endpoint (completions or chat completions).

Use it for roles that act but never train (a judge, a user simulator, a
strong reference model). It implements only generation; the validator keeps
trainable roles off it. Requests of one batch are sent concurrently. The
response text is untrusted data like any model output: it is only parsed.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, Literal, Optional

from pydantic import Field

from unimas.config.strict import Strict
from unimas.groups.base import GenRequest, GenResult, GroupSpec, ModelGroup, TrainTurn


class OpenAIOptions(Strict):
    """Settings of ``backend: openai`` under ``models.<group>.options``."""

    endpoint: str = Field(..., min_length=1, description="base URL of an OpenAI-compatible server "
                          "(`/v1/completions` or `/v1/chat/completions` is appended)")
    api: Literal["completions", "chat"] = Field("completions", description="completions: the role's prompt as one "
                                                "text; chat: its messages, rendered by the server's chat template")
    api_model: str = Field("default", description="model name sent with each request")
    api_key_env: Optional[str] = Field(None, description="environment variable holding the API key (sent as a "
                                       "bearer token); the key itself never goes in the config")
    timeout_s: float = Field(60.0, gt=0, description="seconds to wait for one completion")
    retries: int = Field(3, ge=0, description="extra attempts after a connection error or timeout")
    max_parallel: int = Field(16, ge=1, description="completions in flight at once")


class OpenAIModelGroup(ModelGroup):
    options: ClassVar[type[OpenAIOptions]] = OpenAIOptions
    can_train: ClassVar[bool] = False
    """Validation keeps trainable groups off this backend."""
    can_score_turns: ClassVar[bool] = False
    """The endpoint returns no log-probabilities of given turns."""
    can_host_adapters: ClassVar[bool] = False
    """The endpoint serves one model; :meth:`build` refuses LoRA adapters."""
    can_save_weights: ClassVar[bool] = False
    """The weights live behind the endpoint: :meth:`save` writes only its address."""

    def __init__(self, name: str, settings: OpenAIOptions):
        self.name = name
        self.trainable = False
        self.chat = settings.api == "chat"
        self.url = settings.endpoint.rstrip("/") + ("/v1/chat/completions" if self.chat else "/v1/completions")
        self.model = settings.api_model
        self.api_key = os.environ.get(settings.api_key_env, "") if settings.api_key_env else ""
        self.timeout_s = settings.timeout_s
        self.max_parallel = settings.max_parallel
        self.retries = settings.retries

    @classmethod
    def build(cls, spec: GroupSpec) -> "OpenAIModelGroup":
        if spec.adapters:
            raise ValueError(f"model group '{spec.name}': an API endpoint cannot host LoRA adapters {spec.adapters}")
        settings = spec.options if isinstance(spec.options, OpenAIOptions) else OpenAIOptions.model_validate(
            spec.options)
        return cls(spec.name, settings)

    def _complete(self, request: GenRequest) -> GenResult:
        gen = request.generation
        body = {"model": self.model, "max_tokens": gen.max_new_tokens,
                "temperature": 0.0 if request.greedy else gen.temperature, "top_p": gen.top_p}
        if self.chat:
            body["messages"] = request.messages or [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        http_request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers)
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(http_request, timeout=self.timeout_s) as response:
                    payload = json.loads(response.read())
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                if attempt == self.retries:
                    raise RuntimeError(f"endpoint {self.url} failed after {attempt + 1} attempts: {exc}") from None
                time.sleep(0.1 * 2**attempt)
        choice = payload["choices"][0]
        finished = choice.get("finish_reason") == "stop"
        text = (choice.get("message") or {}).get("content", "") if self.chat else choice.get("text", "")
        return GenResult(text=str(text or ""), prompt_ids=[], response_ids=[], logprobs=[], finished=finished)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, max(1, len(requests)))) as pool:
            return list(pool.map(self._complete, requests))

    def update(self, turns: list[TrainTurn]) -> dict[str, float]:
        raise RuntimeError(f"model group '{self.name}' is served by an API endpoint and cannot be trained")

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "endpoint.json").write_text(json.dumps({"endpoint": self.url, "model": self.model}))

    def load(self, directory: Path) -> None:
        """Nothing to restore: the weights live behind the endpoint."""
