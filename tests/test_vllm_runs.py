"""Whole runs with torch groups sampling through vLLM (``options.sampler: vllm``).

Two groups train with an engine each, the asynchronous pipeline on (their first batches checked against
the trainer, both versions advancing), and a gateway agent streams its
answers from vLLM (chat completions and the Responses API) with the recorded
ids equal to the answer asked for without streaming.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLES
from tests.test_gateway import run_episodes
from tests.test_gateway_controls import agent_team, check_streamed_episode
from unimas.cli import main

HEADS = {"hidden_size": 64, "num_heads": 2}
"""Heads 32 wide: the narrowest vLLM's CPU attention takes."""


@pytest.mark.slow
def test_two_groups_train_with_an_engine_each(tmp_path):
    overrides = ["trainer.steps=2", "trainer.tasks_per_step=4", "algorithm.group_size=4", "trainer.eval_every=0",
                 "algorithm.max_staleness=1"]  # the engines sample the next step while the groups update
    for group in ("speaker_model", "listener_model"):
        overrides += [f"models.{group}.options.tiny.num_heads=2", f"models.{group}.options.sampler=vllm"]
    code = main(["train", str(EXAMPLES / "quickstart_separate.yaml"), "--run-dir", str(tmp_path / "run"),
                 *[arg for o in overrides for arg in ("--set", o)]])
    assert code == 0
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("step", 0) >= 1]
    for group in ("speaker_model", "listener_model"):
        assert [s[f"group/{group}/weight_version"] for s in steps] == [1.0, 2.0]
        checked = [s[f"group/{group}/vllm_logprob_diff"] for s in steps if f"group/{group}/vllm_logprob_diff" in s]
        assert len(checked) == 1 and checked[0] < 1e-3  # once per run, on the first batch
        assert all(s[f"group/{group}/weight_sync_s"] > 0 for s in steps)


@pytest.mark.slow
def test_a_gateway_agent_streams_from_vllm():
    """Greedy, so every request of the episode samples the same answer, streamed or not."""
    tree = agent_team("unused", "tests.test_gateway_controls:streaming_agent", max_new_tokens=16)
    tree["models"]["shared"]["options"] = {"tiny": {"alphabet": "abcdefgh: ", **HEADS, "num_layers": 2,
                                                    "max_positions": 128}, "sampler": "vllm"}
    tree["trainer"] = {"seed": 2}  # a random-init model whose greedy answer is 16 characters, not EOS at once
    [trajectory], _ = run_episodes(tree, [{"target": "e: f g", "answer": "x"}], greedy=True)
    _, plain, _, stopped, responded = check_streamed_episode(trajectory, logprob_tolerance=1e-5)
    assert {t.weight_version for t in trajectory.turns()} == {0}
    assert stopped.response_ids == plain.response_ids[: len(stopped.response_ids)]
    assert responded.text == plain.text and responded.response_ids == plain.response_ids

