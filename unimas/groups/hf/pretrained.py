"""Loading a local Hugging Face model dir faithfully, or refusing it with the file named.

A model dir may come from anyone (a download, a colleague's run, a file planted beside one). Transformers
builds whatever ``config.json`` describes, can import code an ``auto_map`` names, fills weights the files
lack with random values and ignores ones it has no place for. :func:`pretrained_model` is the one loader of
such a dir for the torch backend (a group's ``path`` or ``init_from``, a checkpoint's weights, a critic's
backbone): it checks the config first (:func:`check_model_config`), never runs the dir's code and refuses
weights that are missing, extra or not finite.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from unimas.errors import UserError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_inner", "n_layer", "n_head",
               "n_positions")
"""``config.json`` entries that size the tensors transformers allocates (Llama/Qwen and GPT-2 names)."""
MAX_LAYERS = 10_000
"""More blocks than any released model has (a few hundred at most): each one is Python modules built one by one,
so ``num_hidden_layers: 1000000`` spends minutes and gigabytes before any weight is read."""
MAX_CONFIG_BYTES = 16 << 20
"""A model's ``config.json`` is kilobytes; a larger one is not read."""


def pretrained_model(model_dir: Path, dtype: "torch.dtype") -> "PreTrainedModel":
    """The causal LM saved in ``model_dir``, refused (a :class:`UserError` naming the file) unless it is faithful.

    ``config.json`` is checked before anything is built (:func:`check_model_config`); nothing runs code from
    the dir (``trust_remote_code=False``: no ``auto_map`` import, and no "run the custom code? [y/N]" prompt
    on stdin); only safetensors are read. Transformers fills a tensor the weights files lack with random values
    and ignores one the model has no place for, so either is refused here, as are NaN or infinite weights,
    which would only surface steps later as a sampling error.
    """
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    check_model_config(Path(model_dir) / "config.json", dtype)
    weights = Path(model_dir) / "model.safetensors"
    where = str(weights if weights.is_file() else model_dir)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype,
                                                           use_safetensors=True, trust_remote_code=False,
                                                           output_loading_info=True)
    except SafetensorError as exc:  # a header that lies about its length or its tensors' offsets
        raise UserError(f"not a readable safetensors file: {exc}", where=where) from None
    for problem, keys in (("lacks {} of the weights config.json describes (they would start random)",
                           info.get("missing_keys")),
                          ("holds {} weights the model of config.json has no place for", info.get("unexpected_keys"))):
        if keys:
            raise UserError(f"{problem.format(len(keys))}, e.g. {sorted(keys)[:3]}: weights of a different model, "
                            "or damaged files", where=where)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise UserError(f"weight '{name}' holds NaN or infinite values", where=where)
    return model


def check_model_config(path: Path, dtype: "torch.dtype") -> None:
    """Refuse a ``config.json`` whose model cannot be built here, before transformers allocates anything.

    Its sizes (:data:`SIZE_FIELDS`) must be whole numbers >= 0 (not floats, NaN or strings), at most
    :data:`MAX_LAYERS` blocks, and the parameters they describe, counted roughly (embeddings, output layer,
    attention and MLP per block) at ``dtype``'s size, must fit in this machine's physical memory: a hostile or
    mistyped size is then one clear error, not an out-of-memory kill or minutes of building.
    """
    from unimas.safe_load import read_bytes, reading

    with reading(path):
        size = os.stat(path).st_size
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"{size} bytes, more than a model config holds")
        config = json.loads(read_bytes(path))
        if not isinstance(config, dict):
            raise ValueError(f"holds a JSON {type(config).__name__}, not an object")
    sizes: dict[str, int] = {}
    for key in SIZE_FIELDS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"'{key}' is {value!r}: a model size must be a whole number >= 0", where=str(path))
        sizes[key] = value
    layers_key = "num_hidden_layers" if "num_hidden_layers" in sizes else "n_layer"
    layers = sizes.get(layers_key, 0)
    if layers > MAX_LAYERS:
        raise UserError(f"'{layers_key}' is {layers}: more than {MAX_LAYERS} blocks is not a model this loads "
                        "(refused before building it)", where=str(path))
    hidden = sizes.get("hidden_size", sizes.get("n_embd", 0))
    inner = sizes.get("intermediate_size", sizes.get("n_inner", 4 * hidden))
    parameters = (2 * sizes.get("vocab_size", 0) * hidden + sizes.get("n_positions", 0) * hidden
                  + layers * (4 * hidden * hidden + 3 * hidden * inner))
    needed, memory = parameters * dtype.itemsize, _physical_memory()
    if memory is not None and needed > memory:
        raise UserError(f"describes a model of about {parameters:.3g} parameters ({needed / 2**30:.3g} GiB as "
                        f"{dtype}), more than this machine's {memory / 2**30:.3g} GiB of memory: refused before "
                        "building it", where=str(path))


def _physical_memory() -> Optional[int]:
    """This machine's RAM in bytes; None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
