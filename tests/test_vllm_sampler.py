"""A torch group sampling with vLLM in a process of its own (``models.<g>.options.sampler: vllm``).

One engine for the module (vLLM's import and start take most of a minute on
2 cores). It samples the trainer's policy (log-probs equal to the trainer's
forward), takes new weights in place after an update, forgets its prefix
cache with them (a control shows the cache would otherwise serve the old
weights), honours stop strings, forced openings and streaming, samples the
same tokens after a resume, and nothing in its process unpickles anything —
not even a pickle planted as its weight file.
"""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from tests.test_torch_backend import gen, group_spec, response_logprob, turns_from
from unimas.config.schema import ModelGroupConfig, OptimConfig
from unimas.errors import UserError
from unimas.groups.base import GenRequest
from unimas.groups.torch import TorchModelGroup, TorchOptions
from unimas.groups.vllm_engine import (KV_CACHE_CEILING, KV_CACHE_FLOOR, EngineError, SampleSettings,
                                       default_kv_cache_bytes)
from unimas.groups import vllm_worker

ALPHABET = "abcdefgh:SL "
TINY = {"alphabet": ALPHABET, "hidden_size": 64, "num_layers": 2, "num_heads": 2, "max_positions": 512}
"""Heads 32 wide: the narrowest vLLM's CPU attention takes."""
LONG = "S:" + "abcdefgh " * 36
"""324 tokens: two full 128-token blocks of vLLM's prefix cache."""
PROMPTS = ["S:a", "S:bcd", "L:hgfedcba", LONG]


def make_group(**options) -> TorchModelGroup:
    config = ModelGroupConfig(options={"tiny": TINY, "sampler": "vllm", **options}, optim=OptimConfig(lr=5e-2))
    return TorchModelGroup.build(group_spec(config, seed=0))


def requests(max_new: int = 8, **kw) -> list[GenRequest]:
    return [GenRequest(prompt=p, generation=gen(max_new, **kw)) for p in PROMPTS]


@pytest.fixture(scope="module")
def group():
    group = make_group()
    yield group
    group.close()


def token_logprobs(model: torch.nn.Module, group: TorchModelGroup, result, temperature: float) -> torch.Tensor:
    """The trainer's log-prob of each response token (``model``'s forward, the group's logit bias)."""
    ids = torch.tensor([result.prompt_ids + result.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(result.prompt_ids) - 1: -1].float() + group.policy.logit_bias
    return (logits / temperature).log_softmax(-1).gather(-1, ids[0, len(result.prompt_ids):, None]).squeeze(-1)


@pytest.mark.slow
def test_vllm_samples_the_trainers_policy_in_another_process(group):
    engine = group.sampler.engine
    assert group.sampler.kind == "vllm" and engine.pid != os.getpid() and engine.stats()["vllm"]
    for temperature in (1.0, 0.7):
        results = group.generate(requests(temperature=temperature))
        assert {r.weight_version for r in results} == {0} and all(r.logprobs_exact for r in results)
        for r in results:
            assert len(r.response_ids) == len(r.logprobs) >= 1 and len(r.response_ids) <= 8
            mine = token_logprobs(group.policy.model, group, r, temperature)
            assert (mine - torch.tensor(r.logprobs)).abs().max().item() < 1e-4
    assert group.sampler.checked is not None and group.sampler.checked < 1e-4  # the first batch, checked


@pytest.mark.slow
def test_streaming_stop_strings_and_forced_openings(group):
    shown: list[str] = []
    plain, streamed, stopped, forced = group.generate([
        GenRequest(prompt="S:abc", generation=gen(24), greedy=True),
        GenRequest(prompt="S:abc", generation=gen(24), greedy=True, progress=shown.append),
        GenRequest(prompt="S:abc", generation=gen(24), greedy=True, stop=["a"]),
        GenRequest(prompt="S:abc", generation=gen(24), greedy=True, response_prefix="gh"),
    ])
    assert streamed.response_ids == plain.response_ids and shown and shown[-1] == streamed.text == plain.text
    assert len(shown) > 2  # the text grew while it was sampled, not in one piece at the end
    if "a" in plain.text:  # greedy from a random-init model: usually, not by construction
        assert stopped.stop == "a" and stopped.text == plain.text[: plain.text.index("a")]
        assert len(stopped.response_ids) < len(plain.response_ids)
    assert forced.forced_ids and forced.prompt_ids[-len(forced.forced_ids):] == forced.forced_ids


@pytest.mark.slow
def test_an_update_reaches_the_engine_in_place_and_the_prefix_cache_is_reset(group):
    pid = group.sampler.engine.pid
    before = group.generate(requests())
    version = group.weight_version
    metrics = group.update(turns_from(before, advantage=1.0))
    assert metrics["weight_version"] == version + 1 and metrics["weight_sync_s"] > 0
    after = group.generate(requests())
    assert group.sampler.engine.pid == pid and {r.weight_version for r in after} == {version + 1}
    for r in after:  # the long prompt's prefix was cached under the old weights: its log-probs are the new ones
        assert sum(r.logprobs) == pytest.approx(response_logprob(group, r), abs=1e-4)
    assert [response_logprob(group, r) for r in before] != pytest.approx([sum(r.logprobs) for r in before], abs=1e-3)


@pytest.mark.slow
def test_without_the_reset_the_cached_prefix_serves_the_old_weights(group):
    """The control: what the reset prevents. The engine is given other weights but keeps its cache once."""
    engine = group.sampler.engine
    settings = SampleSettings(max_tokens=8, stop_token_ids=group.policy.eos_ids, banned=group.sampler.banned)
    prompt = group.generate([GenRequest(prompt=LONG, generation=gen(8))])[0].prompt_ids  # its blocks now cached
    moved = copy.deepcopy(group.policy.model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.1)

    def gap(reset: bool) -> float:
        engine.publish(moved, group.weight_version, reset_prefix_cache=reset)
        [tokens], [logprobs], _ = engine.sample([prompt], settings, [7])
        result = type("R", (), {"prompt_ids": prompt, "response_ids": tokens})
        return (token_logprobs(moved, group, result, 1.0) - torch.tensor(logprobs)).abs().max().item()

    try:
        assert gap(reset=False) > 0.05
        assert gap(reset=True) < 1e-4
    finally:
        group.sampler.publish(group.policy, group.weight_version)


@pytest.mark.slow
def test_a_resumed_group_samples_the_same_tokens(group, tmp_path):
    group.save(tmp_path)
    first = group.generate(requests())
    group.load(tmp_path)
    again = group.generate(requests())
    assert [r.response_ids for r in again] == [r.response_ids for r in first]
    assert [lp for r in again for lp in r.logprobs] == pytest.approx([lp for r in first for lp in r.logprobs], abs=1e-6)


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.slow
def test_nothing_in_the_engine_process_unpickles_even_a_planted_weight_file(group, tmp_path):
    """Last in the module: the engine is left with a failed reload."""
    pickle.loads(pickle.dumps(Payload(tmp_path / "control")))
    assert (tmp_path / "control").exists()  # the payload runs code when unpickled
    assert group.sampler.engine.stats()["unpickled"] == 0  # every request so far: JSON and safetensors only
    planted = tmp_path / "planted"
    planted.mkdir()
    for name in ("model.safetensors", "pytorch_model.bin", "model.pt"):
        torch.save(Payload(tmp_path / "unpickled"), planted / name)
    with pytest.raises(EngineError, match="load_weights"):
        group.sampler.engine.load(planted, 99)
    assert not (tmp_path / "unpickled").exists() and group.sampler.engine.stats()["unpickled"] == 0


def test_the_engine_refuses_to_start_where_pickle_is_allowed(monkeypatch, capsys):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    assert vllm_worker.main(["-1", "-1", str(os.getpid())]) == 2
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" in capsys.readouterr().err


def test_what_the_engine_cannot_serve_is_refused_before_it_starts():
    with pytest.raises(ValidationError, match="head sizes .* heads are 16 wide"):
        TorchOptions.model_validate({"tiny": {**TINY, "num_heads": 4}, "sampler": "vllm"})
    with pytest.raises(UserError, match="models.m.lora"):
        config = ModelGroupConfig(options={"tiny": TINY, "sampler": "vllm"}, lora={"r": 2})
        TorchModelGroup.build(group_spec(config, adapters=["a"]))



def test_the_default_kv_cache_holds_the_batch_within_its_bounds():
    per_token = 172 * 1024  # Qwen2-0.5B's layers, no grouped heads, float32
    assert default_kv_cache_bytes(1024, 512, 256) == KV_CACHE_FLOOR  # the tiny model: 128 MiB would do
    assert default_kv_cache_bytes(per_token, 64, 256) == 256 * 64 * per_token  # 256 rows of 64 tokens
    assert default_kv_cache_bytes(per_token, 512, 256) == KV_CACHE_CEILING  # 22 GB asked: capped
    huge = default_kv_cache_bytes(per_token, 32768, 256)
    assert huge == 2 * 32768 * per_token > KV_CACHE_CEILING  # vLLM must fit two full-length sequences
