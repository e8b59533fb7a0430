"""Everything unimas installs into verl 0.9.1, in the order :func:`prepare` installs it, and why.

verl is used as it is published, never edited; where it does not do what a
unimas group needs, this module replaces one of its names at run time. Each
patch is idempotent and happens once per process (the group's own, and every
Ray rank through :mod:`.worker_setup`):

1. :func:`install_cpu_platform` — verl resolves its device through
   ``verl.plugin.platform``; with no CUDA it falls back to the NVIDIA platform
   and fails in ``init_device_mesh("cuda")``. This registers a CPU platform
   (device ``cpu``, communication ``gloo``) and the FSDP engines for device
   ``cpu``. It must run before ``verl.workers.engine`` is imported, because
   that module captures the device name at import time. (FSDP1,
   ``strategy: fsdp``, cannot run on CPU even so: it hard-codes a device id;
   options validation refuses it there.)
2. :func:`skip_value_head_patch` — verl patches trl's value-head model when
   trl is importable, and fails on trl >= 1; unimas's critics are not trl's.
3. :func:`install_value_model_loader` — verl's value engine loads critics
   through :func:`_load_value_model`: the group's attention implementation,
   safetensors only, no code from the model dir, the head at zero.
4. :func:`ensure_process_group` — a world-size-1 process group for
   in-process engines (the group's process only; Ray ranks get theirs from verl).

The rollout classes unimas registers in verl's rollout registry are the
rollout modules' own (:func:`unimas.groups.verl.servers.register`), installed
beside these by the group and by :mod:`.worker_setup`.
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

    unimas's critics are token-classification models (:func:`_load_value_model`), not trl's, so verl is told
    trl is absent (only that patch looks).
    """
    from verl.models.transformers import monkey_patch

    monkey_patch.is_trl_available = lambda: False


_value_loader_installed = False


def _load_value_model(local_path: str, torch_dtype: torch.dtype, model_config: Any, trust_remote_code: bool):
    """What verl's value engine builds its module with: a one-label token-classification model, zero head.

    verl's own loader asks for flash-attention (absent on CPU) and falls back
    to trl's value-head class; this one keeps the attention the group's config
    names, reads safetensors only and never runs code from the model dir (whatever verl passes as
    ``trust_remote_code``). The head's random init is drawn from a
    forked generator and then zeroed, so the process's RNG streams are untouched.
    """
    from transformers import AutoModelForTokenClassification

    with torch.random.fork_rng(devices=[]):
        model = AutoModelForTokenClassification.from_pretrained(
            local_path, dtype=torch_dtype, config=model_config, trust_remote_code=False,  # never a dir's own code
            attn_implementation=getattr(model_config, "_attn_implementation", None) or "sdpa",
            local_files_only=True, use_safetensors=True)
    heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
    if not heads:
        raise ValueError(f"{type(model).__name__} has no one-output head to value tokens with")
    with torch.no_grad():
        for parameter in heads[-1].parameters():
            parameter.zero_()
    return model


def install_value_model_loader() -> None:
    """Route verl's value-model loading through :func:`_load_value_model` (once per process, every rank)."""
    global _value_loader_installed
    if _value_loader_installed:
        return
    import verl.utils.model

    verl.utils.model.load_valuehead_model = _load_value_model  # looked up by name each time an engine builds
    _value_loader_installed = True


def install() -> None:
    """Patches 1-3 (module docstring), in order: what every process that builds a verl engine needs."""
    install_cpu_platform()
    skip_value_head_patch()
    install_value_model_loader()


def prepare() -> None:
    """Everything a verl engine in the group's own process needs, in the order verl needs it (1-4)."""
    install()
    ensure_process_group()
