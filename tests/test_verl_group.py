"""The verl model group on CPU: verl's FSDP2 engine (gloo, one rank) and unimas's rollout, two groups in one process.

Checks what a broken backend gets wrong: trainer log-probs vs a plain HF forward
at per-row temperatures, the update direction, that after every weight sync the
rollout scores tokens exactly as the trainer and reports the new version, that an
update of one group leaves the other's weights alone, and that save -> fresh group
-> load continues bit-identically.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from unimas.config.loading import config_from_dict
from unimas.config.schema import GenerationConfig
from unimas.contract.registry import build_registry
from unimas.groups.base import GenRequest, TrainTurn
from unimas.runtime.build import build_group

TINY = {"architecture": "qwen2", "alphabet": "SL:abcdefgh", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
        "max_positions": 32}
GEN = GenerationConfig(max_new_tokens=3, temperature=1.0, require_eos=False)


def config(**algorithm):
    group = {"backend": "verl", "options": {"tiny": TINY}, "optim": {"lr": 0.01}}
    return config_from_dict({
        "name": "verl_group", "models": {"a": group, "b": group},
        "roles": {"speaker": {"model": "a", "template": "S:{target}"},
                  "listener": {"model": "b", "template": "L:{message}"}},
        "workflow": {"name": "signalling"}, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "group_size": 4, "entropy_coef": 0.01, **algorithm},
        "trainer": {"steps": 10, "seed": 3},
    })


@pytest.fixture(scope="module")
def setup():
    cfg, registry = config(), build_registry()
    return cfg, registry, {name: build_group(cfg, registry, name) for name in ("a", "b")}


def requests(prompts=("S:a", "S:bc", "L:h", "S:ddd")):
    return [GenRequest(prompt=p, generation=GEN) for p in prompts]


def turns_of(results, advantages, temperature=1.0):
    return [TrainTurn(r.prompt_ids, r.response_ids, r.logprobs, adv, rollout_logprobs_exact=r.logprobs_exact,
                      temperature=temperature, weight_version=r.weight_version)
            for r, adv in zip(results, advantages)]


FIXED = [TrainTurn([4, 6, 7], [8, 9, 10], [], 0.0, temperature=0.7), TrainTurn([5, 6], [11, 1], [], 0.0,
                                                                                   temperature=1.3)]


def test_trainer_logprobs_match_hf_at_each_rows_temperature(setup):
    _, _, groups = setup
    group = groups["b"]
    model = AutoModelForCausalLM.from_pretrained(group.configs.actor.model_config.local_path, dtype=torch.float32)
    for turn, values in zip(FIXED, group.trainer_logprobs(FIXED)):
        ids = torch.tensor([turn.prompt_ids + turn.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(turn.prompt_ids) - 1:-1] / turn.temperature
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(turn.response_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(values), expected, atol=1e-5)
    assert group.score(FIXED) == pytest.approx([sum(v) for v in group.trainer_logprobs(FIXED)])


def test_update_moves_logprobs_syncs_the_rollout_and_leaves_the_other_group_alone(setup):
    _, _, groups = setup
    a, b = groups["a"], groups["b"]
    b_before = b.trainer_logprobs(FIXED)
    b_rollout_before = b.rollout.logprobs([t.prompt_ids for t in FIXED], [t.response_ids for t in FIXED], [1.0, 1.0])
    version = a.weight_version
    results = a.generate(requests())
    assert all(r.weight_version == version and r.logprobs_exact for r in results)
    turns = turns_of(results, [1.0, -1.0, 1.0, -1.0])
    before = a.trainer_logprobs(turns)
    metrics = a.update(turns)
    assert metrics["rollout_logprob_diff"] < 1e-5  # the rollout sampled with the trainer's weights
    assert a.weight_version == version + 1 and a.rollout.weight_version == version + 1
    assert a.last_sync_diff is not None and a.last_sync_diff <= 1e-5
    after = a.trainer_logprobs(turns)
    change = [sum(x) - sum(y) for x, y in zip(after, before)]
    assert change[0] > 0 and change[2] > 0 and change[1] < 0 and change[3] < 0
    served = a.rollout.logprobs([t.prompt_ids for t in turns], [t.response_ids for t in turns], [1.0] * 4)
    assert max(abs(x - y) for row, other in zip(after, served) for x, y in zip(row, other)) <= 1e-5
    assert all(r.weight_version == version + 1 for r in a.generate(requests()))
    assert b.trainer_logprobs(FIXED) == b_before
    assert b.rollout.logprobs([t.prompt_ids for t in FIXED], [t.response_ids for t in FIXED],
                              [1.0, 1.0]) == b_rollout_before
    assert set(metrics) >= {"policy_loss", "entropy", "grad_norm", "lr", "tokens", "update_time_s"}
    assert metrics["lr"] == pytest.approx(0.01) and metrics["tokens"] == sum(len(t.response_ids) for t in turns)


def test_turns_of_an_older_version_train_with_the_truncated_importance_ratio(setup):
    _, _, groups = setup
    a = groups["a"]
    late = turns_of(a.generate(requests()), [1.0, -1.0, 1.0, -1.0])
    a.update(turns_of(a.generate(requests()), [1.0, 1.0, -1.0, -1.0]))  # the weights move on
    assert all(t.weight_version == a.weight_version - 1 for t in late)
    proximal = a.trainer_logprobs(late)
    cap = a.spec.algorithm.importance_cap
    ratios = [min(math.exp(p - b), cap) for t, row in zip(late, proximal) for p, b in zip(row, t.rollout_logprobs)]
    metrics = a.update(late)
    assert metrics["stale_turns"] == 4.0 and metrics["weight_version"] == float(a.weight_version)
    assert metrics["importance_weight"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-5)
    assert metrics["importance_weight"] != 1.0
    fresh = a.update(turns_of(a.generate(requests()), [1.0, -1.0, 1.0, -1.0]))
    assert fresh["stale_turns"] == 0.0 and fresh["importance_weight"] == 1.0


def test_generation_runs_while_the_group_updates(setup):
    """The rollout has its own weights: generating does not wait for the training lock (asynchronous pipeline)."""
    import threading

    _, _, groups = setup
    a = groups["a"]
    done = threading.Event()
    with a._train_lock:  # an update in progress
        worker = threading.Thread(target=lambda: (a.generate(requests()), done.set()))
        worker.start()
        assert done.wait(timeout=60)
    worker.join()


def steps(group, count: int) -> list:
    """Sample, update, repeat: everything a resumed run must reproduce."""
    trace = []
    for _ in range(count):
        results = group.generate(requests())
        metrics = group.update(turns_of(results, [0.5, -1.0, 1.0, -0.5], temperature=1.0))
        trace.append(([r.response_ids for r in results], [r.logprobs for r in results],
                      {k: v for k, v in metrics.items() if k != "update_time_s"}))
    return trace + [group.trainer_logprobs(FIXED)]


def test_save_then_load_into_a_fresh_group_continues_bit_identically(setup, tmp_path):
    cfg, registry, groups = setup
    a = groups["a"]
    a.save(tmp_path / "a")
    saved_version = a.weight_version
    expected = steps(a, 2)
    fresh = build_group(cfg, registry, "a")
    assert fresh.trainer_logprobs(FIXED) != a.trainer_logprobs(FIXED)
    fresh.load(tmp_path / "a")
    assert fresh.weight_version == saved_version and fresh.rollout.weight_version == saved_version
    assert steps(fresh, 2) == expected
    assert (tmp_path / "a" / "verl_actor" / "huggingface" / "config.json").exists()


def test_kl_to_a_forward_only_reference_that_keeps_the_initial_weights():
    group = build_group(config(kl_coef=0.1), build_registry(), "a")
    assert group.reference is not None
    initial = group.trainer_logprobs(FIXED)
    kl = [group.update(turns_of(group.generate(requests()), [1.0, -1.0, 1.0, -1.0]))["kl"] for _ in range(2)]
    assert kl[0] == 0.0 < kl[1]  # the first update starts at the reference; the second has moved away from it
    assert group.trainer_logprobs(FIXED, reference=True) == initial
    assert group.trainer_logprobs(FIXED) != initial


def test_a_frozen_group_generates_at_version_zero_and_refuses_updates(tmp_path):
    tree = config()
    tree.models["b"] = tree.models["b"].model_copy(update={"trainable": False})
    frozen = build_group(tree, build_registry(), "b")
    assert frozen.actor is None and frozen.reference is None
    results = frozen.generate(requests())
    assert all(r.weight_version == 0 and r.response_ids for r in results)
    with pytest.raises(RuntimeError, match="frozen"):
        frozen.update(turns_of(results, [1.0] * len(results)))
    frozen.save(tmp_path / "b")
    again = frozen.generate(requests())
    frozen.load(tmp_path / "b")
    assert [r.response_ids for r in frozen.generate(requests())] == [r.response_ids for r in again]
