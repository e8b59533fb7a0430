"""Per-group names of verl's rollout servers and weight-sync sockets (pure: no verl, vLLM or Ray import).

verl 0.9.1 names each vLLM server Ray actor ``vllm_server_{replica}_{node}`` and
the CUDA-IPC socket of its weight sync ``ipc:///tmp/rl-colocate-zmq-{job}-replica-
{replica}-rank-{local}.sock``. Two model groups in one job both start at replica
0, so the second group's server name is taken and — worse — both trainers bind
the same socket path (the sender deletes and re-binds an existing one): silent
cross-talk. Folding the group name into the actor prefix and into the job part
of the socket path (the ``VERL_RAY_JOB_ID`` the vLLM workers read) keeps every
group's servers and sockets apart; :mod:`.vllm_servers` applies these names.
"""

from __future__ import annotations

UNIX_SOCKET_PATH_MAX = 107
"""Longest path a Unix domain socket can bind on Linux (``sun_path`` is 108 bytes with the NUL)."""


def server_name_prefix(group: str, rollout: str) -> str:
    """The Ray actor name prefix of the group's rollout servers (verl's default is ``f"{rollout}_"``)."""
    return f"unimas_{group}_{rollout}_"


def server_actor_name(group: str, rollout: str, replica_rank: int, node_rank: int) -> str:
    """The Ray actor name verl gives a server once the prefix is the group's (``{prefix}server_{replica}_{node}``)."""
    return f"{server_name_prefix(group, rollout)}server_{replica_rank}_{node_rank}"


def job_namespace(job_id: str, group: str) -> str:
    """The group's stand-in for the Ray job id in socket paths (``VERL_RAY_JOB_ID`` of its vLLM workers)."""
    return f"{job_id}-{group}"


def weight_sync_socket(job_id: str, group: str, replica_rank: int, local_rank: int, tmp: str = "/tmp") -> str:
    """The ZMQ IPC address trainer and vLLM worker of one group agree on; refuses paths Linux cannot bind."""
    path = f"{tmp}/rl-colocate-zmq-{job_namespace(job_id, group)}-replica-{replica_rank}-rank-{local_rank}.sock"
    if len(path) > UNIX_SOCKET_PATH_MAX:
        raise ValueError(f"the weight-sync socket of model group '{group}' would be {len(path)} characters long "
                         f"({path}); Unix sockets allow {UNIX_SOCKET_PATH_MAX}: use a shorter group name")
    return f"ipc://{path}"
