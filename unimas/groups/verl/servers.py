"""Server mode (``options.rollout_server: true``): generation and weight sync through verl's server machinery.

In the default mode the group calls its rollout object directly. In server
mode the same Hugging Face rollout (:class:`unimas.groups.verl.rollout.HFRollout`)
lives in a **Ray actor** started by verl's own control path, as vLLM's servers are:

* :class:`HFServerReplica` is registered in verl's ``RolloutReplicaRegistry``
  as ``unimas_hf_server``; verl's ``LLMServerManager`` builds it (hybrid mode)
  and it launches one server actor named with the group's prefix from
  :mod:`.names` (``unimas_<group>_hf_server_<replica>_<node>``), so two groups
  in one Ray job never share a server;
* generation goes through verl's ``LLMServerClient.generate``, routed in this
  process (:class:`RoutedClient`, :mod:`.balancer`) instead of by verl's
  routing actor;
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
import os
import types
from typing import Any, Iterable, Optional, Sequence

import ray
import torch

from unimas.config.schema import GenerationConfig
from unimas.groups.verl import lora, names
from unimas.groups.verl.balancer import RequestRouter
from unimas.groups.verl.options import SERVER_ROLLOUT
from unimas.groups.verl.rollout import HFRollout, _base_class, run_sync
from unimas.process import ray_workers_at_normal_priority

SERVER_KIND = "hf"
"""The rollout part of the server actor names (``unimas_<group>_hf_server_...``)."""


def server_name(config: Any, replica_rank: int) -> str:
    """The Ray actor name of the group's server (the group name travels in ``rollout.custom``)."""
    return names.server_actor_name(config.custom["group"], SERVER_KIND, replica_rank, 0)


class HFRolloutServer:
    """Body of the server actor: unimas's HF rollout answering verl's server calls."""

    def __init__(self, config: Any, model_config: Any):
        from omegaconf import DictConfig
        from verl.utils.config import omega_conf_to_dataclass

        torch.set_num_threads(1)
        if isinstance(model_config, DictConfig):  # a worker-group replica passes verl's raw model section
            model_config = omega_conf_to_dataclass(model_config)
        self.rollout = HFRollout(config=config, model_config=model_config)

    def get_server_address(self) -> tuple[str, int]:
        """No HTTP endpoint: verl uses the address only as the load balancer's key."""
        return "127.0.0.1", 0

    def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                 **_unused: Any):
        """One prompt, sampled with the unimas settings carried in ``sampling_params["unimas"]``."""
        from verl.workers.rollout.replica import TokenOutput

        asked = sampling_params["unimas"]
        self.rollout.generator.manual_seed(int(sampling_params["seed"]))
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
        if replica_rank < 0:  # as verl's vLLM adapter: trainer rank r feeds replica r // (ranks per replica)
            per_replica = (config.tensor_model_parallel_size * config.data_parallel_size
                           * config.pipeline_model_parallel_size)
            replica_rank = int(os.environ.get("RANK", "0")) // per_replica
        self.replica_rank = replica_rank

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


def _llm_server() -> Any:
    from verl.workers.rollout import llm_server

    return llm_server


class GroupServerManager(_llm_server().LLMServerManager):
    """verl's manager of a group's server replicas, minus its routing actor (see :mod:`.balancer`).

    verl starts that actor in this one method; should a later verl start it elsewhere, the group still routes
    by itself (:class:`RoutedClient` never asks it) and ``tests/test_verl_server.py`` says the actor is back.
    """

    async def _init_global_load_balancer(self) -> None:
        self.global_load_balancer = None  # the group's one client routes in this process


class RoutedClient(_llm_server().LLMServerClient):
    """verl's client of the group's servers, routed by a :class:`RequestRouter` it holds itself.

    verl's client lets a subclass route without a balancer actor (``load_balancer_handle=None``);
    its ``generate`` asks :meth:`_acquire_server` for a server and always calls :meth:`_release_server`.
    """

    def __init__(self, config: Any, servers: dict[str, Any], load_balancer_handle: None = None):
        """``servers``: server id -> actor handle; ``load_balancer_handle`` is what verl's ``get_client`` passes
        (None: :class:`GroupServerManager` starts no balancer)."""
        super().__init__(config=config, load_balancer_handle=None)
        self.router = RequestRouter(servers)

    async def _acquire_server(self, request_id: str, **_request: Any) -> tuple[str, Any]:
        return self.router.acquire_server(request_id)

    def _release_server(self, server_id: str, request_id: Optional[str] = None) -> None:
        self.router.release_server(server_id)


def _vllm_replica() -> type:
    from unimas.groups.verl.vllm_servers import GroupvLLMReplica

    return GroupvLLMReplica


def register() -> None:
    """Make verl's registries find unimas's served rollouts (idempotent): the ``hf`` server-mode replica and
    adapter under ``unimas_hf_server``, and, where a vLLM build is installed, the per-group vLLM classes
    (:mod:`.vllm_servers`) under ``vllm``.

    The vLLM classes are looked up lazily, as verl's own are: a process that never builds a vLLM rollout
    never imports vLLM.
    """
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from unimas.groups.verl import vllm_cpu

    RolloutReplicaRegistry.register(SERVER_ROLLOUT, lambda: HFServerReplica)
    base._ROLLOUT_REGISTRY[(SERVER_ROLLOUT, "async")] = f"{__name__}.HFServerAdapter"
    if vllm_cpu.vllm_installed():
        RolloutReplicaRegistry.register("vllm", _vllm_replica)
        base._ROLLOUT_REGISTRY[("vllm", "async")] = "unimas.groups.verl.vllm_servers.GroupServerAdapter"


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
        """Export the engine's HF-named tensors and hand them to the adapter (verl's naive sync, one rank).

        A LoRA group sends base and adapter under their peft names (:func:`.lora.peft_weights`), which the
        server's rollout holds too, instead of verl's export (merged, in bfloat16).
        """
        if mode != "naive":
            raise ValueError(f"an in-process verl trainer syncs with the naive checkpoint engine, not {mode!r}")
        engine = self.actor.engine
        weights = lora.peft_weights(engine) if engine.model_config.lora_rank else engine.get_per_tensor_param()[0]
        run_sync(self.adapter.update_weights(weights, global_steps=global_steps))
        return ray.put(global_steps)


def ensure_ray() -> None:
    """Join the Ray job of this process (a ``runtime: ray`` actor) or start a local one.

    A local job declares more logical CPUs than cores: each rank of a worker
    group (:mod:`.workers`) holds a CPU bundle, and a few groups' ranks exceed
    a small machine's cores although they mostly wait on each other.
    """
    if not ray.is_initialized():
        ray_workers_at_normal_priority()
        ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False, num_cpus=max(os.cpu_count() or 1, 16))


class ServerRollout:
    """The group's rollout through verl's managers: the surface of :class:`HFRollout`, served by Ray actors.

    ``root`` is verl's trainer config (or a view of it) whose
    ``actor_rollout_ref.rollout``/``.model`` describe the rollout;
    ``actor_group`` is the worker group whose ranks push weights at a sync —
    :class:`InProcessActorGroup` for an in-process trainer, verl's
    ``RayWorkerGroup`` for a worker-group trainer (a server replica per rank).
    """

    def __init__(self, root: Any, actor_group: Any):
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.workers.config import CheckpointEngineConfig

        self.group = root.actor_rollout_ref.rollout.custom["group"]
        ensure_ray()
        register()
        self.own_servers = root.actor_rollout_ref.rollout.name != "vllm"
        """unimas's hf servers (which take unimas's sampling settings), not vLLM's."""
        self.can_score = self.own_servers
        """Whether the servers score given tokens (the sync check); vLLM's only report sampled log-probs."""
        self.actor_group = actor_group
        self.manager = GroupServerManager.create(config=root, worker_group=actor_group)
        self.replicas = self.manager.get_replicas()
        self.servers = [replica.server_handle for replica in self.replicas]
        self.client = self.manager.get_client(RoutedClient, servers=dict(zip(self.manager.server_addresses,
                                                                              self.manager.server_handles)))
        self.checkpoints = CheckpointEngineManager(config=CheckpointEngineConfig(backend="naive"),
                                                   actor_wg=actor_group, replicas=self.replicas)
        self.generator = torch.Generator()
        """Draws each request's sampling seed: what a server samples depends on neither routing nor arrival order,
        and this generator (saved with checkpoints) is all the sampling state a resume needs."""
        self.generator.manual_seed(int(root.actor_rollout_ref.rollout.seed))
        self._requests = itertools.count()
        self._version: Optional[int] = self._server_version()

    @classmethod
    def in_process(cls, configs: Any, actor: Any) -> "ServerRollout":
        """Server mode of an in-process trainer: one server, fed through :class:`InProcessActorGroup`."""
        from verl.workers.rollout.base import get_rollout_class

        register()
        root = types.SimpleNamespace(actor_rollout_ref=types.SimpleNamespace(
            rollout=configs.rollout, model=configs.actor.model_config))
        adapter = get_rollout_class(configs.rollout.name, configs.rollout.mode)(
            config=configs.rollout, model_config=configs.actor.model_config, replica_rank=0)
        return cls(root, InProcessActorGroup(actor, adapter))

    @property
    def server_names(self) -> list[str]:
        """The Ray actor names of this group's servers."""
        kind = SERVER_KIND if self.own_servers else "vllm"
        return [names.server_actor_name(self.group, kind, replica.replica_rank, 0) for replica in self.replicas]

    @property
    def weight_version(self) -> Optional[int]:
        """The version the servers last reported (after a sync, or with their latest answers)."""
        return self._version

    def _server_version(self) -> Optional[int]:
        """The servers' common weight version; a disagreement is a failed sync.

        vLLM's servers have no version query; they stamp every answer, so their
        version is known from the next generation (the sync check samples one).
        """
        if not self.can_score:
            return None
        versions = set(ray.get([server.weight_version.remote() for server in self.servers]))
        if len(versions) != 1:
            raise RuntimeError(f"model group '{self.group}': its rollout servers hold different weight versions "
                               f"{sorted(versions, key=str)} after a sync")
        return versions.pop()

    def sync(self, global_steps: int) -> None:
        """verl's naive checkpoint-engine sync: every trainer rank pushes its weights to its server."""
        self.checkpoints.update_weights(global_steps=global_steps)
        self._version = self._server_version()

    def sleep(self) -> None:
        """Free the servers' weights and cache while the trainer updates (vLLM; hf servers keep theirs).

        The next :meth:`sync` brings them back: verl's naive sync resumes the
        weights before loading and the cache after.
        """
        self.checkpoints.sleep_replicas()

    def generate(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, eos_ids: Sequence[int],
                 pad_id: int) -> tuple[list[list[int]], list[list[float]]]:
        """One ``LLMServerClient.generate`` request per prompt, all in flight together (verl balances servers)."""
        params = {"max_tokens": gen.max_new_tokens, "temperature": 0.0 if greedy else gen.temperature,
                  "top_p": gen.top_p, "logprobs": True}
        if gen.top_k:
            params["top_k"] = gen.top_k
        if self.own_servers:  # unimas's own servers sample exactly as the in-process rollout
            params["unimas"] = {"generation": gen.model_dump(), "greedy": greedy, "eos_ids": list(eos_ids),
                                "pad_id": pad_id}
        else:  # vLLM stops at the group's end-of-sequence ids (the model's own and the tokenizer's), as unimas's
            params["stop_token_ids"] = list(eos_ids)
        seeds = torch.randint(2**62, (len(prompts),), generator=self.generator).tolist()

        async def every_prompt():
            return await asyncio.gather(*[
                self.client.generate(f"{self.group}-{next(self._requests)}", prompt_ids=list(prompt),
                                     sampling_params={**params, "seed": seed})
                for prompt, seed in zip(prompts, seeds)])

        outputs = run_sync(every_prompt())
        if outputs:
            self._version = outputs[-1].extra_fields["global_steps"]
        return [list(o.token_ids) for o in outputs], [list(o.log_probs or []) for o in outputs]

    def logprobs(self, prompts: Sequence[list[int]], responses: Sequence[list[int]],
                 temperatures: Sequence[float]) -> list[list[float]]:
        """The first server's teacher-forced log-probs."""
        return self.logprobs_per_server(prompts, responses, temperatures)[0]

    def logprobs_per_server(self, prompts: Sequence[list[int]], responses: Sequence[list[int]],
                            temperatures: Sequence[float]) -> list[list[list[float]]]:
        """Every server's teacher-forced log-probs (the sync check holds each to the trainer's)."""
        return ray.get([server.logprobs.remote(list(prompts), list(responses), list(temperatures))
                        for server in self.servers])

    def close(self) -> None:
        """Stop the group's server actors, freeing their names for a later group of the same name."""
        replicas, self.replicas = self.replicas, []  # at most once
        if not ray.is_initialized():
            return
        for replica in replicas:
            for server in replica.servers:
                ray.kill(server)
