"""Names a facade module (``unimas``, ``unimas.methods``) imports on first use (PEP 562), so that importing the facade
stays cheap: a plugin imports it at its top, and ``unimas plugins`` imports every plugin."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_names(facade: str, defined_in: dict[str, str],
               namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``facade``: a name in ``defined_in`` (name -> the module that defines it)
    is imported when first read and kept in the facade's ``namespace``, so later reads never come back here."""

    def __getattr__(name: str) -> Any:
        module = defined_in.get(name)
        if module is None:
            raise AttributeError(f"module '{facade}' has no attribute '{name}'")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(defined_in))

    return __getattr__, __dir__
