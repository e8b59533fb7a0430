"""Per-group names of vLLM server actors and weight-sync sockets, checked without importing vLLM.

Two groups in one job start at replica 0 with local rank 0: with verl's own names
they would share a server actor name and an IPC socket path (silent cross-talk).
"""

from __future__ import annotations

import sys

import pytest

from unimas.groups.verl import names


def test_two_groups_at_replica_zero_get_distinct_servers_and_sockets():
    job = "01000000"
    servers = {g: names.server_actor_name(g, "vllm", 0, 0) for g in ("planner", "coder")}
    sockets = {g: names.weight_sync_socket(job, g, 0, 0) for g in ("planner", "coder")}
    assert servers == {"planner": "unimas_planner_vllm_server_0_0", "coder": "unimas_coder_vllm_server_0_0"}
    assert sockets["planner"] == "ipc:///tmp/rl-colocate-zmq-01000000-planner-replica-0-rank-0.sock"
    assert len(set(sockets.values())) == 2


def test_socket_follows_verls_layout_so_the_vllm_side_computes_the_same_path():
    # vLLM workers build ipc:///tmp/rl-colocate-zmq-{VERL_RAY_JOB_ID}-replica-{r}-rank-{l}.sock from their
    # environment; the group server sets VERL_RAY_JOB_ID to job_namespace(job, group)
    job, group = "02000000", "critic"
    worker_side = f"ipc:///tmp/rl-colocate-zmq-{names.job_namespace(job, group)}-replica-3-rank-1.sock"
    assert names.weight_sync_socket(job, group, 3, 1) == worker_side


def test_names_differ_per_replica_rank_and_rollout():
    assert names.server_actor_name("g", "vllm", 1, 0) != names.server_actor_name("g", "vllm", 0, 0)
    assert names.weight_sync_socket("j", "g", 0, 1) != names.weight_sync_socket("j", "g", 0, 0)
    assert names.server_name_prefix("g", "hf") != names.server_name_prefix("g", "vllm")


def test_a_socket_path_linux_cannot_bind_is_refused():
    with pytest.raises(ValueError, match="shorter group name"):
        names.weight_sync_socket("01000000", "g" * 90, 0, 0)


def test_names_import_no_vllm_ray_or_verl():
    assert names.__name__ in sys.modules
    source = open(names.__file__).read()
    assert "import vllm" not in source and "import ray" not in source and "import verl" not in source
