"""Every built-in method trains end to end (two real steps of the signalling game), through its config entry alone."""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.trajectory import read_jsonl

SHORT = ["trainer.steps=2", "trainer.tasks_per_step=4", "trainer.eval_size=4", "trainer.stop_at_accuracy=null",
         "algorithm.group_size=4", "trainer.sample_trajectories=64", "logging.report=false"]

METHODS = {
    "hgpo": ["algorithm.credit={name: hgpo, params: {alpha: 2.0}}", "algorithm.estimator=passthrough"],
    "gagpo": ["algorithm.credit={name: gagpo, params: {lam: 0.9}}", "algorithm.estimator=passthrough"],
    "counterfactual+branching": ["algorithm.credit={name: counterfactual}", "algorithm.estimator=passthrough",
                                 "algorithm.rollout={name: entropy_branch, params: {roots: 2, siblings: 1}}"],
    "gdpo": ["algorithm.credit={name: gdpo, params: {channels: [exact_match]}}", "algorithm.estimator=passthrough"],
    "adaptive_budget": ["algorithm.rollout={name: adaptive_budget, params: {probe: 2}}"],
    "replay": ["algorithm.replay={name: verified_successes, params: {revisit: 0.5}}",
               "algorithm.stale_turns=reweight"],
    "seeupo": ["algorithm.update_order={name: reverse_execution}"],
    "m2po": ["algorithm.loss=m2po"],
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_trains_end_to_end(tmp_path, method):
    args = ["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(tmp_path)]
    for item in SHORT + METHODS[method]:
        args += ["--set", item]
    assert main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all("group/shared/policy_loss" in r for r in records[1:]), records[-1].keys()
    episodes = read_jsonl(tmp_path / "trajectories" / "train.jsonl")
    if method == "counterfactual+branching":
        forks = [t for t in episodes if t.forked_from]
        assert forks and all(t.fork_turn == "listener#0" and t.turns()[0].replayed for t in forks)
    if method == "adaptive_budget":  # tasks whose probes all agree are dropped; none gets more than its budget
        per_task = {}
        for t in episodes:
            per_task.setdefault(t.task_id, []).append(t)
        assert all(2 <= len(group) <= 2 + 4 * 2 for group in per_task.values())
