"""The one way unimas reads a file someone else may have written: tensors, safetensors and JSON, never pickles.

Checkpoints, snapshots, adapters, replay and pipeline state all arrive from
outside the process (a colleague's run, a download, a file planted next to
one). Python's pickle runs code while it loads, so nothing here unpickles:

* :func:`load_tensors` — ``torch.load(weights_only=True)``: tensors, plain
  containers and numbers only; anything else is refused.
* :func:`load_safetensors` — a safetensors file (a header and raw bytes).
* :func:`load_json` — a JSON document checked against a pydantic model
  (types, ranges), so a file of the wrong shape fails here, named, instead
  of as a ``KeyError`` somewhere in training.

Both tensor loaders also refuse a floating-point tensor holding NaN or ±inf
(:func:`refuse_non_finite`): a run never saves one (a non-finite update is
skipped before the optimiser step), so such a value is damage or an edit, and
loaded it would train every later step on NaN (a value head, an optimiser
moment, an adapter).

Every failure — missing, truncated, garbage, a pickle payload, a wrong
schema, a non-finite tensor — is a :class:`~unimas.errors.UserError` naming the file. Callers that
fall back to an earlier checkpoint catch that type.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import stat
from pathlib import Path
from typing import IO, Any, Iterator, TypeVar

from pydantic import BaseModel, ValidationError

from unimas.errors import UserError

Schema = TypeVar("Schema", bound=BaseModel)

REFUSED_PICKLE = ("refused: holds pickled objects, not plain tensors (unimas loads checkpoints with "
                  "torch.load(weights_only=True) or safetensors and never unpickles code)")


class NotARegularFile(OSError):
    """A path given as a data file is a pipe, a socket or a device: reading it could block or never end."""


def open_regular(path: str | Path) -> IO[bytes]:
    """``open(path, "rb")`` for a regular file (after symlinks) only, else :class:`NotARegularFile`.

    A FIFO blocks its reader until some writer comes and ``/dev/zero`` never ends, so either one named as a
    data file, or planted in a run directory, would hang whoever reads it. Opened without blocking and
    checked on the open descriptor, so the file checked is the file read.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise NotARegularFile(errno.EINVAL, "not a regular file (a pipe or a device could be read without end)",
                              str(path))
    return os.fdopen(descriptor, "rb")


def read_bytes(path: str | Path) -> bytes:
    """The bytes of a data file someone named (a task file, a corpus, a program to sandbox), through
    :func:`open_regular`."""
    with open_regular(path) as handle:
        return handle.read()


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Any failure while loading ``path`` becomes a :class:`UserError` naming the file."""
    try:
        yield
    except UserError:
        raise
    except pickle.UnpicklingError:
        raise UserError(REFUSED_PICKLE, where=str(path)) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise UserError(f"does not match the expected contents: {field}: {first['msg']}", where=str(path)) from None
    except Exception as exc:  # noqa: BLE001 - whatever the damage, the message names the file
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"cannot load this file: {type(exc).__name__}: {detail}", where=str(path)) from None


def _must_exist(path: Path) -> None:
    if not path.is_file():
        raise UserError("missing (a checkpoint file that should be here)", where=str(path))


def load_tensors(path: Path, device: Any = "cpu") -> Any:
    """Tensors and plain containers saved by ``torch.save``; a pickle of anything else is refused."""
    import torch

    path = Path(path)
    _must_exist(path)
    with reading(path):
        loaded = torch.load(path, map_location=device, weights_only=True)
    refuse_non_finite(loaded, path)
    return loaded


def load_safetensors(path: Path, device: str = "cpu") -> dict[str, Any]:
    """A safetensors file's tensors by name."""
    from safetensors.torch import load_file

    path = Path(path)
    _must_exist(path)
    with reading(path):
        loaded = load_file(path, device=device)
    refuse_non_finite(loaded, path)
    return loaded


def refuse_non_finite(value: Any, path: Path, name: str = "") -> None:
    """A :class:`UserError` naming ``path`` and the tensor if any floating-point tensor in ``value`` (tensors in
    nested dicts, lists and tuples, as ``torch.load`` returns an optimiser state) holds NaN or ±inf."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            if not bool(torch.isfinite(value).all()):
                raise UserError(f"tensor '{name or '(the file)'}' holds NaN or infinite values; a run never saves "
                                "them, so the file is damaged or was edited", where=str(path))
        return
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        refuse_non_finite(item, path, f"{name}.{key}" if name else str(key))


def load_json(path: Path, schema: type[Schema]) -> Schema:
    """A JSON document validated by ``schema``."""
    path = Path(path)
    _must_exist(path)
    with reading(path):
        return schema.model_validate(json.loads(path.read_text(encoding="utf-8")))


def parse_json_line(text: str, schema: type[Schema], path: Path, line: int) -> Schema:
    """One line of a JSONL state file validated by ``schema``; the error names the file and line."""
    with reading(Path(f"{path}:{line}")):
        return schema.model_validate(json.loads(text))
