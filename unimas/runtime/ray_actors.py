"""The Ray transport: every model group is a Ray actor; the controller keeps thin records.

``RayTransport`` implements :class:`~unimas.groups.base.Transport`
like :class:`~unimas.runtime.local.LocalTransport`, so the trainer, the router
and the controller do not know which one they drive. Routing and
micro-batching stay in the hub's :class:`~unimas.controller.router.Router`;
this module only moves a batch to the group's actor and the answer back.

What crosses the star (both directions, pickled by Ray):

* to a group: ``GenRequest`` (prompt text, the role's generation settings,
  adapter name), ``TrainTurn`` (token ids, rollout log-probs, one scalar
  advantage), checkpoint paths;
* from a group: ``GenResult`` (text, token ids, per-token log-probs), update
  metrics (a flat ``{name: float}``).

Logits, activations, weights and optimiser state never leave the actor.

Each actor runs one method at a time (``max_concurrency=1``), and Ray runs
calls from one caller in submission order, so a group sees its batches in
exactly the order the router flushed them — the same order as in-process —
which keeps sampling deterministic. Different groups are different processes
and run in parallel: ``await ref`` never blocks the event loop, so the
trainer's concurrent ``update`` calls really overlap.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import ray
from ray.exceptions import RayActorError, RayTaskError

from unimas.config.loading import config_from_dict
from unimas.config.schema import ExperimentConfig, ModelGroupConfig, RuntimeConfig
from unimas.contract.registry import build_registry
from unimas.errors import ModelGroupError, UserError
from unimas.groups.base import Critique, GenRequest, GenResult, TrainTurn
from unimas.groups.verl import preflight as verl_preflight
from unimas.process import ray_workers_at_normal_priority, torch_setup
from unimas.runtime.build import build_group
from unimas.runtime.placement import describe, fits_some_node, group_need, placement_plan

log = logging.getLogger(__name__)

RAY_LOGGING_LEVEL = logging.ERROR
"""Ray's own logger level in the driver: keep the console for training progress."""


class ActorDied(RuntimeError):
    """The cause of a :class:`ModelGroupError` when the group's Ray actor is gone (killed, OOM, node lost)."""


def _one_line(text: str, limit: int = 300) -> str:
    """Ray's death messages span many lines; keep the informative ones, on one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    keep = [line for line in lines if line.startswith(("pid:", "ip:"))]
    keep += [line for line in lines[1:] if not line.startswith(("class_name:", "actor_id:", "pid:", "ip:",
                                                                  "name:", "namespace:"))]
    text = "; ".join(keep) if keep else (lines[0] if lines else "no details")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------- Ray


def connect(runtime: RuntimeConfig, cpus_needed: float = 0.0) -> bool:
    """Connect this process to Ray; True when this call connected it (and so must disconnect it).

    No ``runtime.address``: start a private local instance with
    ``max(cpu count, CPUs the groups ask for)`` CPUs, so a 2-core machine
    can place two groups asking for one CPU each (on top of the driver). An
    address (``auto``, ``host:port``, ``ray://...``): join that cluster;
    leaving it later only disconnects, the cluster keeps running. No
    dashboard, no runtime_env (workers import unimas from their own
    environment), Ray's own logging at ERROR, workers of a local instance not niced
    (:func:`unimas.process.ray_workers_at_normal_priority`).
    """
    if ray.is_initialized():
        return False
    if runtime.address is not None:
        _check_reachable(runtime.address)
    quiet = {"logging_level": RAY_LOGGING_LEVEL, "log_to_driver": True}
    if runtime.address is None:
        cpus = max(os.cpu_count() or 1, math.ceil(cpus_needed))
        ray_workers_at_normal_priority()
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, **quiet)
        return True
    try:
        ray.init(address=runtime.address, **quiet)
    except Exception as exc:  # noqa: BLE001 - any failure to join the cluster is reported the same way
        raise UserError(f"cannot connect to the Ray cluster at '{runtime.address}': {type(exc).__name__}: "
                        f"{_one_line(str(exc))}", where="runtime.address") from None
    return True


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``host:port`` nobody listens at: Ray itself retries for many minutes."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        return  # "auto" and other forms: Ray resolves them and fails fast itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"nothing accepts connections at {target} ({exc.strerror or exc}). Is the Ray head "
                        "running there (`ray start --head`)? Leave runtime.address empty to start a local "
                        "instance.", where="runtime.address") from None


def node_label(address: str, node_id: str) -> str:
    """How plans and errors name a node: its address, and the start of its id (several nodes may share a host)."""
    return f"{address} ({node_id[:8]})"


def _live_nodes() -> dict[str, dict]:
    return {node["NodeID"]: node for node in ray.nodes() if node.get("Alive")}


def cluster_resources() -> tuple[dict[str, float], list[tuple[str, dict[str, float]]]]:
    """(cluster totals, [(node label, node resources)] of live nodes) as Ray reports them."""
    nodes = [(node_label(node.get("NodeManagerAddress", "?"), node_id), dict(node.get("Resources", {})))
             for node_id, node in _live_nodes().items()]
    return dict(ray.cluster_resources()), nodes


# ------------------------------------------------------------- the actor


class ModelGroupActor:
    """One model group in its own process: weights, optimiser, sampler state and every big tensor.

    Built from the JSON-safe config dump, with the plugin registry rebuilt in
    this process, so nothing but plain data crosses to create it.
    """

    def __init__(self, config_tree: dict, name: str, driver_sys_path: list[str]):
        # Plugin modules the driver imports from its own paths (e.g. `plugins:` next to a
        # config) resolve here too; appended, so they never shadow this environment.
        for entry in driver_sys_path:
            if entry and entry not in sys.path and os.path.isdir(entry):
                sys.path.append(entry)
        self._config_tree = config_tree
        self.name = name
        self.group = None
        self._spans: deque[tuple[str, float, float]] = deque(maxlen=256)

    def setup(self) -> dict[str, Any]:
        """Build the group (errors come back as the original exception) and say where it runs."""
        config = config_from_dict(self._config_tree, "<config sent to the model-group actor>")
        torch_setup(config.trainer.torch_threads, config.trainer.seed)  # as the driver does in local mode
        self.group = build_group(config, build_registry(config.plugins), self.name)
        gc.collect()
        gc.freeze()  # the model and imported modules live as long as the actor: keep them out of full GC passes
        return self.info()

    def info(self) -> dict[str, Any]:
        import torch

        context = ray.get_runtime_context()
        return {
            "group": self.name,
            "pid": os.getpid(),
            "node_id": context.get_node_id(),
            "resources": dict(context.get_assigned_resources()),
            "torch_threads": torch.get_num_threads(),
        }

    def _timed(self, method: str, fn: Callable[[], Any]) -> Any:
        started = time.time()
        try:
            return fn()
        finally:
            self._spans.append((method, started, time.time()))

    def spans(self) -> list[tuple[str, float, float]]:
        """(method, wall start, wall end) of recent calls: shows that groups work in parallel."""
        return list(self._spans)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return self._timed("generate", lambda: self.group.generate(requests))

    def update(self, turns: list[TrainTurn]) -> dict[str, float]:
        return self._timed("update", lambda: self.group.update(turns))

    def score(self, turns: list[TrainTurn]) -> list[float]:
        return self._timed("score", lambda: self.group.score(turns))

    def critique(self, turns: list[TrainTurn]) -> Critique:
        return self._timed("critique", lambda: self.group.critique(turns))

    def save(self, directory: str) -> None:
        self._timed("save", lambda: self.group.save(Path(directory)))

    def load(self, directory: str) -> None:
        self._timed("load", lambda: self.group.load(Path(directory)))

    def save_weights(self, directory: str) -> None:
        self._timed("save_weights", lambda: self.group.save_weights(Path(directory)))

    def load_weights(self, directory: str) -> None:
        self._timed("load_weights", lambda: self.group.load_weights(Path(directory)))


RemoteModelGroup = ray.remote(ModelGroupActor)


# ------------------------------------------------------------- transport


class RayTransport:
    """Model groups as Ray actors; the twin of ``LocalTransport``.

    ``actors`` maps group name to an actor handle with the methods of
    :class:`ModelGroupActor` (the controller benchmark passes stand-in
    actors). ``spawn(name)`` creates a fresh actor for ``restart``, after
    checking that some live node still has room for the group's ``groups``
    entry: a group pinned by a custom resource to a node that died would
    otherwise wait for that node forever.
    """

    def __init__(self, actors: dict[str, Any], *, spawn: Callable[[str], Any] | None = None,
                 owns_ray: bool = False, groups: dict[str, ModelGroupConfig] | None = None):
        self.actors = dict(actors)
        self.info: dict[str, dict[str, Any]] = {}
        """Per group: pid, node id and the resources Ray assigned to its actor."""
        self.restarts: list[tuple[str, str | None]] = []
        """(group, checkpoint it was restarted from or None for initial weights), in order."""
        self._spawn = spawn
        self._owns_ray = owns_ray
        self._groups = dict(groups or {})
        """Group name -> its config: what a replacement actor must find room for."""

    @classmethod
    def start(cls, config: ExperimentConfig) -> "RayTransport":
        """Connect to (or start) Ray, check placement, start one actor per group, wait until built.

        Each actor rebuilds the plugin registry from ``config.plugins`` in its own process.
        """
        cpus = sum(group.resources.cpus + verl_preflight.rank_cpus(group) for group in config.models.values())
        owns_ray = connect(config.runtime, cpus)
        tree = config.model_dump(mode="json", by_alias=True)
        driver_path = [p or os.getcwd() for p in sys.path]  # "" is the cwd of `python -m unimas.cli`

        def spawn(name: str):
            res = config.models[name].resources
            # a group with a rollout copy (max_staleness > 0) generates while it updates: two calls at once;
            # its own locks order them
            overlap = config.algorithm_for(name).max_staleness > 0
            # a verl worker group's ranks take the group's GPUs themselves; its actor only drives them
            gpus = 0 if verl_preflight.ranks_on_ray(config.models[name]) else res.gpus
            options: dict[str, Any] = {"num_cpus": res.cpus, "num_gpus": gpus, "max_restarts": 0,
                                       "max_concurrency": 2 if overlap else 1}
            if res.memory_gb:
                options["memory"] = int(res.memory_gb * 2**30)
            if res.custom:
                options["resources"] = dict(res.custom)
            return RemoteModelGroup.options(**options).remote(tree, name, driver_path)

        transport = cls({}, spawn=spawn, owns_ray=owns_ray, groups=config.models)
        try:
            totals, nodes = cluster_resources()
            placement_plan(config, totals, nodes)  # raises UserError before anything waits forever
            names = sorted(config.models)
            for name in names:
                transport.actors[name] = spawn(name)
            infos = ray.get([transport.actors[name].setup.remote() for name in names])
            transport.info = {name: _with_node(info) for name, info in zip(names, infos)}
        except RayTaskError as exc:
            transport.shutdown()
            if isinstance(exc.cause, UserError):
                raise exc.cause from None
            raise
        except BaseException:  # Ctrl-C while actors load included: leave nothing running
            transport.shutdown()
            raise
        return transport

    # -- calls ------------------------------------------------------------
    async def _call(self, group: str, method: str, *args: Any) -> Any:
        """Call an actor method without blocking the event loop; failures become :class:`ModelGroupError`.

        An exception inside the method is the cause as itself, as in-process;
        a dead actor's cause is :class:`ActorDied` with Ray's report on one line.
        """
        try:
            return await getattr(self.actors[group], method).remote(*args)
        except RayActorError as exc:
            cause: BaseException = ActorDied(f"the Ray actor of model group '{group}' died{self._where(group)}: "
                                             f"{_one_line(str(exc))}")
        except RayTaskError as exc:
            if isinstance(exc.cause, UserError):
                raise exc.cause from None
            cause = exc.cause
        raise ModelGroupError(group, method, cause) from None

    async def generate(self, group: str, requests: list[GenRequest]) -> list[GenResult]:
        return await self._call(group, "generate", requests)

    async def update(self, group: str, turns: list[TrainTurn]) -> dict[str, float]:
        return await self._call(group, "update", turns)

    async def score(self, group: str, turns: list[TrainTurn]) -> list[float]:
        return await self._call(group, "score", turns)

    async def critique(self, group: str, turns: list[TrainTurn]) -> Critique:
        return await self._call(group, "critique", turns)

    async def save(self, group: str, directory: Path) -> None:
        await self._call(group, "save", str(directory))

    async def load(self, group: str, directory: Path) -> None:
        await self._call(group, "load", str(directory))

    async def save_weights(self, group: str, directory: Path) -> None:
        await self._call(group, "save_weights", str(directory))

    async def load_weights(self, group: str, directory: Path) -> None:
        await self._call(group, "load_weights", str(directory))

    async def spans(self, group: str) -> list[tuple[str, float, float]]:
        return await self._call(group, "spans")

    def _where(self, group: str) -> str:
        """' on node 10.0.0.3 (1a2b3c4d), which is gone': where the group's actor ran, for its death message."""
        node_id = self.info.get(group, {}).get("node_id")
        if node_id is None:
            return ""
        try:
            gone = node_id not in _live_nodes()
        except Exception:  # noqa: BLE001 - Ray itself going down: the node's name is still worth saying
            gone = False
        return f" on node {self.info[group].get('node', node_id[:8])}" + (", which is gone" if gone else "")

    # -- lifecycle --------------------------------------------------------
    async def restart(self, group: str, checkpoint: Path | None) -> None:
        """Replace the group's actor with a fresh one: from ``checkpoint`` (a group dir), else initial weights."""
        if self._spawn is None:
            raise ModelGroupError(group, "restart", RuntimeError("this transport cannot start new actors"))
        old = self.actors.get(group)
        if old is not None:
            _kill(old)
        if group in self._groups:
            self._check_room(group)
        log.warning("restarting model group '%s' from %s", group, checkpoint or "its initial weights")
        self.actors[group] = self._spawn(group)
        self.info[group] = _with_node(await self._call(group, "setup"))
        if checkpoint is not None:
            await self.load(group, checkpoint)
        self.restarts.append((group, None if checkpoint is None else str(checkpoint)))

    def _check_room(self, group: str) -> None:
        """Fail now, not hang, when no live node could ever host the replacement (its node was the only one)."""
        _totals, nodes = cluster_resources()
        if not fits_some_node(self._groups[group], nodes):
            res = self._groups[group].resources
            raise ModelGroupError(group, "restart", RuntimeError(
                f"no live node can host it ({describe(group_need(self._groups[group]))}); "
                + (f"start a node with `ray start --resources` offering {res.custom}" if res.custom
                   else "add a node with that much room")))

    def shutdown(self) -> None:
        """Kill every group actor; stop the local Ray instance only if we started it. Idempotent."""
        for actor in self.actors.values():
            _kill(actor)
        self.actors.clear()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()  # a joined cluster is only disconnected from, never stopped
        self._owns_ray = False


def _with_node(info: dict[str, Any]) -> dict[str, Any]:
    """An actor's ``info`` with ``node``: the label of the node it runs on, as plans and errors name it."""
    node = _live_nodes().get(info.get("node_id", ""))
    if node is not None:
        info = {**info, "node": node_label(node.get("NodeManagerAddress", "?"), info["node_id"])}
    return info


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already dead or Ray already down: nothing left to stop
        pass


def ray_available(config: ExperimentConfig) -> tuple[dict[str, float], list[tuple[str, dict[str, float]]], bool]:
    """Connect to (or start) the Ray instance ``runtime`` names and read its resources.

    Returns ``(totals, nodes, started)``; when ``started`` the caller disconnects
    with ``ray.shutdown()`` (which stops only an instance this process started).
    """
    started = connect(config.runtime, sum(g.resources.cpus for g in config.models.values()))
    totals, nodes = cluster_resources()
    return totals, nodes, started
