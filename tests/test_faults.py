"""Fault injection: hung tools and workflows, sys.exit, short answers from a backend, NaN rewards, losses and
advantages, failure budgets. Each fault is survived per the config or stops the run cleanly, with counts in
metrics.jsonl and reasons in the trajectories; no non-finite value reaches an optimiser step."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.test_router import EchoTransport
from unimas.cli import main
from unimas.config.schema import RoleConfig
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.errors import ModelGroupError

ROLES = {"a": RoleConfig(model="m", template="A:{question}")}
TASK = {"question": "q"}


def run_controller(workflow, tools=None, episodes=3, **limits):
    router = Router(EchoTransport(), max_batch_size=64, max_wait_s=0.01)
    controller = Controller(workflow, ROLES, router, tools or {}, **limits)
    specs = [EpisodeSpec(f"e{i}", "t0", dict(TASK, index=i)) for i in range(episodes)]
    return asyncio.run(controller.run(specs))


def hung_sync_tool():
    while True:
        time.sleep(0.01)


async def hung_async_tool():
    await asyncio.Event().wait()


def exiting_tool():
    sys.exit(4)


async def tool_then_act(ctx, task):
    """Calls tool ``t``, then role ``a``: the episode must go on past whatever the tool did."""
    result = await ctx.tool("t")
    answer = await ctx.act("a")
    return {"tool_error": result.error, "answer": answer.text}


@pytest.mark.parametrize("tool", [hung_sync_tool, hung_async_tool, exiting_tool])
def test_a_tool_that_hangs_or_exits_is_an_error_on_its_node_and_the_episode_goes_on(tool):
    started = time.perf_counter()
    trajectories = run_controller(tool_then_act, {"t": tool}, tool_timeout_s=0.3)
    assert time.perf_counter() - started < 10
    for traj in trajectories:
        assert not traj.failed and traj.outcome["answer"]
        expected = "SystemExit" if tool is exiting_tool else "did not"
        assert expected in traj.outcome["tool_error"]


def test_a_workflow_that_never_returns_fails_its_episode_at_the_timeout():
    async def workflow(ctx, task):
        await ctx.act("a")
        if task["index"] == 1:
            await asyncio.Event().wait()
        return {"answer": "ok"}

    trajectories = run_controller(workflow, episode_timeout_s=0.3)
    assert [t.failed for t in trajectories] == [False, True, False]
    assert "the episode did not finish within 0.3 s" in trajectories[1].error


def test_sys_exit_in_a_workflow_fails_only_that_episode():
    async def workflow(ctx, task):
        if task["index"] == 0:
            sys.exit(3)
        return {"answer": (await ctx.act("a")).text}

    trajectories = run_controller(workflow)
    assert trajectories[0].failed and trajectories[0].error.startswith("SystemExit: 3")
    assert not trajectories[1].failed and not trajectories[2].failed


def test_keyboard_interrupt_in_user_code_still_stops_the_run():
    async def workflow(ctx, task):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_controller(workflow)


def test_a_backend_that_answers_too_few_results_is_a_group_error_not_a_hang():
    class Short(EchoTransport):
        async def generate(self, group, requests):
            return (await super().generate(group, requests))[:-1]

    async def workflow(ctx, task):
        return {"answer": (await ctx.act("a")).text}

    router = Router(Short(), max_batch_size=64, max_wait_s=0.01)
    specs = [EpisodeSpec(f"e{i}", "t0", TASK) for i in range(2)]
    with pytest.raises(ModelGroupError, match="returned 1 results for 2 requests"):
        asyncio.run(asyncio.wait_for(Controller(workflow, ROLES, router, {}).run(specs), 10))


# ---------------------------------------------------------------- whole runs

PLUGIN = '''
import math
import unimas

def sometimes_nan(trajectory, task):
    value = float(trajectory.outcome.get("answer") == task["answer"])
    return math.nan if task["target"] == "a" else value

def nan_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
    return (log_prob * response_mask).sum() * math.nan, {}

def nan_for_some(token_level_rewards, response_mask, index, config=None):
    scores = token_level_rewards.sum(-1)
    adv = scores - scores.mean()
    adv[::4] = math.nan
    return adv[:, None] * response_mask, adv[:, None] * response_mask

async def fails_in_training(ctx, task):
    if ctx.trajectory.episode_id.startswith("s"):
        raise RuntimeError("training-only bug")
    message = await ctx.act("speaker")
    guess = await ctx.act("listener", message=message)
    return {"answer": guess.parsed}

@unimas.hookimpl
def unimas_rewards():
    return {"sometimes_nan": sometimes_nan}

@unimas.hookimpl
def unimas_policy_losses():
    return {"nan_loss": nan_loss}

@unimas.hookimpl
def unimas_estimators():
    return {"nan_for_some": nan_for_some}

@unimas.hookimpl
def unimas_workflows():
    return {"fails_in_training": fails_in_training}
'''


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    module = f"faulty_plugin_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))

    def train(*settings: str, **changes) -> tuple[int, list[dict], str]:
        tree = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
        tree["plugins"] = [module]
        for section, values in changes.items():
            tree.setdefault(section, {}).update(values) if isinstance(values, dict) else tree.update({section: values})
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(tree))
        run = tmp_path / "run"
        base = ["trainer.steps=3", "trainer.tasks_per_step=4", "trainer.eval_size=4", "trainer.stop_at_accuracy=null",
                "logging.report=false"]
        args = ["train", str(config), "--run-dir", str(run)] + [a for s in [*base, *settings] for a in ("--set", s)]
        code = main(args)
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] \
            if (run / "metrics.jsonl").exists() else []
        return code, metrics, run

    return train


def finite(records):
    return all(math.isfinite(v) for r in records for v in r.values() if isinstance(v, float))


def test_nan_rewards_fail_their_episodes_and_the_run_goes_on(faulty, capsys):
    code, metrics, run = faulty(rewards=[{"name": "sometimes_nan", "level": "trajectory"}])
    assert code == 0
    assert any(r.get("episode/failures", 0) > 0 for r in metrics[1:]) and finite(metrics)
    reasons = [json.loads(line)["error"] for line in (run / "trajectories" / "eval.jsonl").read_text().splitlines()]
    assert any(e and "returned nan; rewards must be finite" in e for e in reasons)


def test_a_nan_loss_never_reaches_the_optimiser(faulty, capsys):
    code, metrics, run = faulty(algorithm={"loss": "nan_loss"})
    assert code == 0 and finite(metrics)
    assert all(r["group/shared/nonfinite_skipped"] == 1.0 for r in metrics[1:])
    assert all(r["group/shared/grad_norm"] == 0.0 for r in metrics[1:])
    first, last = metrics[0], metrics[-1]  # no step was taken: the greedy policy is unchanged
    assert first["eval/accuracy"] == last["eval/accuracy"]


def test_a_nan_loss_stops_the_run_when_asked(faulty, capsys):
    code, metrics, _ = faulty("trainer.on_nonfinite=stop", algorithm={"loss": "nan_loss"})
    err = capsys.readouterr().err
    assert code == 1 and "non-finite loss or gradient in model group(s) shared" in err and "Traceback" not in err


def test_nan_advantages_are_dropped_and_counted(faulty, capsys):
    code, metrics, _ = faulty(algorithm={"estimator": "nan_for_some"})
    assert code == 0 and finite(metrics)
    assert all(r["credit/nonfinite_advantages"] > 0 for r in metrics[1:])
    assert all(r["group/shared/nonfinite_skipped"] == 0.0 for r in metrics[1:])


def test_steps_over_the_failure_budget_skip_their_update_until_the_limit(faulty, capsys):
    code, metrics, _ = faulty("trainer.max_failed_steps=2", workflow={"name": "fails_in_training"})
    err = capsys.readouterr().err
    assert code == 1 and "2 step(s) over trainer.failure_budget in a row" in err and "Traceback" not in err
    assert [r["step"] for r in metrics] == [0, 1]
    assert metrics[1]["episode/over_budget"] == 1.0 and not any(k.startswith("group/shared/policy") for k in metrics[1])


def test_a_run_writes_nothing_outside_its_run_directory(tmp_path, monkeypatch):
    """Run name, group names and adapter names all become path components; none may leave the run directory."""
    monkeypatch.chdir(tmp_path)
    tree = yaml.safe_load((EXAMPLES / "quickstart_lora.yaml").read_text())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree))
    before = {p for p in tmp_path.rglob("*")}
    args = ["train", "config.yaml", "--run-dir", "run", "--set", "trainer.steps=1", "--set", "trainer.tasks_per_step=2",
            "--set", "trainer.eval_size=2", "--set", "trainer.save_every=1"]
    assert main(args) == 0
    written = {p for p in tmp_path.rglob("*")} - before
    assert written and all(p == tmp_path / "run" or (tmp_path / "run") in p.parents for p in written)
    adapters = {p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*/*/adapters/*")}
    assert adapters == set(tree["roles"][r]["adapter"] for r in tree["roles"])
