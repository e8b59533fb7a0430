"""`runtime: ray` on a cluster of several nodes, all on 127.0.0.1 (``ray.cluster_utils.Cluster``).

Three raylets: the head offers the custom resource ``pool_b``, two workers
``pool_a``. The speaker group asks for ``pool_b``, the listener group for
``pool_a``, so they land on different nodes, and the dry run's plan says
which. Then the node hosting the listener is removed mid-run: with
``runtime.restart_failed_groups`` the group comes back on the other
``pool_a`` node from the last complete checkpoint and every step is logged
once; without it the run stops with an error naming the group, the node and
the step.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from tests.conftest import EXAMPLES, release_leftover_ray  # noqa: E402
from unimas.cli import main  # noqa: E402
from unimas.config.loading import load_config  # noqa: E402
from unimas.output.rundir import RunDir  # noqa: E402
from unimas.process import ray_workers_at_normal_priority  # noqa: E402
from unimas.runtime.ray_actors import RayTransport  # noqa: E402
from unimas.training.experiment import Experiment  # noqa: E402
from unimas.training.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # three raylets, two actors per run; never hangs

CONFIG = EXAMPLES / "quickstart_separate.yaml"
RUN = [
    "trainer.steps=3", "trainer.tasks_per_step=4", "algorithm.group_size=4", "trainer.eval_every=0",
    "trainer.eval_size=8", "trainer.sample_trajectories=0", "trainer.stop_at_accuracy=null", "trainer.save_every=1",
    "runtime.kind=ray", "logging.report=false", "logging.console=false",
    "models.speaker_model.resources.cpus=1", "models.speaker_model.resources.custom={pool_b: 1}",
    "models.listener_model.resources.cpus=0.5", "models.listener_model.resources.custom={pool_a: 1}",
]
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 2**20}
KILL_AT = 3
"""The listener's generate calls: 1 the step-0 evaluation, 2 step 1, 3 step 2 (its node is removed first)."""


@pytest.fixture(scope="module")
def loopback_only():
    """Keep Ray on 127.0.0.1: when it connects to a loopback address it would rewrite it to this machine's
    outward address, where nothing of this cluster listens (``ray._private.services.resolve_ip_for_localhost``)."""
    patch = pytest.MonkeyPatch()
    patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    yield
    patch.undo()


@pytest.fixture(scope="module")
def cluster(loopback_only):
    release_leftover_ray()
    ray_workers_at_normal_priority()  # as for an instance unimas starts: raylets read it at their start
    made = cluster_utils.Cluster(initialize_head=True, head_node_args={**NODE, "resources": {"pool_b": 1},
                                                                       "include_dashboard": False})
    # The head wrote its address where a plain ray.init() (verl's, another process's) would join it: these
    # tests name the address themselves, so nothing else finds this cluster.
    ray._common.utils.reset_ray_address()
    try:
        for _ in range(2):
            made.add_node(**NODE, resources={"pool_a": 1})
        made.wait_for_nodes(timeout=60)
        yield made
    finally:
        made.shutdown()


@pytest.fixture(autouse=True)
def disconnected():
    """Each run connects and disconnects by itself; a failed one must not leave this process connected."""
    yield
    if ray.is_initialized():
        ray.shutdown()


def pool_a_nodes(cluster) -> list:
    """Two live ``pool_a`` workers before each test (the previous test removed one)."""
    while len(cluster.worker_nodes) < 2:
        cluster.add_node(**NODE, resources={"pool_a": 1})
    cluster.wait_for_nodes(timeout=60)
    return list(cluster.worker_nodes)


def host_of(cluster, node_id: str):
    return next(node for node in cluster.worker_nodes if node.node_id == node_id)


def node_killing_generate(cluster, calls: Counter, removed: list):
    """``RayTransport.generate`` that removes the listener's node just before its ``KILL_AT``-th batch."""
    original = RayTransport.generate

    async def generate(self, group, requests):
        calls[group] += 1
        if group == "listener_model" and calls[group] == KILL_AT:
            node = host_of(cluster, self.info[group]["node_id"])
            removed.append(node.node_id)
            await asyncio.to_thread(cluster.remove_node, node)
        return await original(self, group, requests)

    return generate


def steps_logged(run) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_dry_run_places_the_groups_on_the_nodes_with_their_resources(cluster, capsys):
    pool_a_nodes(cluster)
    args = [a for s in RUN + [f"runtime.address={cluster.address}"] for a in ("--set", s)]
    assert main(["train", str(CONFIG), *args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    head = cluster.head_node.node_id[:8]
    workers = {node.node_id[:8] for node in cluster.worker_nodes}
    lines = {line.split()[2].rstrip(":"): line for line in out.splitlines() if line.startswith("  model group ")}
    assert lines["speaker_model"].endswith(f"1 CPU, 0 GPU, pool_b 1 -> node 127.0.0.1 ({head})")
    listener = lines["listener_model"]
    assert "0.5 CPU, 0 GPU, pool_a 1 -> node 127.0.0.1 (" in listener and listener[-9:-1] in workers
    assert "on 3 nodes -> fits, 2 of them used" in out


@pytest.mark.slow
def test_a_lost_node_stops_the_run_naming_group_node_and_step(cluster, tmp_path, monkeypatch, capsys):
    pool_a_nodes(cluster)
    removed: list[str] = []
    monkeypatch.setattr(RayTransport, "generate", node_killing_generate(cluster, Counter(), removed))
    run = tmp_path / "run"
    args = [a for s in RUN + [f"runtime.address={cluster.address}"] for a in ("--set", s)]
    assert main(["train", str(CONFIG), *args, "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: model group 'listener_model' failed during step 2 (generate): ActorDied: the "
                           f"Ray actor of model group 'listener_model' died on node 127.0.0.1 ({removed[0][:8]}), "
                           "which is gone: "), line
    assert line.endswith("(runtime.restart_failed_groups is off)") and "Traceback" not in err
    assert steps_logged(run) == [0, 1]
    assert removed[0] not in {node["NodeID"] for node in ray_nodes(cluster) if node["Alive"]}


def ray_nodes(cluster) -> list[dict]:
    """Node table read through a short connection of our own (the runs above disconnect when they end)."""
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        return ray.nodes()
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_group_on_a_lost_node_restarts_on_a_surviving_node_from_its_checkpoint(cluster, tmp_path, monkeypatch):
    pool_a_nodes(cluster)
    config = load_config(CONFIG, RUN + [f"runtime.address={cluster.address}", "runtime.restart_failed_groups=true"])
    removed: list[str] = []
    monkeypatch.setattr(RayTransport, "generate", node_killing_generate(cluster, Counter(), removed))
    transport = RayTransport.start(config)
    try:
        first = transport.info["listener_model"]["node_id"]
        speaker = transport.info["speaker_model"]["node_id"]
        history = asyncio.run(Trainer(Experiment.resolve(config), RunDir(tmp_path).create(), transport).run())
        assert removed == [first]
        assert transport.restarts == [("listener_model", str(tmp_path / "checkpoints" / "step_000001" /
                                                             "listener_model"))]
        now = transport.info["listener_model"]
        assert now["node_id"] not in (first, speaker) and now["resources"]["pool_a"] == 1
        assert transport.info["speaker_model"]["node_id"] == speaker  # the other group never moved
    finally:
        transport.shutdown()
    assert [record["step"] for record in history] == [0, 1, 2, 3]
    assert steps_logged(tmp_path) == [0, 1, 2, 3]  # the failed attempt of step 2 left no record
