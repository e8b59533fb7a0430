"""Plugin discovery and the name registries built from it.

One :class:`Registry` per process collects every hook's ``{name: object}``
dicts and remembers which distribution provided each name, so a clash can
name both providers and ``unimas plugins`` can say where things come from.

Mistakes in plugins are caught here, before anything runs: a function named
like a hook but misspelt or not marked ``@unimas.hookimpl``, and a hook that
returns something other than a dict. An installed plugin that fails to import
does not break commands that never need it: it is reported as a warning, and
named again if a name it might have provided is asked for.

Discovery imports every plugin module, so it must stay cheap: a value whose
module is expensive (a backend class pulls in torch and transformers) can be
registered as a :class:`Deferred`, imported by :meth:`Registry.get` on first use.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import sys
import types
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import pluggy

from unimas.contract import hookspecs
from unimas.errors import UserError, describe

KINDS = ("workflows", "rewards", "tools", "datasets", "parsers", "estimators", "policy_losses", "backends",
         "rollout_controls", "replay_buffers", "update_orders", "credit_shapers")
HOOK_NAMES = tuple(f"unimas_{kind}" for kind in KINDS)


def singular(kind: str) -> str:
    """``policy_losses`` -> ``policy loss``, ``rollout_controls`` -> ``rollout control``: a kind named in a message."""
    return kind.removesuffix("es" if kind.endswith("sses") else "s").replace("_", " ")


@dataclass(frozen=True)
class Deferred:
    """A registered object named by where it lives, ``Deferred("my_pkg.backend", "MyGroup")``; imported on use."""

    module: str
    attribute: str

    def load(self) -> Any:
        return getattr(importlib.import_module(self.module), self.attribute)


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    obj: Any
    provider: str


@dataclass
class Registry:
    entries: dict[str, dict[str, Entry]] = field(default_factory=lambda: {k: {} for k in KINDS})
    broken: list[str] = field(default_factory=list)
    """One line per installed plugin that failed to import."""

    def get(self, kind: str, name: str, *, where: str | None = None) -> Any:
        try:
            entry = self.entries[kind][name]
        except KeyError:
            known = ", ".join(sorted(self.entries[kind])) or "none"
            raise UserError(f"unknown {singular(kind)} '{name}'. Registered {kind}: {known}. "
                            f"Install the plugin that provides it or list its module under 'plugins:'"
                            f"{self.broken_hint()}", where=where) from None
        if isinstance(entry.obj, Deferred):
            entry = replace(entry, obj=self._load(entry, where))
            self.entries[kind][name] = entry
        return entry.obj

    @staticmethod
    def _load(entry: Entry, where: str | None) -> Any:
        deferred = entry.obj
        try:
            return deferred.load()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported like a plugin that fails to import
            raise UserError(f"{singular(entry.kind)} '{entry.name}' of {entry.provider} cannot be imported from "
                            f"{deferred.module}.{deferred.attribute}: {describe(exc)}", where=where) from None

    def broken_hint(self) -> str:
        """Appended to every "unknown name" message: a plugin that failed to import may be the provider."""
        if not self.broken:
            return ""
        return ("; these installed plugins failed to import and may be the one that provides it: "
                + "; ".join(self.broken))

    def has(self, kind: str, name: str) -> bool:
        return name in self.entries[kind]

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])

    def provider(self, kind: str, name: str) -> str:
        return self.entries[kind][name].provider


def _check_hook_functions(plugin: Any, label: str) -> None:
    """Functions named ``unimas_*`` must be marked hookimpls of an existing hook."""
    for attr, value in vars(plugin).items() if isinstance(plugin, types.ModuleType) else []:
        if not attr.startswith("unimas_") or not inspect.isfunction(value):
            continue
        marked = hasattr(value, "unimas_impl")
        if attr not in HOOK_NAMES:
            close = difflib.get_close_matches(attr, HOOK_NAMES, n=1)
            suggestion = f"did you mean '{close[0]}'? " if close else ""
            raise UserError(f"function '{attr}' matches no unimas hook; {suggestion}Hooks: {', '.join(HOOK_NAMES)}",
                            where=_location(value, label))
        if not marked:
            raise UserError(f"hook function '{attr}' is not marked: put `@unimas.hookimpl` above it, or unimas "
                            "ignores it", where=_location(value, label))


def _location(function: Any, label: str) -> str:
    try:
        return f"{inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]}"
    except (TypeError, OSError):
        return f"plugin {label}"


def _register(pm: pluggy.PluginManager, plugin: Any, label: str, provider: str, providers: dict[int, str]) -> None:
    if pm.is_registered(plugin):
        return
    _check_hook_functions(plugin, label)
    pm.register(plugin, name=label)
    providers[id(plugin)] = provider


def _load_entry_points(pm: pluggy.PluginManager, providers: dict[int, str], broken: list[str]) -> None:
    """Register every ``unimas`` entry point; one that fails to import is recorded and warned about."""
    for entry_point in importlib.metadata.entry_points(group="unimas"):
        distribution = entry_point.dist.name if entry_point.dist else "unknown distribution"
        try:
            plugin = entry_point.load()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import failure of a plugin is reported the same way
            line = f"'{entry_point.name}' ({entry_point.value}) from {distribution}: {describe(exc)}"
            broken.append(line)
            print(f"warning: plugin {line}; commands that need it will fail", file=sys.stderr)
            continue
        _register(pm, plugin, f"{distribution}:{entry_point.name}", distribution, providers)


def _import_listed(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a module the config names must import: any failure is the user's
        raise UserError(f"cannot import plugin module '{module_name}': {describe(exc)}", where="plugins") from None


def build_registry(extra_modules: Iterable[str] = ()) -> Registry:
    """Discover plugins (entry points + ``extra_modules``) and index their names."""
    pm = pluggy.PluginManager("unimas")
    pm.add_hookspecs(hookspecs)
    providers: dict[int, str] = {}
    registry = Registry()
    _load_entry_points(pm, providers, registry.broken)
    for module_name in extra_modules:
        _register(pm, _import_listed(module_name), module_name, f"module {module_name}", providers)
    _check_pending(pm)
    for kind in KINDS:
        hook = getattr(pm.hook, f"unimas_{kind}")
        for impl in hook.get_hookimpls():
            provider = providers.get(id(impl.plugin), impl.plugin_name)
            provided = _call_hook(impl, kind, provider)
            for name, obj in provided.items():
                existing = registry.entries[kind].get(name)
                if existing is not None:
                    raise UserError(
                        f"{singular(kind)} '{name}' is provided twice: by {existing.provider} and by {provider}. "
                        "Uninstall one of them or rename the plugin's entry."
                    )
                registry.entries[kind][name] = Entry(name, kind, obj, provider)
    return registry


def _check_pending(pm: pluggy.PluginManager) -> None:
    """pluggy's ``check_pending`` (a marked function that names no hook), told with file:line and the closest hook.

    Only plugins that are not modules get here with such a function (modules are
    checked by :func:`_check_hook_functions` as they register); pluggy's own check
    stays as the fallback.
    """
    for attr in dir(pm.hook):
        caller = getattr(pm.hook, attr)
        if attr.startswith("_") or not isinstance(caller, pluggy.HookCaller) or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook:
                continue
            close = difflib.get_close_matches(attr, HOOK_NAMES, n=1, cutoff=0.5)
            suggestion = f"did you mean '{close[0]}'? " if close else ""
            raise UserError(f"'{attr}' of plugin {impl.plugin_name} is marked `@unimas.hookimpl` but matches no "
                            f"unimas hook; {suggestion}Hooks: {', '.join(HOOK_NAMES)}",
                            where=_location(impl.function, impl.plugin_name))
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise UserError(f"a hook implementation matches no unimas hook: {exc}. Hooks: {', '.join(HOOK_NAMES)}",
                        where=f"plugin {pm.get_name(exc.plugin)}") from None


def _call_hook(impl: pluggy.HookImpl, kind: str, provider: str) -> dict[str, Any]:
    where = _location(impl.function, provider)
    try:
        provided = impl.function()
    except Exception as exc:  # noqa: BLE001 - a hook that raises is the plugin's bug
        raise UserError(f"hook 'unimas_{kind}' of {provider} raised {describe(exc)}", where=where) from None
    if provided is None:
        return {}
    if not isinstance(provided, dict):
        raise UserError(f"hook 'unimas_{kind}' of {provider} returned a {type(provided).__name__}; it must return "
                        "a dict of name -> object, e.g. return {\"my_name\": my_function}", where=where)
    return provided
