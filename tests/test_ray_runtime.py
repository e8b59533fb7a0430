"""`runtime: ray` against a real local Ray instance (one per module, no external cluster).

Each model group is a Ray actor; these tests check that the Ray runtime is a
twin of the local one (same metrics for the same seed), that each actor got
the resources its group asked for, that only thin records cross the star,
that group updates overlap, and what happens when an actor is killed mid-run
(both with and without ``runtime.restart_failed_groups``) or the driver gets
Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel

ray = pytest.importorskip("ray")

from tests.conftest import EXAMPLES, REPO, release_leftover_ray  # noqa: E402
from unimas.cli import main  # noqa: E402
from unimas.config.schema import ExperimentConfig, RuntimeConfig
from unimas.config.loading import load_config  # noqa: E402
from unimas.controller.episodes import Controller  # noqa: E402
from unimas.controller.specs import EpisodeSpec
from unimas.controller.router import Router  # noqa: E402
from unimas.errors import (
    ModelGroupError,  # noqa: E402
    UserError,  # noqa: E402
)
from unimas.training.experiment import Experiment  # noqa: E402
from unimas.runtime.local import LocalTransport  # noqa: E402
from unimas.runtime.ray_actors import RayTransport, _check_reachable, connect  # noqa: E402
from unimas.output.rundir import RunDir  # noqa: E402
from unimas.training.trainer import Trainer  # noqa: E402

CONFIG = EXAMPLES / "quickstart_separate.yaml"
SMALL = [
    "trainer.steps=3", "trainer.tasks_per_step=4", "algorithm.group_size=4", "trainer.eval_every=0",
    "trainer.eval_size=8", "trainer.sample_trajectories=0", "trainer.stop_at_accuracy=null",
    "models.speaker_model.resources.cpus=1", "models.listener_model.resources.cpus=0.5",
    "runtime.kind=ray", "logging.report=false", "logging.console=false",
]
TIMING = ("time", "per_s", "wall")
CLUSTER_CPUS = 4


def small_config(*extra: str) -> ExperimentConfig:
    return load_config(CONFIG, SMALL + list(extra))


def run_trainer(config: ExperimentConfig, transport, root) -> list[dict]:
    trainer = Trainer(Experiment.resolve(config), RunDir(root).create(), transport)
    return asyncio.run(trainer.run())


def comparable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if not any(t in k for t in TIMING)} for record in history]


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance for the module, sized like the runtime sizes one."""
    release_leftover_ray()
    started = connect(RuntimeConfig(kind="ray"), cpus_needed=CLUSTER_CPUS)
    assert started, "Ray was already initialised in this process"
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_transport(ray_cluster):
    transport = RayTransport.start(small_config())
    yield transport
    transport.shutdown()


class Recording:
    """Pass-through transport that keeps every record crossing the star."""

    def __init__(self, inner):
        self.inner = inner
        self.generated: list[tuple[list, list]] = []
        self.updates: list[list] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, group, requests):
        results = await self.inner.generate(group, requests)
        self.generated.append((requests, results))
        return results

    async def update(self, group, turns):
        self.updates.append(turns)
        return await self.inner.update(group, turns)


def only_plain_data(obj, path="record"):
    """Thin records: text, numbers, lists of ids — no tensors, arrays or other heavy objects."""
    if isinstance(obj, (str, int, float, bool, type(None))):
        return
    if isinstance(obj, BaseModel):  # the role's generation settings / the algorithm config
        return
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            only_plain_data(item, f"{path}[{i}]")
        return
    if isinstance(obj, dict):  # chat messages: {"role": ..., "content": ...}
        for key, value in obj.items():
            assert isinstance(key, str), f"{path} has a non-text key"
            only_plain_data(value, f"{path}.{key}")
        return
    if is_dataclass(obj):
        for f in fields(obj):
            only_plain_data(getattr(obj, f.name), f"{path}.{f.name}")
        return
    raise AssertionError(f"{path} is a {type(obj).__name__}, not thin data")


# ------------------------------------------------------------------ twins


@pytest.mark.slow
def test_local_instance_is_sized_for_the_groups(ray_cluster):
    assert ray.cluster_resources()["CPU"] == max(os.cpu_count() or 1, CLUSTER_CPUS)


@pytest.mark.slow
def test_workers_of_a_started_instance_run_at_the_drivers_priority(ray_cluster):
    """Not Ray's default niceness of 15, at which any busy process on the machine starves the group actors."""

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote()) == os.nice(0)


@pytest.mark.slow
def test_ray_matches_local_places_groups_and_sends_thin_records(ray_transport, tmp_path):
    config = small_config()
    local = LocalTransport.start(config, Experiment.resolve(config).registry)
    local_history = run_trainer(config, local, tmp_path / "local")

    recording = Recording(ray_transport)
    ray_history = run_trainer(config, recording, tmp_path / "ray")

    # same seed, same config -> identical per-step metrics (rewards, losses, grad norms ...)
    assert [r["step"] for r in ray_history] == [0, 1, 2, 3]
    assert comparable(ray_history) == comparable(local_history)
    assert [r.get("reward/mean") for r in ray_history] == [r.get("reward/mean") for r in local_history]

    # each group's actor got exactly the resources its config asked for, in its own process
    for name, group in config.models.items():
        info = ray_transport.info[name]
        assert info["resources"].get("CPU", 0.0) == group.resources.cpus, info
        assert info["resources"].get("GPU", 0.0) == group.resources.gpus
        assert info["torch_threads"] == config.trainer.torch_threads
        assert info["pid"] != os.getpid()
    assert ray_transport.info["speaker_model"]["pid"] != ray_transport.info["listener_model"]["pid"]

    # thin records: plain data only, and a few hundred bytes per turn at most
    turns = sum(len(requests) for requests, _ in recording.generated)
    assert turns == 2 * (16 * 3 + 8 * 2)  # 2 roles x (16 episodes x 3 steps + 8 eval tasks x 2 evals)
    for requests, results in recording.generated:
        only_plain_data(requests), only_plain_data(results)
    for turns_sent in recording.updates:
        only_plain_data(turns_sent)
    pickled = ray.cloudpickle.dumps
    request_bytes = sum(len(pickled(r)) for r, _ in recording.generated) / turns
    result_bytes = sum(len(pickled(r)) for _, r in recording.generated) / turns
    update_bytes = sum(len(pickled(t)) for t in recording.updates) / sum(len(t) for t in recording.updates)
    print(f"\nbytes per turn: request {request_bytes:.0f}, result {result_bytes:.0f}, train turn {update_bytes:.0f}")
    assert request_bytes < 400 and result_bytes < 400 and update_bytes < 400


@pytest.mark.slow
def test_group_updates_overlap_in_time(ray_transport, tmp_path):
    """The trainer gathers the groups' update calls; on Ray they run at the same time."""
    run_trainer(small_config("trainer.steps=2"), ray_transport, tmp_path)

    async def spans():
        return {g: [s for s in await ray_transport.spans(g) if s[0] == "update"] for g in ray_transport.actors}

    updates = asyncio.run(spans())
    assert len(updates["speaker_model"]) >= 2 and len(updates["listener_model"]) >= 2
    pairs = zip(updates["speaker_model"][-2:], updates["listener_model"][-2:])  # the last two steps
    overlaps = [min(a_end, b_end) - max(a_start, b_start) for (_, a_start, a_end), (_, b_start, b_end) in pairs]
    assert max(overlaps) > 0, f"update calls did not overlap: {updates}"


@pytest.mark.slow
def test_workflow_exception_is_isolated_to_its_episode(ray_transport):
    config = small_config()

    async def flaky(ctx, task):
        message = await ctx.act("speaker")
        if task["target"] in "ab":
            raise ValueError("workflow bug")
        guess = await ctx.act("listener", message=message)
        return {"answer": guess.parsed}

    specs = [EpisodeSpec(f"e{i}", f"t{i}", {"target": t, "answer": t}) for i, t in enumerate("abcdefgh")]
    router = Router(ray_transport, max_batch_size=256, max_wait_s=0.005)
    trajectories = asyncio.run(Controller(flaky, config.roles, router, tools={}).run(specs))
    assert [t.failed for t in trajectories] == [True, True] + [False] * 6
    assert "ValueError: workflow bug" in trajectories[0].error
    assert all(len(t.turns()) == 2 for t in trajectories[2:])


# --------------------------------------------------------------- dry run


@pytest.mark.slow
def test_dry_run_prints_the_plan_from_cluster_resources(ray_cluster, capsys):
    assert main(["train", str(CONFIG), *sum((["--set", s] for s in SMALL), []), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "model group listener_model: 0.5 CPU, 0 GPU -> node" in out
    assert f"cluster: {ray.cluster_resources()['CPU']:g} CPU" in out and "fits" in out
    assert ray.is_initialized()  # a Ray instance it did not start is left alone


@pytest.mark.slow
def test_dry_run_fails_clearly_when_the_cluster_is_short(ray_cluster, capsys):
    args = sum((["--set", s] for s in SMALL + ["models.speaker_model.resources.gpus=2"]), [])
    assert main(["train", str(CONFIG), *args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "models.*.resources" in err and "GPU: need 2, cluster has 0" in err
    assert "Traceback" not in err


def test_an_address_nobody_listens_at_fails_fast():
    started = time.monotonic()
    with pytest.raises(UserError, match="runtime.address: nothing accepts connections at 127.0.0.1:1"):
        _check_reachable("ray://127.0.0.1:1")
    assert time.monotonic() - started < 10  # Ray's own retries would take minutes


# --------------------------------------------------------------- failures


async def kill_and_wait(actor) -> None:
    """ray.kill, then wait until calls to the actor fail (so the next call surely sees it dead)."""
    ray.kill(actor, no_restart=True)
    for _ in range(200):
        try:
            await actor.info.remote()
        except ray.exceptions.RayActorError:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("killed actor still answers")


class Killer(Recording):
    """Kills a group's actor right before chosen generate calls to that group (1-based)."""

    def __init__(self, inner, group, at_calls):
        super().__init__(inner)
        self.group, self.at_calls, self.calls = group, set(at_calls), Counter()

    async def generate(self, group, requests):
        self.calls[group] += 1
        if group == self.group and self.calls[group] in self.at_calls:
            await kill_and_wait(self.inner.actors[group])
        return await self.inner.generate(group, requests)


@pytest.mark.slow
def test_killed_actor_stops_the_run_with_an_error_naming_group_and_step(ray_cluster, tmp_path, monkeypatch, capsys):
    """restart_failed_groups off (default): exit 1, one line naming the group and the step."""
    original, calls = RayTransport.generate, Counter()

    async def generate(self, group, requests):
        calls[group] += 1
        if group == "listener_model" and calls[group] == 3:  # call 1: step-0 eval, 2: step 1, 3: step 2
            await kill_and_wait(self.actors[group])
        return await original(self, group, requests)

    monkeypatch.setattr(RayTransport, "generate", generate)
    args = sum((["--set", s] for s in SMALL), [])
    assert main(["train", str(CONFIG), *args, "--run-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    line = err.strip().splitlines()[0]
    assert line.startswith("error: model group 'listener_model' failed during step 2 (generate): ActorDied")
    assert "restart_failed_groups is off" in line
    assert "Traceback" not in err
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]


@pytest.mark.slow
def test_killed_actor_is_restarted_and_the_step_retried(ray_cluster, tmp_path):
    """restart_failed_groups on: restart from the last checkpoint (initial weights if none), retry once."""
    config = small_config("runtime.restart_failed_groups=true", "trainer.save_every=1")
    transport = RayTransport.start(config)
    try:
        first_pid = transport.info["listener_model"]["pid"]
        # listener calls: 1 eval@0, 2 step 1 (killed), 3 its retry, 4 step 2, 5 step 3 (killed), 6 retry, 7 eval
        killer = Killer(transport, "listener_model", at_calls=[2, 5])
        history = run_trainer(config, killer, tmp_path)
        assert [r["step"] for r in history] == [0, 1, 2, 3]
        assert all(r["eval/failures"] == 0 for r in history if "eval/failures" in r)
        checkpoint = tmp_path / "checkpoints" / "step_000002" / "listener_model"
        assert transport.restarts == [("listener_model", None), ("listener_model", str(checkpoint))]
        assert transport.info["listener_model"]["pid"] != first_pid
        assert transport.info["listener_model"]["resources"]["CPU"] == 0.5
    finally:
        transport.shutdown()


@pytest.mark.slow
def test_a_step_that_fails_again_after_the_restart_is_an_error(ray_cluster, tmp_path):
    config = small_config("runtime.restart_failed_groups=true", "trainer.steps=1")
    transport = RayTransport.start(config)
    try:
        killer = Killer(transport, "speaker_model", at_calls=[2, 3])  # step 1 and its retry
        with pytest.raises(ModelGroupError) as failure:
            run_trainer(config, killer, tmp_path)
        message = str(failure.value)
        assert "model group 'speaker_model' failed during step 1 (generate)" in message
        assert "after restarting 'speaker_model' from its initial weights and retrying once" in message
    finally:
        transport.shutdown()


def wait_for_free_cpus(expected: float, timeout: float = 30.0) -> float:
    """Ray's resource view lags actor starts and deaths by a moment: poll."""
    deadline = time.monotonic() + timeout
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if abs(free - expected) < 1e-6 or time.monotonic() > deadline:
            return free
        time.sleep(0.1)


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


HANG_GUARD_SECONDS = 1800
"""Only a hang reaches this: the steps below wait for events (metrics lines, the exit, freed CPUs), however long a
busy machine makes them take (a start took over 120 s at load 17, so a 120 s wait sent the SIGINT too early)."""


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_SECONDS)
def test_ctrl_c_stops_the_actors_and_leaves_a_joined_cluster_running(ray_transport, ray_cluster, tmp_path):
    """The CLI joins this module's cluster by address, gets SIGINT mid-run, exits 130, its actors go."""
    baseline = ray.cluster_resources()["CPU"] - 1.5  # only the module's shared transport holds CPUs
    assert wait_for_free_cpus(baseline, timeout=HANG_GUARD_SECONDS) == pytest.approx(baseline)
    run = tmp_path / "run"
    args = [a for s in SMALL + ["trainer.steps=100000", f"runtime.address={ray_cluster}",
                                "models.speaker_model.resources.cpus=0.25",
                                "models.listener_model.resources.cpus=0.25"] for a in ("--set", s)]
    proc = subprocess.Popen([sys.executable, "-m", "unimas.cli", "train", str(CONFIG), *args, "--run-dir", str(run)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while proc.poll() is None and lines_of(run / "metrics.jsonl") < 3:  # the run is mid-training
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        # its two actors run here (the run logged steps, so they started; Ray's view may lag)
        assert wait_for_free_cpus(baseline - 0.5, timeout=HANG_GUARD_SECONDS) == pytest.approx(baseline - 0.5)
        logged = lines_of(run / "metrics.jsonl")
        proc.send_signal(signal.SIGINT)
        # a bound only for a CLI that never exits (0.5 s on the idle machine): then its stacks say where it waits
        try:
            out, err = proc.communicate(timeout=HANG_GUARD_SECONDS // 3)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # the CLI prints every thread's stack: where it waits
            time.sleep(3)
            proc.kill()
            out, err = proc.communicate()
            later = lines_of(run / "metrics.jsonl")  # more: the run went on training
            pytest.fail(f"the CLI did not exit within {HANG_GUARD_SECONDS // 3} s of its SIGINT (metrics lines: "
                        f"{logged} at the SIGINT, {later} at the kill); its stacks:\n{err[-20000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    # the cluster still runs, and the run's actors are gone: their CPUs are free again
    assert wait_for_free_cpus(baseline, timeout=HANG_GUARD_SECONDS) == pytest.approx(baseline)


# ------------------------------------------------------------------ asynchronous pipeline


@pytest.mark.slow
def test_async_pipeline_on_ray_trains_turns_one_version_old(ray_cluster, tmp_path):
    """``max_staleness: 1`` with actors: the next step's episodes are sampled while the groups update, so some
    turns arrive one weight version old, none older; checkpoints carry the rollouts generated ahead. The
    listener samples in a rollout process of its actor (``options.rollout_process``), the speaker in its actor."""
    from unimas.groups.torch.rollout_replica import RNG_FILE
    from unimas.training.pipeline import PENDING

    config = small_config("algorithm.max_staleness=1", "trainer.steps=4", "trainer.save_every=2",
                          "models.listener_model.options.rollout_process=true")
    transport = RayTransport.start(config)
    try:
        history = run_trainer(config, transport, tmp_path)
    finally:
        transport.shutdown()
    steps = [r for r in history if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for group in ("speaker_model", "listener_model"):
        worst = [r[f"group/{group}/staleness_max"] for r in steps]
        assert max(worst) == 1.0, worst  # generated ahead, and within the bound
        assert all(r[f"group/{group}/stale_dropped"] == 0 for r in steps)
        assert steps[-1][f"group/{group}/weight_version"] == 4
    # the replica took each update's weights (only the listener has one) and sampled the stale turns above
    assert all(0 <= r["group/listener_model/weight_sync_s"] < 5 for r in steps)
    assert not any("speaker_model/weight_sync_s" in key for r in steps for key in r)
    assert (tmp_path / "checkpoints" / "step_000002" / PENDING).exists()
    assert (tmp_path / "checkpoints" / "step_000002" / "listener_model" / RNG_FILE).is_file()


@pytest.mark.slow
def test_sequential_update_order_scores_turns_through_the_actors(ray_transport, tmp_path):
    """``reverse_execution`` with ``ratio_clip``: the listener's actor updates, then scores its turns over Ray,
    and the speaker's stage runs on the ratios; each group updates once per step. The update order is the
    trainer's alone (a group is built the same whatever the order), so the module's actors serve this run too."""
    config = small_config("trainer.steps=2", "algorithm.update_order={name: reverse_execution, params: "
                          "{ratio_clip: 0.2}}")

    def scores() -> int:
        return [s[0] for s in asyncio.run(ray_transport.spans("listener_model"))].count("score")

    before = scores()
    history = run_trainer(config, ray_transport, tmp_path)
    assert scores() - before == 2  # once a step
    versions = [r["group/speaker_model/weight_version"] for r in history[1:]]
    assert versions[1] == versions[0] + 1  # one update a step


CENTRAL = EXAMPLES / "quickstart_central_critic.yaml"
CRITIC = "{optim: {lr: 0.001}, value_clip: 0.5}"


@pytest.mark.slow
@pytest.mark.parametrize("source, extra", [
    (CONFIG, ["algorithm.estimator=gae", "algorithm.critic_warmup=1", f"models.speaker_model.critic={CRITIC}",
              f"models.listener_model.critic={CRITIC}"]),
    (CENTRAL, ["algorithm.critic_warmup=1", "models.central.resources.cpus=0.5"]),
], ids=["per_group", "centralized"])
def test_critics_on_ray_are_twins_of_the_local_run(ray_cluster, tmp_path, source, extra):
    """A value model per group, and a centralized critic group valued over Ray (``critique``): the same
    per-step metrics as the local run, critic statistics included, and the critic trained."""
    config = load_config(source, SMALL + extra)
    local = LocalTransport.start(config, Experiment.resolve(config).registry)
    local_history = run_trainer(config, local, tmp_path / "local")
    transport = RayTransport.start(config)
    try:
        ray_history = run_trainer(config, transport, tmp_path / "ray")
    finally:
        transport.shutdown()
    assert comparable(ray_history) == comparable(local_history)
    critic_keys = [k for k in ray_history[-1] if "/critic/value_loss" in k]
    assert critic_keys and all(ray_history[-1][k] > 0 for k in critic_keys), ray_history[-1]
