"""Make verl 0.9.1's FSDP2 engine run where there is no GPU, and give it a process group.

verl resolves its device through ``verl.plugin.platform``; with no CUDA it
falls back to the NVIDIA platform and fails in ``init_device_mesh("cuda")``.
:func:`install_cpu_platform` registers a CPU platform (device ``cpu``,
communication ``gloo``) and the FSDP engines for device ``cpu``, without
editing verl. It must run before ``verl.workers.engine`` is imported, because
that module captures the device name at import time; :func:`prepare` does both
steps in order and is what the rest of the package calls.

FSDP1 (``strategy: fsdp``) cannot run on CPU even with this shim (it hard-codes
a device id); options validation refuses it there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import types
from typing import Any

import torch

_lock = threading.Lock()
_installed = False
_port: int | None = None


def on_gpu() -> bool:
    """Whether verl's own (CUDA) platform applies."""
    return torch.cuda.is_available()


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _cpu_device_module() -> types.SimpleNamespace:
    """What verl calls on ``get_torch_device()``: memory stats, RNG, streams; no-ops where CPU has none."""
    return types.SimpleNamespace(
        is_available=lambda: True, current_device=lambda: "cpu", device_count=lambda: 1, set_device=_nothing,
        synchronize=_nothing, empty_cache=_nothing, ipc_collect=_nothing, max_memory_allocated=_zero,
        max_memory_reserved=_zero, memory_allocated=_zero, memory_reserved=_zero,
        reset_peak_memory_stats=_nothing, mem_get_info=lambda *a, **k: (0, 0),
        set_per_process_memory_fraction=_nothing, get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state, manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
        get_device_name=lambda *a, **k: "cpu", current_stream=torch.cpu.current_stream, stream=torch.cpu.stream,
        Stream=torch.cpu.Stream, Event=getattr(torch.cpu, "Event", None))


def _platform_class() -> type:
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    device_module = _cpu_device_module()

    class UnimasCPUPlatform(PlatformBase):
        """verl's view of a machine without accelerators: device ``cpu``, gloo, Ray resource ``CPU``."""

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: device_module)

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return not torch.cuda.is_available()

        def current_device(self) -> str:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        set_device = synchronize = set_allocator_settings = empty_cache = _nothing
        profiler_start = profiler_stop = cudart = _nothing

    PlatformRegistry.register(platform="unimas_cpu")(UnimasCPUPlatform)
    return UnimasCPUPlatform


def install_cpu_platform() -> None:
    """Register the CPU platform and CPU engines once per process (no-op on a CUDA machine)."""
    global _installed
    with _lock:
        if _installed or on_gpu():
            return
        from verl.plugin.platform import set_platform

        set_platform(_platform_class()())
        import verl.utils.distributed as distributed
        from verl.workers.engine import EngineRegistry
        from verl.workers.engine.fsdp import transformer_impl

        # Forward-only engines offload with pinned memory, which needs an accelerator.
        offload = transformer_impl.CPUOffloadPolicy
        transformer_impl.CPUOffloadPolicy = lambda pin_memory=True, **kw: offload(pin_memory=False, **kw)
        # verl builds the backend string "cpu:gloo,<device>:<comm>", a duplicate on CPU: plain gloo instead.
        init_group = distributed.initialize_global_process_group_ray

        def init_gloo(timeout_second=None, backend=None):
            return init_group(timeout_second=timeout_second, backend=backend or "gloo")

        distributed.initialize_global_process_group_ray = init_gloo
        # verl's workers import the function by name; a module already loaded keeps the old one.
        workers = sys.modules.get("verl.workers.engine_workers")
        if workers is not None:
            workers.initialize_global_process_group_ray = init_gloo
        for model_type, engine in (("language_model", transformer_impl.FSDPEngineWithLMHead),
                                   ("value_model", transformer_impl.FSDPEngineWithValueHead)):
            for strategy in ("fsdp", "fsdp2"):
                EngineRegistry._engines[model_type][strategy].setdefault("cpu", engine)
        _installed = True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_process_group() -> None:
    """A world-size-1 process group for in-process engines (gloo on CPU, NCCL on GPU); kept if one exists.

    Every in-process verl group shares it: each engine builds its own FSDP2
    module on the same one-rank mesh, so their weights never mix.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    # verl reads the rank layout from the environment; the rendezvous address stays out of it, so that child
    # processes (another unimas run) never inherit a port this process holds.
    for key, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    global _port
    _port = _free_port()
    dist.init_process_group(backend="nccl" if on_gpu() else "gloo", rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{_port}")


@contextlib.contextmanager
def rendezvous_environment():
    """``MASTER_ADDR``/``MASTER_PORT`` while verl's workers are built (they read them), then the old values."""
    saved = {key: os.environ.get(key) for key in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_port or 0))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def skip_value_head_patch() -> None:
    """verl patches trl's value-head model when trl is importable, and fails on trl >= 1 (the class moved).

    unimas's critics are token-classification models (:mod:`.critic`), not trl's, so verl is told trl is
    absent (only that patch looks).
    """
    from verl.models.transformers import monkey_patch

    monkey_patch.is_trl_available = lambda: False


def prepare() -> None:
    """Everything a verl engine in this process needs, in the order verl needs it."""
    from unimas.groups.verl.critic import install_value_model_loader

    install_cpu_platform()
    skip_value_head_patch()
    install_value_model_loader()
    ensure_process_group()
