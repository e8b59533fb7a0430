"""``ctx.metric``: a workflow's own numbers, aggregated per step into every metrics sink as ``workflow/<name>``."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
import yaml

from tests.test_router import EchoTransport
from unimas.cli import main
from unimas.config.schema import RoleConfig
from unimas.controller.context import WorkflowMetricError
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.output.metrics import workflow_metrics
from unimas.trajectory import GraphTrajectory

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

PLUGIN = '''
import unimas


def group_index(ctx):
    return int(ctx.trajectory.episode_id.rsplit("-", 1)[1][1:])  # s3-t1-g5 -> 5, eval0-t1-k0 -> 0


async def measured(ctx, task):
    message = await ctx.act("speaker")
    guess = await ctx.act("listener", message=message)
    if ctx.trajectory.episode_id.startswith("eval"):
        ctx.metric("eval_only", 2)
    else:
        ctx.metric("group_index", group_index(ctx))
        ctx.metric("rounds", 2)
        ctx.metric("rounds", 4.0)  # twice in one episode: the episode counts with the mean, 3
        if group_index(ctx) == 0:
            ctx.metric("first_of_group", True)
    return {"answer": guess.parsed}


async def nan_for_some(ctx, task):
    message = await ctx.act("speaker")
    guess = await ctx.act("listener", message=message)
    if ctx.trajectory.episode_id.startswith("s") and group_index(ctx) == 0:
        ctx.metric("score", float("nan"))
    return {"answer": guess.parsed}


async def nan_always(ctx, task):
    ctx.metric("score", float("nan"))
    return {}


@unimas.hookimpl
def unimas_workflows():
    return {"measured": measured, "nan_for_some": nan_for_some, "nan_always": nan_always}
'''


@pytest.fixture
def train(tmp_path, monkeypatch):
    """``train(workflow, *sets) -> (exit code, metrics records, run dir)``: the quickstart with a plugin workflow."""
    module = f"metric_plugin_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))

    def run(workflow: str, *sets: str) -> tuple[int, list[dict], Path]:
        tree = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
        tree.update(plugins=[module], workflow={"name": workflow})
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(tree))
        run_dir = tmp_path / "run"
        settings = ["trainer.steps=2", "trainer.tasks_per_step=4", "trainer.eval_size=4", "trainer.eval_every=1",
                    "trainer.stop_at_accuracy=null", "logging.report=false", "logging.tensorboard=true", *sets]
        code = main(["train", str(config), "--run-dir", str(run_dir), *[a for s in settings for a in ("--set", s)]])
        path = run_dir / "metrics.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return code, records, run_dir

    return run


def test_logged_values_reach_metrics_jsonl_as_step_means_with_counts(train, capsys):
    code, records, run_dir = train("measured")
    assert code == 0
    step0, *steps = records
    assert step0["eval/workflow/eval_only"] == 2.0 and step0["eval/workflow/eval_only/count"] == 4.0
    assert not any(key.startswith("workflow/") for key in step0)
    for record in steps:
        episodes = 4 * 8  # tasks_per_step x group_size
        assert record["workflow/group_index"] == pytest.approx(3.5)  # mean of 0..7 per task
        assert record["workflow/group_index/count"] == episodes
        assert record["workflow/rounds"] == pytest.approx(3.0) and record["workflow/rounds/count"] == episodes
        assert record["workflow/first_of_group"] == 1.0 and record["workflow/first_of_group/count"] == 4
        assert record["eval/workflow/eval_only"] == 2.0
    # the other sinks get the same records: TensorBoard has the scalars
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert "workflow/group_index" in events.Tags()["scalars"]
    # trajectory files keep the values, and the step beside the outcome (the outcome is the workflow's own)
    episode = json.loads((run_dir / "trajectories" / "train.jsonl").read_text().splitlines()[0])
    assert episode["step"] == 1 and set(episode["outcome"]) == {"answer"}
    assert episode["metrics"]["rounds"] == [2.0, 4.0]


def test_the_asynchronous_pipeline_logs_each_step_from_its_own_episodes(train, capsys):
    code, records, _ = train("measured", "algorithm.max_staleness=1", "trainer.steps=3", "trainer.eval_every=0")
    assert code == 0
    assert [r["workflow/group_index/count"] for r in records[1:]] == [32.0, 32.0, 32.0]
    assert all(r["workflow/group_index"] == pytest.approx(3.5) for r in records[1:])


def test_a_non_finite_value_fails_its_episode_and_the_run_goes_on(train, capsys):
    code, records, run_dir = train("nan_for_some", "trainer.sample_trajectories=32")
    assert code == 0, capsys.readouterr().err
    assert [r["episode/failures"] for r in records[1:]] == [4.0, 4.0]  # group index 0 of each of the 4 tasks
    errors = [json.loads(line)["error"] for line in (run_dir / "trajectories" / "train.jsonl").read_text().splitlines()]
    failed = [e for e in errors if e]
    assert failed and all("ctx.metric('score', nan) in workflow 'nan_for_some'" in e for e in failed)
    assert all("finite" in e and "metric_plugin_" in e for e in failed)  # the user's file and line


def test_a_value_bad_in_every_episode_stops_with_one_clear_error(train, capsys):
    code, _, _ = train("nan_always")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "every one of the 4 evaluation episodes failed" in err
    assert "ctx.metric('score', nan) in workflow 'nan_always': the value must be a finite real number" in err


ROLES = {"solo": RoleConfig(model="a", template="Q:{q}")}


def _episode(body) -> GraphTrajectory:
    async def workflow(ctx, task):
        await ctx.act("solo")
        body(ctx)
        return {}

    controller = Controller(workflow, ROLES, Router(EchoTransport(), 8, 1.0), {}, workflow_label="workflow 'probe'")
    return asyncio.run(controller.run([EpisodeSpec("e0", "t0", {"q": "x"})]))[0]


@pytest.mark.parametrize("name, value, why", [
    ("has/slash", 1.0, "a metric name is 1 to 64 letters"),
    ("", 1.0, "a metric name"),
    ("x" * 65, 1.0, "a metric name"),
    (3, 1.0, "a metric name"),
    ("acc", "0.5", "must be a finite real number"),
    ("acc", math.inf, "must be a finite real number"),
    ("acc", None, "must be a finite real number"),
    ("acc", 10 ** 400, "must be a finite real number"),
])
def test_bad_names_and_values_are_the_workflows_error(name, value, why):
    trajectory = _episode(lambda ctx: ctx.metric(name, value))
    assert trajectory.failed and trajectory.error.startswith(WorkflowMetricError.__name__)
    assert "in workflow 'probe'" in trajectory.error and why in trajectory.error
    assert trajectory.metrics == {}


def test_numbers_of_any_real_type_are_kept_as_floats():
    import numpy as np

    trajectory = _episode(lambda ctx: [ctx.metric("n", v) for v in (1, 2.5, np.float32(0.5), np.int64(4), False)])
    assert not trajectory.failed and trajectory.metrics == {"n": [1.0, 2.5, 0.5, 4.0, 0.0]}
    assert all(type(v) is float for v in trajectory.metrics["n"])
    again = GraphTrajectory.from_json(trajectory.to_json())  # the async pipeline keeps pending episodes as JSON
    assert again.metrics == trajectory.metrics


def test_aggregation_weighs_each_episode_once():
    a, b, c = GraphTrajectory("a", "t"), GraphTrajectory("b", "t"), GraphTrajectory("c", "t")
    a.metrics, b.metrics = {"x": [1.0, 3.0]}, {"x": [5.0], "y": [1.0]}
    assert workflow_metrics([a, b, c]) == {"workflow/x": 3.5, "workflow/x/count": 2.0,
                                           "workflow/y": 1.0, "workflow/y/count": 1.0}


def test_old_trajectory_files_keep_their_step():
    old = {"episode_id": "e", "task_id": "t", "task": {}, "outcome": {"_step": 7}, "error": None, "rewards": {},
           "started": 0.0, "ended": 0.0, "nodes": [], "edges": []}
    assert GraphTrajectory.from_dict(old).step == 7
