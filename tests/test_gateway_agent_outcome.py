"""An agent hands unimas its own rewards in its outcome JSON, and `workflow.agent.function` imports a module that
sits next to the config (issue 22, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unimas.cli import main
from unimas.trajectory import read_jsonl

AGENT_MODULE = '''
from openai import AsyncOpenAI


async def run(task: dict, base_url: str) -> dict:
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    reply = await client.chat.completions.create(model="speaker", max_tokens=1,
                                                 messages=[{"role": "user", "content": task["target"]}])
    answer = reply.choices[0].message.content
    outcome = {"answer": answer}
    outcome.update(OUTCOME)
    return outcome
'''


def _config(tmp_path: Path, chat_model: Path, outcome: dict, rewards: str, module: str | None = None) -> Path:
    """A one-role agent workflow whose function lives in a module beside the config (not on sys.path); the module
    has a name of its own per test (an imported module stays in ``sys.modules``), or ``module`` when given."""
    folder = tmp_path / "project"
    folder.mkdir()
    name = f"outcome_agent_{tmp_path.name}"
    (folder / f"{module or name}.py").write_text(AGENT_MODULE.replace("OUTCOME", json.dumps(outcome)))
    config = folder / "agent.yaml"
    config.write_text(f"""
name: agent-outcome
models:
  shared: {{backend: torch, options: {{path: {chat_model}}}, optim: {{lr: 0.002}}}}
roles:
  speaker: {{model: shared, generation: {{max_new_tokens: 1, temperature: 1.0, require_eos: false}}}}
workflow:
  agent: {{function: "{name}:run", timeout_s: 60}}
data: {{name: signalling, params: {{targets: abcd}}}}
rewards:
{rewards}
algorithm: {{estimator: grpo, grouping: role, group_size: 2, loss: vanilla}}
trainer: {{steps: 1, seed: 0, tasks_per_step: 2, eval_every: 0, eval_size: 2, stop_at_accuracy: null}}
logging: {{console: false, report: false}}
""")
    return config


def _train(config: Path, run: Path) -> int:
    return main(["train", str(config), "--run-dir", str(run)])


def test_the_outcome_reward_reaches_every_trajectory(tmp_path, chat_model):
    config = _config(tmp_path, chat_model, {"reward": 0.7},
                     "  - {name: agent_outcome_reward, level: trajectory, weight: 1.0}")
    assert _train(config, tmp_path / "run") == 0
    trajectories = read_jsonl(tmp_path / "run/trajectories/train.jsonl")
    assert trajectories and not any(t.failed for t in trajectories)
    assert all(t.rewards["agent_outcome_reward"] == pytest.approx(0.7) for t in trajectories)
    metrics = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["reward/mean"] == pytest.approx(0.7)


def test_per_role_outcome_rewards_reach_their_role(tmp_path, chat_model):
    config = _config(tmp_path, chat_model, {"reward": 0.0, "rewards": {"speaker": 0.25}},
                     "  - {name: agent_outcome_reward, level: trajectory, weight: 1.0}\n"
                     "  - {name: agent_role_rewards, level: role, weight: 1.0}")
    assert _train(config, tmp_path / "run") == 0
    trajectories = read_jsonl(tmp_path / "run/trajectories/train.jsonl")
    assert trajectories and not any(t.failed for t in trajectories)
    assert all(t.rewards["agent_role_rewards"] == {"speaker": pytest.approx(0.25)} for t in trajectories)


def test_an_outcome_without_the_reward_fails_its_episodes_naming_the_field(tmp_path, chat_model, capsys):
    config = _config(tmp_path, chat_model, {"score": 1},
                     "  - {name: agent_outcome_reward, level: trajectory, weight: 1.0}")
    code = _train(config, tmp_path / "run")
    out = capsys.readouterr()
    assert code == 2  # every episode of the step failed the same way: a user mistake, named
    assert "'reward'" in out.err and "Traceback" not in out.err


def test_a_module_that_is_neither_on_the_path_nor_beside_the_config_names_both_places(tmp_path, chat_model, capsys):
    config = _config(tmp_path, chat_model, {"reward": 1.0},
                     "  - {name: agent_outcome_reward, level: trajectory, weight: 1.0}", module="elsewhere")
    code = main(["validate", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "workflow.agent.function" in err and "Traceback" not in err
    assert "config's directory" in err and str(config.parent) in err
