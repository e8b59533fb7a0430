"""Saved weight files checked before anything reads them: safetensors only, pickle formats refused.

A weights dir (a Hugging Face ``model/``, a PEFT adapter) that unimas wrote
holds safetensors only, whichever backend wrote it; a pickle-format file
among them was put there by something else, and loading it could run code.
Both backends, the snapshot pools and the checkpoint loaders check here.
"""

from __future__ import annotations

from pathlib import Path

from unimas.errors import UserError
from unimas.safe_load import reading

PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
"""Weight-file suffixes of pickle formats: a checkpoint's weights are safetensors, so one of these is planted."""


def refuse_pickled_weights(directory: Path) -> None:
    """A :class:`UserError` naming the first pickle-format file in a weights dir (``model/``, an adapter)."""
    for path in sorted(Path(directory).rglob("*")):
        if path.suffix in PICKLED_WEIGHTS and path.is_file():
            raise UserError("refused: a pickle-format weights file; unimas writes weights as safetensors and "
                            "never unpickles, so this file was put here by something else (delete it)",
                            where=str(path))


def check_weights(directory: Path) -> None:
    """Check saved weights without loading them: no pickle-format file, every safetensors header readable.

    What a resume checks in a snapshot it may play later, so a bad snapshot
    makes its checkpoint unusable instead of stopping the run when it is played.
    """
    from safetensors import safe_open

    refuse_pickled_weights(directory)
    for path in sorted(Path(directory).rglob("*.safetensors")):
        if not path.is_file():  # a FIFO would block the header read for ever
            raise UserError("not a regular file (a pipe or a device is no weights file)", where=str(path))
        with reading(path), safe_open(path, framework="pt") as handle:
            handle.keys()
