"""`unimas validate CONFIG --cluster FILE`: the placement plan on a cluster described on paper.

The plan comes from the planner the Ray runtime itself runs
(`unimas/runtime/placement.py`); these tests give it 64 nodes of 8 GPUs that
do not exist, with groups that take whole nodes, half nodes, shares of one
GPU and a separate rollout pool reached by a custom resource.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.config.loading import load_config
from unimas.errors import UserError
from unimas.runtime.placement import placement_plan

BASE = yaml.safe_load((EXAMPLES / "quickstart_separate.yaml").read_text())
TINY = BASE["models"]["speaker_model"]

EIGHT_GROUPS = {
    "speaker_model": {"cpus": 8, "gpus": 8},
    "listener_model": {"cpus": 8, "gpus": 8},
    "actor_c": {"gpus": 4},
    "actor_d": {"gpus": 4},
    "critic_a": {"gpus": 0.5},
    "critic_b": {"gpus": 0.5},
    "rollout_a": {"gpus": 8, "custom": {"rollout_pool": 8}},
    "rollout_b": {"gpus": 8, "custom": {"rollout_pool": 8}},
}
CLUSTER = """\
- {name: train, count: 56, cpus: 96, gpus: 8, memory_gb: 1024}
- {name: rollout, count: 8, cpus: 96, gpus: 8, memory_gb: 1024, resources: {rollout_pool: 8}}
"""


def write_config(tmp_path: Path, resources: dict[str, dict]) -> Path:
    """The quickstart with one tiny torch group per entry of ``resources`` (the two played ones keep their roles)."""
    tree = copy.deepcopy(BASE)
    tree["runtime"] = {"kind": "ray"}
    for name, res in resources.items():
        group = tree["models"].setdefault(name, copy.deepcopy(TINY))
        group["resources"] = res
        if name.startswith("rollout"):
            group["trainable"] = False
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def validate(capsys, config: Path, cluster_text: str, tmp_path: Path) -> tuple[int, str, str]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(cluster_text)
    code = main(["validate", str(config), "--cluster", str(cluster)])
    out, err = capsys.readouterr()
    return code, out, err


def plan_lines(out: str) -> dict[str, str]:
    return {line.split()[2].rstrip(":"): line for line in out.splitlines() if line.startswith("  model group ")}


def test_eight_groups_on_64_nodes_of_8_gpus(tmp_path, capsys):
    code, out, err = validate(capsys, write_config(tmp_path, EIGHT_GROUPS), CLUSTER, tmp_path)
    assert code == 0, err
    lines = plan_lines(out)
    assert set(lines) == set(EIGHT_GROUPS)
    # whole nodes for the 8-GPU trainers, the two 4-GPU groups share a node, the two halves share one GPU
    assert lines["listener_model"].endswith("8 CPU, 8 GPU -> node train-0, GPUs 0-7")
    assert lines["speaker_model"].endswith("-> node train-1, GPUs 0-7")
    assert lines["actor_c"].endswith("4 GPU -> node train-2, GPUs 0-3")
    assert lines["actor_d"].endswith("4 GPU -> node train-2, GPUs 4-7")
    assert lines["critic_a"].endswith("0.5 GPU -> node train-3, GPU 0, shared with critic_b")
    assert lines["critic_b"].endswith("0.5 GPU -> node train-3, GPU 0, shared with critic_a")
    # the rollout groups go to the pool their custom resource names, one node each
    assert lines["rollout_a"].endswith("8 GPU, rollout_pool 8 -> node rollout-0, GPUs 0-7")
    assert lines["rollout_b"].endswith("-> node rollout-1, GPUs 0-7")
    assert "  total: 22 CPU, 41 GPU, rollout_pool 16" in out
    assert "cluster: 6144 CPU, 512 GPU, 65,536 GiB, rollout_pool 64 on 64 nodes -> fits, 6 of them used" in out


def test_a_group_bigger_than_every_node_is_named_with_its_resources(tmp_path, capsys):
    config = write_config(tmp_path, {**EIGHT_GROUPS, "actor_c": {"cpus": 2, "gpus": 16}})
    code, out, err = validate(capsys, config, CLUSTER, tmp_path)
    assert code == 2
    assert out == "" and "Traceback" not in err  # not "ok": the config does not fit the cluster
    assert ("models.actor_c.resources: model group 'actor_c' (2 CPU, 16 GPU) does not fit: it needs 16 GPU, the "
            "largest node has 8") in err


def test_a_pool_nobody_offers_and_a_full_cluster_are_refused(tmp_path, capsys):
    train_only = CLUSTER.splitlines()[0] + "\n"
    code, _, err = validate(capsys, write_config(tmp_path, EIGHT_GROUPS), train_only, tmp_path)
    assert code == 2
    assert "rollout_pool: need 16, cluster has 0" in err  # the totals say what is short
    assert "model group 'rollout_a' (1 CPU, 8 GPU, rollout_pool 8) does not fit: no node offers the custom " \
           "resource 'rollout_pool'" in err  # and the first group that does not fit is named
    two_nodes = "- {count: 2, cpus: 96, gpus: 8, memory_gb: 512, resources: {rollout_pool: 16}}\n"
    code, _, err = validate(capsys, write_config(tmp_path, EIGHT_GROUPS), two_nodes, tmp_path)
    assert code == 2 and "GPU: need 41, cluster has 16" in err
    assert "model group 'listener_model' (8 CPU, 8 GPU) does not fit: every node that could hold it alone is " \
           "full once the groups before it are placed (2 nodes)" in err


def test_gpu_shares_and_whole_gpus_are_counted_per_device(tmp_path):
    """Two 0.75 shares and a 0.5 share need three devices although 2 GPUs hold 2.0; 1.5 GPUs is not a request."""
    shares = {"speaker_model": {"gpus": 0.75}, "listener_model": {"gpus": 0.75}, "critic_a": {"gpus": 0.5}}
    node = {"CPU": 8.0, "GPU": 2.0, "memory": 2.0**34}
    with pytest.raises(UserError, match="'critic_a' .* does not fit: every node that could hold it alone is full"):
        placement_plan(load_config(write_config(tmp_path, shares)), node, [("n", node)])  # no device has 0.5 left
    config = load_config(write_config(tmp_path, {**shares, "critic_b": {"gpus": 0.25}}))
    three = {**node, "GPU": 3.0}
    plan = placement_plan(config, three, [("n", three)])
    assert "listener_model: 1 CPU, 0.75 GPU -> node n, GPU 0, shared with critic_b\n" in plan
    assert "speaker_model: 1 CPU, 0.75 GPU -> node n, GPU 1\n" in plan
    assert "critic_a: 1 CPU, 0.5 GPU -> node n, GPU 2\n" in plan
    config = load_config(write_config(tmp_path, {"actor_c": {"gpus": 1.5}}))
    with pytest.raises(UserError, match="more than one GPU must be a whole number"):
        placement_plan(config, {**node, "GPU": 8.0}, [("n", {**node, "GPU": 8.0})])


@pytest.mark.parametrize("text, expected", [
    (None, "cluster file not found"),
    ("{cpus: 8}\n", "a cluster file is a non-empty YAML list of nodes"),
    ("- {cpus: 8, memory_gb: 64\n", "not valid YAML"),
    ("- {cpus: 8, memory_gb: 64}\n- {name: big, cpus: 8, gpu: 8, memory_gb: 64}\n- {cpus: many, memory_gb: 1}\n",
     "invalid cluster file:\n  entry 2 (big): gpu: unknown key (check spelling)\n  entry 3: cpus: "),
    ("- {cpus: 8}\n", "entry 1: memory_gb: Field required"),
    ("- {cpus: 8, memory_gb: 64, resources: {GPU: 2}}\n", "entry 1: resources: Value error, 'GPU' is built in"),
    ("- {name: a, count: 2, cpus: 8, memory_gb: 64}\n- {name: a-1, cpus: 8, memory_gb: 64}\n",
     "two nodes are named 'a-1'"),
])
def test_bad_cluster_files_name_the_file_and_the_entry(tmp_path, capsys, text, expected):
    config = write_config(tmp_path, {})
    cluster = tmp_path / "cluster.yaml"
    if text is not None:
        cluster.write_text(text)
    code = main(["validate", str(config), "--cluster", str(cluster)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: {cluster}: " in err and expected in err
    assert "Traceback" not in err


def test_custom_resources_in_the_config_are_checked(tmp_path, capsys):
    config = write_config(tmp_path, {"speaker_model": {"custom": {"CPU": 1}}})
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "models.speaker_model.resources.custom" in err and "'CPU' is not a custom resource name" in err


def test_a_restart_with_no_live_node_offering_its_resource_fails_at_once(tmp_path, monkeypatch):
    """The replacement of a group pinned to a pool whose nodes are all gone would wait forever: refused, named."""
    ray_actors = pytest.importorskip("unimas.runtime.ray_actors")
    from unimas.errors import ModelGroupError

    config = load_config(write_config(tmp_path, {"listener_model": {"cpus": 0.5, "custom": {"pool_a": 1}}}))
    survivors = [("127.0.0.1 (0a0a0a0a)", {"CPU": 4.0, "memory": 2.0**33, "pool_b": 1.0})]
    monkeypatch.setattr(ray_actors, "cluster_resources", lambda: ({}, survivors))
    spawned = []
    transport = ray_actors.RayTransport({}, spawn=spawned.append, groups=config.models)
    with pytest.raises(ModelGroupError) as failure:
        asyncio.run(transport.restart("listener_model", None))
    assert spawned == []  # no actor was left pending
    assert str(failure.value) == ("model group 'listener_model' failed during restart: RuntimeError: no live node "
                                  "can host it (0.5 CPU, 0 GPU, pool_a 1); start a node with `ray start "
                                  "--resources` offering {'pool_a': 1.0}")


HUGE = str(10 ** 400)


@pytest.mark.parametrize("text, expected", [
    pytest.param("- {name: big, cpus: 8, gpus: 10000000000, memory_gb: 64}\n", "entry 1 (big): gpus: ",
                 id="1e10-gpus"),
    pytest.param("- {name: farm, count: 100000, cpus: 96, gpus: 1000, memory_gb: 1024}\n", "entry 1 (farm): gpus: ",
                 id="100000-nodes-of-1000-gpus"),
    pytest.param("- {name: farm, count: 100000, cpus: 96, gpus: 64, memory_gb: 1024}\n",
                 "more than 1,000,000 GPUs in all; entry 1 alone", id="too-many-gpus-in-all"),
    pytest.param("- {cpus: 8, gpus: " + "9" * 5000 + ", memory_gb: 64}\n", "gpus: an integer of 5000 digits",
                 id="5000-digit-gpus"),
    pytest.param("- {cpus: 8, gpus: " + HUGE + ", memory_gb: 64}\n", "entry 1: gpus: ", id="1e400-gpus"),
    pytest.param("- {cpus: " + HUGE + ", memory_gb: 64}\n", "entry 1: cpus: ", id="1e400-cpus"),
    pytest.param("- {cpus: 100000000, memory_gb: 64}\n", "entry 1: cpus: ", id="1e8-cpus"),
    pytest.param("- {cpus: 8, memory_gb: " + HUGE + "}\n", "entry 1: memory_gb: ", id="1e400-memory"),
    pytest.param("- {cpus: 8, memory_gb: 1.0e+30}\n", "entry 1: memory_gb: ", id="1e30-memory"),
    pytest.param("- {cpus: 8, memory_gb: 64, resources: {pool: " + HUGE + "}}\n", "entry 1: resources.pool: ",
                 id="1e400-custom"),
    pytest.param("- {cpus: 8, memory_gb: 64, resources: {pool: 1.0e+300}}\n", "entry 1: resources.pool: ",
                 id="1e300-custom"),
])
def test_counts_no_machine_has_are_refused_at_load_naming_the_entry_and_field(tmp_path, capsys, text, expected):
    """10^10 GPUs ran the planner out of memory; 100,000 nodes of 1,000 GPUs took 105 s and then a traceback.

    Bounds are checked when the file loads, before any plan is made, so each case
    is a user error naming the node entry and the field (the test's timeout is
    the "fast" part: no clock is asserted).
    """
    config = write_config(tmp_path, {})
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(text)
    code = main(["validate", str(config), "--cluster", str(cluster)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"error: {cluster}: " in err and expected in err
    assert "Traceback" not in err
