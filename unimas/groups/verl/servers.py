"""Server mode (``options.rollout_server: true``): generation and weight sync through verl's server machinery.

In the default mode the group calls its rollout object directly. In server
mode the same Hugging Face rollout (:class:`unimas.groups.verl.rollout.HFRollout`)
lives in a **Ray actor** started by verl's own control path, as vLLM's servers are:

* :class:`HFServerReplica` is registered in verl's ``RolloutReplicaRegistry``
  as ``unimas_hf_server``; verl's ``LLMServerManager`` builds it (hybrid mode)
  and it launches one server actor named with the group's prefix from
  :mod:`.names` (``unimas_<group>_hf_server_<replica>_<node>``), so two groups
  in one Ray job never share a server;
* generation goes through verl's load balancer and ``LLMServerClient.generate``;
* the weight sync after each update goes through verl's
  ``CheckpointEngineManager`` with the ``naive`` backend, which asks the actor
  worker group to push its weights. The trainer of a unimas verl group is
  in-process (one rank), so that worker group is :class:`InProcessActorGroup`:
  it does in this process what verl's ``ActorRolloutRefWorker.update_weights``
  does in each trainer process (export the engine's HF-named tensors, hand them
  to the trainer-side adapter), and the adapter (:class:`HFServerAdapter`,
  registered in ``_ROLLOUT_REGISTRY``) ships them to the group's server actor,
  which records the new weight version.
"""

from __future__ import annotations

import asyncio
import itertools
import types
from typing import Any, Iterable, Optional, Sequence

import ray
import torch

from unimas.config import GenerationConfig
from unimas.errors import UserError
from unimas.groups.verl import names
from unimas.groups.verl.options import SERVER_ROLLOUT
from unimas.groups.verl.rollout import HFRollout, _base_class, run_sync

SERVER_KIND = "hf"
"""The rollout part of the server actor names (``unimas_<group>_hf_server_...``)."""


def server_name(config: Any, replica_rank: int) -> str:
    """The Ray actor name of the group's server (the group name travels in ``rollout.custom``)."""
    return names.server_actor_name(config.custom["group"], SERVER_KIND, replica_rank, 0)


class HFRolloutServer:
    """Body of the server actor: unimas's HF rollout answering verl's server calls."""

    def __init__(self, config: Any, model_config: Any):
        torch.set_num_threads(1)
        self.rollout = HFRollout(config=config, model_config=model_config)

    def get_server_address(self) -> tuple[str, int]:
        """No HTTP endpoint: verl uses the address only as the load balancer's key."""
        return "127.0.0.1", 0

    def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                 **_unused: Any):
        """One prompt, sampled with the unimas settings carried in ``sampling_params["unimas"]``."""
        from verl.workers.rollout.replica import TokenOutput

        asked = sampling_params["unimas"]
        gen = GenerationConfig.model_validate(asked["generation"])
        gen = gen.model_copy(update={"max_new_tokens": max(1, int(sampling_params["max_tokens"]))})
        tokens, logprobs = self.rollout.generate([list(prompt_ids)], gen, asked["greedy"], asked["eos_ids"],
                                                 asked["pad_id"])
        return TokenOutput(token_ids=tokens[0], log_probs=logprobs[0], stop_reason="completed",
                           extra_fields={"global_steps": self.rollout.weight_version})

    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: Optional[int]) -> None:
        await self.rollout.update_weights(state.items(), global_steps=global_steps)

    def logprobs(self, prompts: Sequence[list[int]], responses: Sequence[list[int]],
                 temperatures: Sequence[float]) -> list[list[float]]:
        return self.rollout.logprobs(prompts, responses, temperatures)

    def weight_version(self) -> Optional[int]:
        return self.rollout.weight_version

    def rng_state(self) -> torch.Tensor:
        return self.rollout.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.rollout.generator.set_state(state)

    # What verl's replica and checkpoint-engine manager call around a sync: weights and cache stay in memory.
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **_kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...

    async def abort_all_requests(self, **_kwargs: Any) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}


def _replica_base() -> type:
    from verl.workers.rollout.replica import RolloutReplica

    return RolloutReplica


class HFServerReplica(_replica_base()):
    """verl's replica for ``unimas_hf_server``: one server actor per replica, named per group, on CPU or GPU."""

    async def launch_servers(self) -> None:
        name = server_name(self.config, self.replica_rank)
        server = ray.remote(HFRolloutServer).options(name=name, num_cpus=0).remote(self.config, self.model_config)
        self.servers = [server]
        self._server_handle = server
        host, port = await server.get_server_address.remote()
        self._server_address = f"{host}:{port}/{name}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(_base_class()):
    """The trainer-side rollout verl's workers hold: sends the exported weights to the group's server actor."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, replica_rank: int = -1,
                 **_kwargs: Any):
        super().__init__(config=config, model_config=model_config, device_mesh=device_mesh)
        self.replica_rank = max(replica_rank, 0)

    async def resume(self, tags: list[str]) -> None:
        """The server never frees its weights or cache."""

    async def release(self) -> None:
        """Nothing held on the trainer side."""

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], wire_format: str = "named_tensors",
                             global_steps: Optional[int] = None, **_kwargs: Any) -> None:
        """Full HF-named tensors through Ray's object store (vLLM's adapter uses CUDA IPC instead)."""
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        server = ray.get_actor(server_name(self.config, self.replica_rank))
        await server.update_weights.remote(state, global_steps)


def register() -> None:
    """Make verl's registries find the server-mode replica and adapter under ``unimas_hf_server`` (idempotent)."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(SERVER_ROLLOUT, lambda: HFServerReplica)
    base._ROLLOUT_REGISTRY[(SERVER_ROLLOUT, "async")] = f"{__name__}.HFServerAdapter"


class InProcessActorGroup:
    """The one-rank actor worker group verl's managers drive, for a trainer that lives in this process.

    ``LLMServerManager`` reads ``world_size`` and slices ``workers`` (the
    server replica needs none: it starts its own actor); the ``naive``
    checkpoint engine calls :meth:`update_weights` and waits on its result.
    """

    world_size = 1

    def __init__(self, actor: Any, adapter: HFServerAdapter):
        self.actor, self.adapter = actor, adapter
        self.workers: list[Any] = []

    def update_weights(self, global_steps: Optional[int] = None, mode: str = "naive") -> "ray.ObjectRef":
        """Export the engine's HF-named tensors and hand them to the adapter (verl's naive sync, one rank)."""
        if mode != "naive":
            raise ValueError(f"an in-process verl trainer syncs with the naive checkpoint engine, not {mode!r}")
        weights, _ = self.actor.engine.get_per_tensor_param()
        run_sync(self.adapter.update_weights(weights, global_steps=global_steps))
        return ray.put(global_steps)


class _RemoteGenerator:
    """The server's sampling generator, as ``save``/``load`` see a generator."""

    def __init__(self, server: Any):
        self.server = server

    def get_state(self) -> torch.Tensor:
        return ray.get(self.server.rng_state.remote())

    def set_state(self, state: torch.Tensor) -> None:
        ray.get(self.server.set_rng_state.remote(state))


def ensure_ray() -> None:
    """Join the Ray job of this process (a ``runtime: ray`` actor) or start a local one."""
    if not ray.is_initialized():
        ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False)


class ServerRollout:
    """The group's rollout in server mode: the surface of :class:`HFRollout`, served through verl's managers."""

    def __init__(self, configs: Any, actor: Any):
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.workers.config import CheckpointEngineConfig
        from verl.workers.rollout.base import get_rollout_class
        from verl.workers.rollout.llm_server import LLMServerManager

        rollout_config = configs.rollout
        self.group = rollout_config.custom["group"]
        try:
            import cachetools  # noqa: F401 - verl's load balancer needs it; say so before Ray starts
        except ImportError:
            raise UserError("server mode needs the cachetools package (verl's load balancer imports it): "
                            "pip install cachetools", where=f"models.{self.group}.options.rollout_server") from None
        ensure_ray()
        register()
        verl_view = types.SimpleNamespace(actor_rollout_ref=types.SimpleNamespace(
            rollout=rollout_config, model=configs.actor.model_config))
        adapter = get_rollout_class(rollout_config.name, rollout_config.mode)(
            config=rollout_config, model_config=configs.actor.model_config, replica_rank=0)
        self.actor_group = InProcessActorGroup(actor, adapter)
        self.manager = LLMServerManager.create(config=verl_view, worker_group=self.actor_group)
        self.replicas = self.manager.get_replicas()
        self.server = self.replicas[0].server_handle
        self.client = self.manager.get_client()
        self.checkpoints = CheckpointEngineManager(config=CheckpointEngineConfig(backend="naive"),
                                                   actor_wg=self.actor_group, replicas=self.replicas)
        self.generator = _RemoteGenerator(self.server)
        self._requests = itertools.count()
        self._version: Optional[int] = ray.get(self.server.weight_version.remote())

    @property
    def server_names(self) -> list[str]:
        """The Ray actor names of this group's servers."""
        return [server_name(replica.config, replica.replica_rank) for replica in self.replicas]

    @property
    def weight_version(self) -> Optional[int]:
        """The version the server last reported (after a sync, or with its latest answers)."""
        return self._version

    def sync(self, global_steps: int) -> None:
        """verl's naive checkpoint-engine sync of the in-process trainer's weights to the server."""
        self.checkpoints.update_weights(global_steps=global_steps)
        self._version = ray.get(self.server.weight_version.remote())

    def generate(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, eos_ids: Sequence[int],
                 pad_id: int) -> tuple[list[list[int]], list[list[float]]]:
        """One ``LLMServerClient.generate`` request per prompt, all in flight together."""
        params = {"max_tokens": gen.max_new_tokens, "temperature": 0.0 if greedy else gen.temperature,
                  "logprobs": True, "unimas": {"generation": gen.model_dump(), "greedy": greedy,
                                               "eos_ids": list(eos_ids), "pad_id": pad_id}}

        async def every_prompt():
            return await asyncio.gather(*[
                self.client.generate(f"{self.group}-{next(self._requests)}", prompt_ids=list(prompt),
                                     sampling_params=params) for prompt in prompts])

        outputs = run_sync(every_prompt())
        if outputs:
            self._version = outputs[-1].extra_fields["global_steps"]
        return [list(o.token_ids) for o in outputs], [list(o.log_probs or []) for o in outputs]

    def logprobs(self, prompts: Sequence[list[int]], responses: Sequence[list[int]],
                 temperatures: Sequence[float]) -> list[list[float]]:
        """The server's teacher-forced log-probs (the sync check)."""
        return ray.get(self.server.logprobs.remote(list(prompts), list(responses), list(temperatures)))

    def close(self) -> None:
        """Stop the group's server actors, freeing their names for a later group of the same name."""
        if not ray.is_initialized():
            return
        for replica in self.replicas:
            for server in replica.servers:
                ray.kill(server)
