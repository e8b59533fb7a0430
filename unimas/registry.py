"""Plugin discovery and the name registries built from it.

One :class:`Registry` per process collects every hook's ``{name: object}``
dicts and remembers which distribution provided each name, so a clash can
name both providers and ``unimas plugins`` can say where things come from.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import Any, Iterable

import pluggy

from unimas import hookspecs
from unimas.errors import UserError

KINDS = ("workflows", "rewards", "tools", "datasets", "estimators", "backends")


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    obj: Any
    provider: str


@dataclass
class Registry:
    entries: dict[str, dict[str, Entry]] = field(default_factory=lambda: {k: {} for k in KINDS})

    def get(self, kind: str, name: str, *, where: str | None = None) -> Any:
        try:
            return self.entries[kind][name].obj
        except KeyError:
            known = ", ".join(sorted(self.entries[kind])) or "none"
            raise UserError(
                f"unknown {kind[:-1]} '{name}'. Registered {kind}: {known}. "
                "Install the plugin that provides it or list its module under 'plugins:'.",
                where=where,
            ) from None

    def has(self, kind: str, name: str) -> bool:
        return name in self.entries[kind]

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])


def _load_entry_points(pm: pluggy.PluginManager, providers: dict[int, str]) -> None:
    """Register every ``unimas`` entry point; a plugin that fails to import is named in the error."""
    for entry_point in importlib.metadata.entry_points(group="unimas"):
        distribution = entry_point.dist.name if entry_point.dist else "unknown distribution"
        try:
            plugin = entry_point.load()
        except Exception as exc:  # noqa: BLE001 - any import failure of a plugin is reported the same way
            raise UserError(f"plugin '{entry_point.name}' ({entry_point.value}) from {distribution} failed to "
                            f"import: {type(exc).__name__}: {exc}", where="entry point group 'unimas'") from None
        if not pm.is_registered(plugin):
            pm.register(plugin, name=f"{distribution}:{entry_point.name}")
            providers[id(plugin)] = distribution


def build_registry(extra_modules: Iterable[str] = ()) -> Registry:
    """Discover plugins (entry points + ``extra_modules``) and index their names."""
    pm = pluggy.PluginManager("unimas")
    pm.add_hookspecs(hookspecs)
    providers: dict[int, str] = {}
    _load_entry_points(pm, providers)
    for module_name in extra_modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UserError(f"cannot import plugin module '{module_name}': {exc}", where="plugins") from None
        if not pm.is_registered(module):
            pm.register(module, name=module_name)
            providers[id(module)] = f"module {module_name}"
    registry = Registry()
    for kind in KINDS:
        hook = getattr(pm.hook, f"unimas_{kind}")
        for impl in hook.get_hookimpls():
            provider = providers.get(id(impl.plugin), impl.plugin_name)
            provided = impl.function() or {}
            for name, obj in provided.items():
                existing = registry.entries[kind].get(name)
                if existing is not None:
                    raise UserError(
                        f"{kind[:-1]} '{name}' is provided twice: by {existing.provider} and by {provider}. "
                        "Uninstall one of them or rename the plugin's entry."
                    )
                registry.entries[kind][name] = Entry(name, kind, obj, provider)
    return registry
