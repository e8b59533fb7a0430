"""Update order through the trainer: sequential per-role stages on a real shared model, and config mistakes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLES
from unimas.cli import main

SHORT = ["trainer.steps=2", "trainer.tasks_per_step=4", "trainer.eval_size=4", "trainer.stop_at_accuracy=null",
         "algorithm.group_size=4", "logging.report=false"]


def train(tmp_path, *extra):
    args = ["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(tmp_path)]
    for item in [*SHORT, *extra]:
        args += ["--set", item]
    code = main(args)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] if code == 0 else []
    return code, records


def test_reverse_execution_updates_a_shared_model_once_per_role_per_step(tmp_path):
    code, parallel = train(tmp_path / "parallel")
    assert code == 0 and parallel[-1]["group/shared/weight_version"] == 2  # one update per step
    code, sequential = train(tmp_path / "sequential", "algorithm.update_order={name: reverse_execution}")
    assert code == 0
    assert [r["group/shared/weight_version"] for r in sequential[1:]] == [2, 4]  # listener stage, then speaker
    assert sequential[-1]["group/shared/staleness_max"] == 0  # the version counter is the last stage's, not a mean


def test_reverse_execution_with_ratio_clip_scores_the_shared_model_between_stages(tmp_path):
    code, records = train(tmp_path, "algorithm.update_order={name: reverse_execution, params: {ratio_clip: 0.2}}")
    assert code == 0
    assert [r["group/shared/weight_version"] for r in records[1:]] == [2, 4]


@pytest.mark.parametrize("setting, message", [
    ("algorithm.update_order={name: nope}", "unknown update order 'nope'"),
    ("algorithm.update_order={name: reverse_execution, params: {damp: -1}}",
     "algorithm.update_order.params.damp: Input should be greater than or equal to 0"),
    ("algorithm.update_order={name: reverse_execution, params: {ratio_clip: 1.5}}",
     "algorithm.update_order.params.ratio_clip: Input should be less than 1"),
    ("algorithm.rollout={name: entropy_branch, params: {trigger: sometimes}}",
     "algorithm.rollout.params.trigger: Input should be 'entropy' or 'mixed'"),
    ("algorithm.credit={name: hgpo, params: {beta: 1}}", "algorithm.credit.params.beta: unknown parameter"),
])
def test_algorithm_plugin_mistakes_are_user_errors(tmp_path, capsys, setting, message):
    code, _ = train(tmp_path, setting)
    assert code == 2
    assert message in capsys.readouterr().err
