"""verl's vLLM rollout classes, namespaced per model group (importable only where vLLM is installed).

verl 0.9.1 offers subclass hooks for exactly this (``_get_server_name_prefix`` on
the replica and on the trainer-side adapter); the names come from :mod:`.names`,
which the CPU tests check. The group name travels in ``rollout.custom["group"]``
(set by :func:`unimas.groups.verl.options.rollout_config`).

Status: written against verl 0.9.1's source; not yet run (no vLLM and no GPU in
this project's CI). ``scripts/gpu_check_verl.py --vllm`` is the check.
"""

from __future__ import annotations

import os

import ray
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from unimas.groups.verl import names


def _group(config) -> str:
    return config.custom["group"]


class GroupvLLMHttpServer(vLLMHttpServer):
    """A vLLM server whose workers bind the group's own weight-sync socket."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        # verl set VERL_RAY_JOB_ID to the job id above; the vLLM workers, spawned later by launch_server, read it.
        os.environ["VERL_RAY_JOB_ID"] = names.job_namespace(os.environ["VERL_RAY_JOB_ID"], _group(config))


class GroupvLLMReplica(vLLMReplica):
    """A replica whose server actors carry the group's name."""

    def __init__(self, replica_rank, config, model_config, *args, **kwargs):
        super().__init__(replica_rank, config, model_config, *args, **kwargs)
        self.server_class = ray.remote(GroupvLLMHttpServer)

    def _get_server_name_prefix(self) -> str:
        return names.server_name_prefix(_group(self.config), "vllm")


class GroupServerAdapter(ServerAdapter):
    """The trainer side: finds the group's server and sends weights over the group's socket."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh, replica_rank)
        local_rank = self.rollout_rank % int(os.environ["RAY_LOCAL_WORLD_SIZE"])
        job_id = ray.get_runtime_context().get_job_id()
        self.zmq_handle = names.weight_sync_socket(job_id, _group(self.config), self.replica_rank, local_rank)

    def _get_server_name_prefix(self) -> str:
        return names.server_name_prefix(_group(self.config), "vllm")


def register() -> None:
    """Route verl's vLLM lookups (replica registry, trainer-side rollout registry) to the group classes."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("vllm", lambda: GroupvLLMReplica)
    base._ROLLOUT_REGISTRY[("vllm", "async")] = f"{__name__}.GroupServerAdapter"
