"""A frozen model group served by any OpenAI-compatible completions endpoint.

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

from unimas.backends.base import GenRequest, GenResult, ModelGroup, SupervisedExample, TrainTurn
from unimas.config import AlgorithmConfig, ModelGroupConfig


class OpenAIModelGroup(ModelGroup):
    def __init__(self, name: str, config: ModelGroupConfig, timeout_s: float = 60.0, max_parallel: int = 16,
                 retries: int = 3):
        if not config.endpoint:
            raise ValueError(f"model group '{name}': backend 'openai' needs 'endpoint'")
        self.name = name
        self.trainable = False
        self.url = config.endpoint.rstrip("/") + "/v1/completions"
        self.model = config.api_model or "default"
        self.api_key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        self.timeout_s = timeout_s
        self.max_parallel = max_parallel
        self.retries = retries

    @classmethod
    def from_config(cls, name: str, config: ModelGroupConfig, adapters: list[str], seed: int) -> "OpenAIModelGroup":
        if adapters:
            raise ValueError(f"model group '{name}': an API endpoint cannot host LoRA adapters {adapters}")
        return cls(name, config)

    def _complete(self, request: GenRequest) -> GenResult:
        gen = request.generation
        body = {"model": self.model, "prompt": request.prompt, "max_tokens": gen.max_new_tokens,
                "temperature": 0.0 if request.greedy else gen.temperature, "top_p": gen.top_p}
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
        return GenResult(text=str(choice.get("text", "")), prompt_ids=[], response_ids=[], logprobs=[],
                         finished=finished)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, max(1, len(requests)))) as pool:
            return list(pool.map(self._complete, requests))

    def update(self, turns: list[TrainTurn], algorithm: AlgorithmConfig) -> dict[str, float]:
        raise RuntimeError(f"model group '{self.name}' is served by an API endpoint and cannot be trained")

    def train_supervised(self, examples: list[SupervisedExample]) -> float:
        raise RuntimeError(f"model group '{self.name}' is served by an API endpoint and cannot be trained")

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "endpoint.json").write_text(json.dumps({"endpoint": self.url, "model": self.model}))

    def load(self, directory: Path) -> None:
        """Nothing to restore: the weights live behind the endpoint."""
