"""The in-process transport: model groups are plain objects in this process.

Calls run inline on the event loop, except, with ``algorithm.max_staleness > 0`` for some group (the
asynchronous pipeline), ``update``: it runs on one worker thread, so the next steps' episodes are generated
on the event loop meanwhile (torch releases the GIL in its kernels; each group's locks keep its own calls
consistent). Generation stays inline and the groups' updates share the one thread: measured on 2 shared
cores, more threads (one per generate call, or per group update) cost more in GIL hand-offs than they
overlapped.

A group whose work runs in other processes (``ModelGroup.waits_on_workers``, e.g. a verl group on its own Ray
ranks) only waits in this one, so every call of it runs on a thread of its own (one per group, keeping its
calls in order): two such groups generate and update at the same time, and the event loop goes on meanwhile.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import Registry
from unimas.errors import ModelGroupError, UserError
from unimas.groups.base import Critique, GenRequest, GenResult, ModelGroup, TrainTurn
from unimas.runtime.build import build_group


class LocalTransport:
    def __init__(self, groups: dict[str, ModelGroup], config: ExperimentConfig, registry: Registry):
        self.groups = groups
        self.config = config
        self.registry = registry
        threaded = any(config.algorithm_for(g).max_staleness > 0 for g in config.models)
        self._updater = ThreadPoolExecutor(1, thread_name_prefix="unimas-update") if threaded else None
        self._own_threads = {name: ThreadPoolExecutor(1, thread_name_prefix=f"unimas-{name}")
                             for name, group in groups.items() if group.waits_on_workers}

    @classmethod
    def start(cls, config: ExperimentConfig, registry: Registry) -> "LocalTransport":
        groups = {}
        for name in sorted(config.models):
            try:
                groups[name] = build_group(config, registry, name)
            except UserError:
                raise
            except Exception as exc:  # noqa: BLE001 - a group that cannot be built is that group's failure
                raise ModelGroupError(name, "start", exc) from exc
        return cls(groups, config, registry)

    def _call(self, group: str, phase: str, *args):
        try:
            return getattr(self.groups[group], phase)(*args)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure inside a group is that group's failure
            raise ModelGroupError(group, phase, exc) from exc

    async def _run(self, group: str, phase: str, *args):
        """The call on the group's own thread (a group waiting on workers elsewhere), else inline."""
        if group in self._own_threads:
            return await asyncio.get_running_loop().run_in_executor(self._own_threads[group], self._call, group,
                                                                    phase, *args)
        return self._call(group, phase, *args)

    async def generate(self, group: str, requests: list[GenRequest]) -> list[GenResult]:
        return await self._run(group, "generate", requests)

    async def update(self, group: str, turns: list[TrainTurn]) -> dict[str, float]:
        if self._updater is not None and group not in self._own_threads:
            return await asyncio.get_running_loop().run_in_executor(self._updater, self._call, group, "update", turns)
        return await self._run(group, "update", turns)

    async def critique(self, group: str, turns: list[TrainTurn]) -> Critique:
        """Like ``update``: on the update thread when there is one."""
        if self._updater is not None and group not in self._own_threads:
            return await asyncio.get_running_loop().run_in_executor(self._updater, self._call, group, "critique",
                                                                    turns)
        return await self._run(group, "critique", turns)

    async def score(self, group: str, turns: list[TrainTurn]) -> list[float]:
        return await self._run(group, "score", turns)

    async def save(self, group: str, directory: Path) -> None:
        await self._run(group, "save", directory)

    async def load(self, group: str, directory: Path) -> None:
        await self._run(group, "load", directory)

    async def save_weights(self, group: str, directory: Path) -> None:
        await self._run(group, "save_weights", directory)

    async def load_weights(self, group: str, directory: Path) -> None:
        await self._run(group, "load_weights", directory)

    async def restart(self, group: str, checkpoint: Path | None) -> None:
        """Rebuild a group from config, then load ``checkpoint`` (initial weights when None)."""
        old = self.groups.pop(group, None)
        if old is not None:
            old.close()
        try:
            self.groups[group] = build_group(self.config, self.registry, group)
        except Exception as exc:  # noqa: BLE001
            raise ModelGroupError(group, "restart", exc) from exc
        if checkpoint is not None:
            await self.load(group, checkpoint)

    def shutdown(self) -> None:
        for executor in [self._updater, *self._own_threads.values()]:
            if executor is not None:
                executor.shutdown(wait=True)
        for group in self.groups.values():
            group.close()
        self.groups.clear()
