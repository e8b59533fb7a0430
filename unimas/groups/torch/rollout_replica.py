"""A torch group's rollout replica: a copy of its weights that samples in a child process.

Why a process. The asynchronous pipeline generates the next steps' episodes
while the group updates on this one. In one interpreter the sampling and the
update take turns on the GIL, so with a small model (milliseconds of torch
per call, the rest Python) they barely overlap. With
``models.<g>.options.rollout_process: true`` the group's sampling loop runs
in a child interpreter of its own; this process only renders prompts,
decodes results and waits on a pipe (the GIL free) while the update thread
trains.

Channels, neither of them pickle. Weights: one shared-memory file
(``/dev/shm``) mapped by both processes, a header with the weight version,
then every parameter of the model (:class:`WeightLayout`). The parent writes
it after each update (:meth:`RolloutReplica.publish`, under the group's
rollout lock, so never while the child samples); on CPU the child's
parameters *are* views of the file, on CUDA the child copies it to its
device when the version changed. Requests and replies: one JSON object per
line over two pipes (token ids, log-probs, settings, the generator state as
base64). The child reports the version it sampled with, read from the file's
header; results carry that version, so staleness and importance ratios use it.

Lifetime. The child exits when its request pipe closes (the parent closed
the group or died: the kernel closes the pipe either way) and, should it be
busy, when a watchdog thread sees its parent gone. The parent stops the
child on :meth:`close`, at interpreter exit (a ``weakref.finalize``) and when
the group is collected. A child that dies is reported at the next call as a
:class:`RolloutProcessError` naming the group, with the tail of its output.

The child's side is :mod:`unimas.groups.torch.replica_main`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import mmap
import os
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from unimas.config.schema import GenerationConfig
from unimas.groups.base import GroupSpec
from unimas.groups.child_pipe import ChildPipe
from unimas.groups.torch.state import RngState
from unimas.safe_load import load_tensors, reading

HEADER_BYTES = 64
"""The file starts with the weight version (int64), padded so that every parameter is 64-byte aligned."""
ALIGN = 64
RNG_FILE = "rollout_rng.pt"
"""The replica's sampling generator in a group checkpoint (beside ``rng.pt``, the trainer side's)."""
DTYPES = {str(t): t for t in (torch.float32, torch.bfloat16, torch.float16, torch.float64)}


class RolloutProcessError(RuntimeError):
    """The replica's process died or refused a request; the first line names the group."""


@dataclass
class WeightLayout:
    """Where each parameter lives in the shared file: ``(name, dtype, shape, offset)`` in parameter order."""

    entries: list[tuple[str, str, list[int], int]]
    size: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> "WeightLayout":
        entries, offset = [], HEADER_BYTES
        for name, param in model.named_parameters():
            entries.append((name, str(param.dtype), list(param.shape), offset))
            offset += -(-param.numel() * param.element_size() // ALIGN) * ALIGN
        return cls(entries, max(offset, HEADER_BYTES))

    def to_json(self) -> dict[str, Any]:
        return {"entries": [list(e) for e in self.entries], "size": self.size}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "WeightLayout":
        return cls([(str(n), str(d), [int(x) for x in s], int(o)) for n, d, s, o in data["entries"]], int(data["size"]))

    def mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Why ``model``'s parameters do not fit this layout; None when they do."""
        mine = WeightLayout.of(model)
        if mine.entries == self.entries:
            return None
        theirs = {e[0]: e[1:3] for e in self.entries}
        for name, dtype, shape, _ in mine.entries:
            if theirs.get(name) != (dtype, shape):
                return f"parameter {name} ({dtype}, {shape}) is {theirs.get(name, 'absent')} in the trainer's model"
        return f"{len(self.entries)} parameters in the trainer's model, {len(mine.entries)} in the replica's"


def map_file(path: str, size: int) -> tuple[mmap.mmap, torch.Tensor, torch.Tensor]:
    """(the mapping, its bytes as a uint8 tensor, the version as a 1-element int64 tensor)."""
    with open(path, "r+b") as handle:
        mapping = mmap.mmap(handle.fileno(), size)
    data = torch.frombuffer(mapping, dtype=torch.uint8)
    return mapping, data, data[:8].view(torch.int64)


def views(data: torch.Tensor, layout: WeightLayout) -> list[torch.Tensor]:
    """Each parameter's tensor inside the mapped file."""
    out = []
    for _, dtype, shape, offset in layout.entries:
        kind = DTYPES[dtype]
        nbytes = math.prod(shape) * torch.empty((), dtype=kind).element_size()
        out.append(data[offset: offset + nbytes].view(kind).view(shape))
    return out


def digests(model: torch.nn.Module) -> list[str]:
    """SHA-256 of each parameter's bytes, in parameter order: equal lists mean bit-identical weights."""
    return [hashlib.sha256(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            for p in model.parameters()]


def encode_state(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_state(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def child_spec(spec: GroupSpec) -> dict[str, Any]:
    """What the child builds its sampling copy from, as JSON: the group's sources, no critic, no pipeline,
    sampling in place (no replica of its own), not trainable (it never updates)."""
    config = spec.config.model_copy(update={"critic": None, "trainable": False})
    return {"name": spec.name, "config": config.model_dump(mode="json"),
            "options": spec.options.model_copy(update={"rollout_process": False, "sampler": "inplace"}
                                               ).model_dump(mode="json"),
            "adapters": list(spec.adapters), "seed": spec.seed,
            "algorithm": spec.algorithm.model_copy(update={"max_staleness": 0}).model_dump(mode="json")}


class RolloutReplica:
    """The parent's handle on one group's replica process: publish weights, sample, move the generator state.

    Not thread-safe by itself: the group calls it under its rollout lock.
    """

    def __init__(self, spec: GroupSpec, model: torch.nn.Module, version: int):
        self.group = spec.name
        self.layout = WeightLayout.of(model)
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, self.path = tempfile.mkstemp(prefix=f"unimas-replica-{re.sub(r'[^A-Za-z0-9_.-]', '_', spec.name)}-",
                                         dir=folder)
        os.ftruncate(fd, self.layout.size)
        os.close(fd)
        self._mapping, data, self._version = map_file(self.path, self.layout.size)
        self._views = views(data, self.layout)
        self.publish(model, version)
        init = {**child_spec(spec), "weights": self.path, "layout": self.layout.to_json()}
        threads = str(torch.get_num_threads())
        self._child = ChildPipe("unimas.groups.torch.replica_main",
                                {**os.environ, "OMP_NUM_THREADS": threads, "UNIMAS_TORCH_THREADS": threads},
                                lambda pid: f"the rollout process of model group '{spec.name}' (pid {pid}, "
                                            "options.rollout_process)", RolloutProcessError,
                                functools.partial(Path(self.path).unlink, missing_ok=True), stop_timeout=5)
        self._child.send(init)

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def process(self) -> subprocess.Popen:
        return self._child.process

    # ------------------------------------------------------------- weights

    def publish(self, model: torch.nn.Module, version: int) -> float:
        """Write ``model``'s parameters and ``version`` into the shared file; the seconds it took."""
        started = time.perf_counter()
        with torch.no_grad():
            for view, param in zip(self._views, model.parameters()):
                view.copy_(param.detach())
        self._version.fill_(version)
        return time.perf_counter() - started

    # ------------------------------------------------------------ requests

    def sample(self, prompts: Sequence[list[int]], gen: GenerationConfig, greedy: bool, adapter: Optional[str],
               stops: Sequence[Optional[Sequence[str]]], streamed: Sequence[int]
               ) -> tuple[list[list[int]], list[list[float]], int, dict[int, list[int]]]:
        """Sample a prompt-only batch in the child: (token rows, log-prob rows, the version it sampled with,
        row -> ids for the rows in ``streamed``, as :func:`sampling.sample_tokens` would have streamed them)."""
        reply = self._call({"op": "sample", "prompts": [list(p) for p in prompts],
                            "generation": gen.model_dump(mode="json"), "greedy": greedy, "adapter": adapter,
                            "stops": [list(s) if s else None for s in stops], "streamed": list(streamed)})
        return (reply["tokens"], reply["logprobs"], int(reply["version"]),
                {int(row): ids for row, ids in reply["streamed"].items()})

    def weight_digests(self) -> list[str]:
        """:func:`digests` of the weights the child samples with (compare with the trainer's own)."""
        return list(self._call({"op": "digests"})["digests"])

    def generator_state(self) -> torch.Tensor:
        return decode_state(self._call({"op": "get_generator"})["state"])

    def set_generator_state(self, state: torch.Tensor) -> None:
        self._call({"op": "set_generator", "state": encode_state(state)})

    def save_generator(self, directory: Path) -> None:
        """Write the child's sampling generator into a group checkpoint (:data:`RNG_FILE`)."""
        torch.save({"generator": self.generator_state()}, directory / RNG_FILE)

    def load_generator(self, directory: Path, fallback: torch.Tensor) -> None:
        """Continue the child's sampling stream from a checkpoint's :data:`RNG_FILE`; from ``fallback`` (the
        group's own stream) when the checkpoint was written without a replica."""
        state = fallback
        if (directory / RNG_FILE).exists():
            with reading(directory / RNG_FILE):
                state = RngState.model_validate(load_tensors(directory / RNG_FILE)).generator
        self.set_generator_state(state)

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        self._child.await_ready()
        self._child.send(message)
        reply = self._child.receive(f"answering '{message['op']}'")
        if "error" in reply:
            raise RolloutProcessError(f"the rollout process of model group '{self.group}' failed in {message['op']}: "
                                      f"{reply['error']}")
        return reply

    def close(self) -> None:
        """Stop the child (its request pipe closes: it exits; killed if it has not within 5 s)."""
        self._child.close()


def watch_parent(parent: int) -> None:
    """In the child: exit at once when ``parent`` is gone (reparented), even in the middle of a batch."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, name="unimas-replica-watchdog", daemon=True).start()
