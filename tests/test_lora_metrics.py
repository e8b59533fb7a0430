"""A LoRA group (one base, one adapter per role) reports its training metrics per adapter besides the group's."""

from __future__ import annotations

import json

import pytest

from tests.test_torch_backend import PROMPTS, gen, make_group, set_algorithm, turns_from
from unimas.cli import main
from unimas.config.schema import LoraConfig
from unimas.groups.base import GenRequest
from unimas.groups.torch.learner import ADAPTER_METRICS


def test_each_adapter_gets_its_own_loss_tokens_and_gradient_norm():
    group = make_group(adapters=["x", "y"], lora=LoraConfig(r=4), lr=1e-2)
    results = group.generate([GenRequest(p, gen(4)) for p in PROMPTS])
    turns = turns_from(results[:2], advantage=1.0, adapter="x") + turns_from(results[2:], advantage=-1.0, adapter="y")
    metrics = group.update(turns)
    for adapter, own in (("x", turns[:2]), ("y", turns[2:])):
        assert {f"adapter/{adapter}/{key}" for key in ADAPTER_METRICS} <= set(metrics)
        assert metrics[f"adapter/{adapter}/tokens"] == sum(len(t.response_ids) for t in own)
        assert metrics[f"adapter/{adapter}/grad_norm"] > 0
    assert metrics["adapter/x/tokens"] + metrics["adapter/y/tokens"] == metrics["tokens"]
    # opposite advantages: the two adapters' policy losses have opposite signs; the group's lies between
    assert metrics["adapter/x/policy_loss"] < metrics["policy_loss"] < metrics["adapter/y/policy_loss"]
    # the adapters' weights are disjoint: their squared norms add up to the group's (before clipping)
    total = (metrics["adapter/x/grad_norm"] ** 2 + metrics["adapter/y/grad_norm"] ** 2) ** 0.5
    assert total == pytest.approx(metrics["grad_norm"], rel=1e-4)


def test_an_adapter_absent_from_a_mini_batch_is_averaged_over_the_batches_it_was_in():
    group = make_group(adapters=["x", "y"], lora=LoraConfig(r=4))
    results = group.generate([GenRequest(p, gen(4)) for p in PROMPTS[:4]])
    set_algorithm(group, mini_batch_size=2)  # the one y turn is in one of the two mini-batches
    metrics = group.update(turns_from(results[:3], adapter="x") + turns_from(results[3:], adapter="y"))
    # advantage 1, ratio ~1: each mini-batch's loss is ~ -1; a mean over both steps would halve y's
    assert metrics["adapter/y/policy_loss"] == pytest.approx(-1.0, abs=0.05)
    assert metrics["adapter/x/policy_loss"] == pytest.approx(-1.0, abs=0.05)
    only_x = group.update(turns_from(results, adapter="x"))
    assert "adapter/y/policy_loss" not in only_x
    assert only_x["adapter/x/policy_loss"] == pytest.approx(only_x["policy_loss"], rel=1e-5, abs=1e-7)


def test_a_group_without_adapters_reports_no_adapter_keys():
    group = make_group()
    results = group.generate([GenRequest(p, gen(4)) for p in PROMPTS])
    assert not any(key.startswith("adapter/") for key in group.update(turns_from(results)))


def test_per_adapter_keys_reach_metrics_jsonl(repo, tmp_path, capsys):
    run = tmp_path / "run"
    settings = ["trainer.steps=2", "trainer.tasks_per_step=4", "trainer.eval_size=4", "logging.report=false",
                "trainer.stop_at_accuracy=null"]
    code = main(["train", str(repo / "examples" / "quickstart_lora.yaml"), "--run-dir", str(run),
                 *[a for s in settings for a in ("--set", s)]])
    assert code == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records[1:]:
        for adapter in ("speaker", "listener"):
            for key in ADAPTER_METRICS:
                assert isinstance(record[f"group/base/adapter/{adapter}/{key}"], float)
        assert "group/base/policy_loss" in record and "group/base/grad_norm" in record  # the group's stay
        assert record["group/base/adapter/speaker/tokens"] + record["group/base/adapter/listener/tokens"] \
            == record["group/base/tokens"]
