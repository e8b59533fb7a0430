"""One run with all three kinds of model group: a verl group, a torch group and a frozen OpenAI-endpoint role.

The debate workflow (examples/debate_selfplay_cpu.yaml's shape) with debater A
on a verl group, debater B on a torch group (both trained, the built test chat
model) and the judge behind an OpenAI-compatible endpoint on 127.0.0.1 (a test
stand-in that answers A or B). Checks that every step updates both trained
groups (each with its own metrics and advancing weight version), that the
judge's answers reach the rewards, and that the judge's group never trains.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.loopback import completions_server
from unimas.cli import main


class Judge:
    """Stand-in for a served judge model (a test fixture): picks a winner from the prompt's length."""

    requests = 0

    @classmethod
    def answer(cls, path, body):
        assert path == "/v1/completions" and body["model"] == "judge-v1"
        cls.requests += 1
        return {"text": "A" if len(body["prompt"]) % 2 else "B", "finish_reason": "stop"}


@pytest.mark.slow
def test_verl_torch_and_api_groups_train_in_one_run(tmp_path, chat_model):
    tree = yaml.safe_load((EXAMPLES / "debate_selfplay_cpu.yaml").read_text())
    with completions_server(Judge.answer) as endpoint:
        tree["models"] = {
            "verl_policy": {"backend": "verl", "options": {"path": str(chat_model)}, "optim": {"lr": 1e-3}},
            "torch_policy": {"backend": "torch", "options": {"path": str(chat_model)}, "optim": {"lr": 1e-3}},
            "judge_model": {"backend": "openai", "trainable": False,
                            "options": {"endpoint": endpoint, "api_model": "judge-v1"}},
        }
        tree["roles"]["debater_a"]["model"] = "verl_policy"
        tree["roles"]["debater_b"].update(model="torch_policy", trainable=True)
        tree["trainer"].update(steps=3, tasks_per_step=4, eval_every=0, save_every=0)
        tree["algorithm"].update(group_size=2)
        config = tmp_path / "mixed.yaml"
        config.write_text(yaml.safe_dump(tree))
        assert main(["validate", str(config)]) == 0
        assert main(["train", str(config), "--run-dir", str(tmp_path / "run"), "--set", "logging.report=false",
                     "--set", "logging.console=false"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "group/verl_policy/policy_loss" in r]
    assert len(trained) == 3
    assert [r["group/verl_policy/weight_version"] for r in trained] == [1.0, 2.0, 3.0]
    assert all("group/torch_policy/policy_loss" in r for r in trained)
    assert not any(k.startswith("group/judge_model/") and "loss" in k for r in records for k in r)
    assert Judge.requests >= 3 * 4 * 2  # every episode was judged
    assert any(r["role/debater_a/reward_std"] > 0 for r in trained)  # the judge's verdicts reached the rewards
