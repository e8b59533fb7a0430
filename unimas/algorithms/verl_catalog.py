"""verl's estimator and policy-loss registries by name and signature, without importing verl.

``import verl`` costs seconds (tensordict, ``torch._dynamo``, Ray), yet checking
a config needs only the facts a signature gives: which names exist and which
inputs each function takes (an estimator that takes ``values`` needs a critic;
one that takes ``index`` normalises within groups). So the first use after verl
is installed or upgraded imports verl once and writes those facts to
``<cache>/verl-algorithms-<key>.json`` (``$UNIMAS_CACHE_DIR``, else
``$XDG_CACHE_HOME/unimas``, else ``~/.cache/unimas``); later processes read the
file instead. ``<key>`` hashes the environment: the interpreter's path and
version, verl's version and its ``core_algos.py`` (path, size, mtime). One
file per environment, because a user with two environments (a CPU venv and a
GPU one) runs both against one cache directory: with a single file each
environment rewrote it for the other, and every ``unimas validate`` imported
verl and torch again (20 s instead of half a second). The file is read through :mod:`unimas.safe_load` against
:class:`Catalog`; one that does not validate, or was written for another
install, is rebuilt. Each entry is a :class:`VerlFunction`: it has the verl
function's signature and imports verl on its first call, so an estimator or
loss resolved from the catalog trains exactly as verl's own function.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import logging
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from unimas.errors import UserError
from unimas.safe_load import load_json

log = logging.getLogger(__name__)

REGISTRIES = {"estimators": "ADV_ESTIMATOR_REGISTRY", "policy_losses": "POLICY_LOSS_REGISTRY"}
"""Catalog section -> the ``verl.trainer.ppo.core_algos`` registry it describes."""

Kind = Literal["POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD"]


class ParameterRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    kind: Kind
    has_default: bool


class Catalog(BaseModel):
    """The cache file: the install it describes, and each registry's functions by name."""

    model_config = ConfigDict(extra="forbid")
    install: str
    estimators: dict[str, list[ParameterRecord]]
    policy_losses: dict[str, list[ParameterRecord]]


class _VerlDefault:
    """Stands for a verl parameter's default value, which the catalog does not record (only that it exists)."""

    def __repr__(self) -> str:
        return "<verl default>"


VERL_DEFAULT = _VerlDefault()


class VerlFunction:
    """One verl registry entry: its signature now, the function itself (importing verl) on first call."""

    __annotations__: dict[str, Any] = {}

    def __init__(self, registry: str, name: str, parameters: list[ParameterRecord]):
        self.registry, self.name = registry, name
        self.__name__ = self.__qualname__ = name
        self.__module__ = "verl.trainer.ppo.core_algos"
        self.__signature__ = inspect.Signature([
            inspect.Parameter(p.name, getattr(inspect.Parameter, p.kind),
                              default=VERL_DEFAULT if p.has_default else inspect.Parameter.empty)
            for p in parameters])
        self._function: Any = None

    def resolve(self) -> Any:
        if self._function is None:
            from verl.trainer.ppo import core_algos

            self._function = getattr(core_algos, REGISTRIES[self.registry])[self.name]
        return self._function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<verl {self.registry[:-1].replace('_', ' ')} {self.name!r}>"


def functions(section: str) -> dict[str, VerlFunction]:
    """``section`` ("estimators" or "policy_losses") of the catalog, in verl's registry order."""
    catalog = _catalog()
    return {name: VerlFunction(section, name, parameters) for name, parameters in getattr(catalog, section).items()}


_loaded: Catalog | None = None


def _catalog() -> Catalog:
    global _loaded
    if _loaded is None:
        install = _install_key()
        path = cache_path(install)
        _loaded = _read(path, install)
        if _loaded is None:
            _loaded = _describe(install)
            _write(path, _loaded)
    return _loaded


def cache_dir() -> Path:
    if os.environ.get("UNIMAS_CACHE_DIR"):
        return Path(os.environ["UNIMAS_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "unimas"


def cache_path(install: str) -> Path:
    """This environment's cache file: its name hashes ``install`` (:func:`_install_key`)."""
    return cache_dir() / f"verl-algorithms-{hashlib.sha256(install.encode()).hexdigest()[:16]}.json"


def _install_key() -> str:
    """The interpreter (path, version), verl's version and its core_algos.py file, found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("verl is not installed; unimas needs it for its estimators and policy losses "
                        "(pip install verl==0.9.1)")
    source = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "ppo" / "core_algos.py"
    stat = source.stat()
    return (f"python {sys.executable} {platform.python_version()}; "
            f"verl {metadata.version('verl')} {source} {stat.st_size} {stat.st_mtime_ns}")


def _read(path: Path, install: str) -> Catalog | None:
    if not path.is_file():
        return None
    try:
        catalog = load_json(path, Catalog)
    except UserError as exc:
        log.debug("ignoring the verl catalog cache: %s", exc)
        return None
    return catalog if catalog.install == install else None


def _describe(install: str) -> Catalog:
    from verl.trainer.ppo import core_algos

    def records(fn: Any) -> list[ParameterRecord]:
        return [ParameterRecord(name=p.name, kind=p.kind.name, has_default=p.default is not p.empty)
                for p in inspect.signature(fn).parameters.values()]

    sections = {section: {name: records(fn) for name, fn in getattr(core_algos, registry).items()}
                for section, registry in REGISTRIES.items()}
    return Catalog(install=install, **sections)


def _write(path: Path, catalog: Catalog) -> None:
    """Best effort: a read-only home only means the next process imports verl again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(catalog.model_dump(), indent=1))
        partial.replace(path)
    except OSError as exc:
        log.debug("cannot cache the verl catalog at %s: %s", path, exc)
