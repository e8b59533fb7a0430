"""The extension unimas's vLLM servers give vLLM's workers: weights arrive as a safetensors file.

verl's own extension (``vLLMColocateWorkerExtension``) receives weights over a
ZMQ socket whose messages are pickled (``recv_pyobj``: CUDA IPC handles or
shared-memory names), and vLLM's direct path for live tensors needs
``VLLM_ALLOW_INSECURE_SERIALIZATION``. unimas unpickles nothing that crosses a
process boundary, so the trainer rank writes the weights it exports to a
safetensors file in a private directory and the worker reads that file into
the engine with vLLM's in-place ``reload_weights`` (:meth:`load_weights_file`).
Everything else (the logit mask verl installs at start-up, its LoRA and
quantisation hooks) is verl's extension, inherited.

vLLM imports this module by name in its worker processes, so the
distribution alias of :mod:`.vllm_cpu` is installed before verl's vLLM modules
load.
"""

from __future__ import annotations

from unimas.groups.verl import vllm_cpu

vllm_cpu.alias_vllm_distribution()

from safetensors import safe_open  # noqa: E402
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension  # noqa: E402

EXTENSION = f"{__name__}.WeightFileExtension"
"""The ``worker_extension_cls`` a unimas vLLM server passes to vLLM."""


class WeightFileExtension(vLLMColocateWorkerExtension):
    """verl's worker extension plus a weight load from a safetensors file (no pickle, no insecure mode)."""

    def load_weights_file(self, path: str) -> None:
        """Load every tensor of the safetensors file at ``path`` into the engine in place.

        The tensors carry Hugging Face names (verl's ``get_per_tensor_param``),
        which the model's ``load_weights`` maps onto vLLM's fused layers.
        """
        with safe_open(path, framework="pt", device="cpu") as weights:
            names = list(weights.keys())
            self.reload_weights(weights_iterator=((name, weights.get_tensor(name)) for name in names))
