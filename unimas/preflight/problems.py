"""What a config check is and returns, and the look-ups several checks share.

A check is a small function ``check(config, registry)`` that yields
:data:`Problem` pairs: the config path that holds the problem and how to fix
it. ``unimas validate`` runs an ordered tuple of them
(:data:`unimas.preflight.validate.CONFIG_CHECKS`), so a new rule is one more
function in that tuple, not one more branch in a long one.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from unimas.config import plugin_params
from unimas.config.schema import ExperimentConfig, ModelGroupConfig
from unimas.contract.registry import Registry
from unimas.errors import UserError
from unimas.runtime.build import backend_options

Problem = tuple[str, str]
"""``(where, message)``: the config path that holds the problem, and what is wrong there and how to fix it."""

Check = Callable[[ExperimentConfig, Registry], Iterable[Problem]]
"""A check of the whole config: every problem it finds, in the config's order."""

EntryCheck = Callable[[ExperimentConfig, Registry, str], Iterable[Problem]]
"""A check of one named entry (``models.<name>``, ``roles.<name>``), run on each entry in turn."""


def registered_backend(registry: Registry, group: ModelGroupConfig) -> Any | None:
    """The group's backend class, or None when its name is unknown (reported by the model-group checks)."""
    return registry.get("backends", group.backend) if registry.has("backends", group.backend) else None


def group_options(config: ExperimentConfig, registry: Registry, name: str) -> Any | None:
    """``models.<name>.options`` as its backend validated them; None for an unknown group or backend, or options
    that are wrong (each reported by the model-group checks)."""
    group = config.models.get(name)
    if group is None or registered_backend(registry, group) is None:
        return None
    try:
        return backend_options(config, registry, name)
    except UserError:
        return None


def params_problems(obj: Any, name: str, params: dict[str, Any], where: str,
                    keyword_only: bool = False, inputs: int = 0) -> list[Problem]:
    """The config's params checked against what ``obj`` declares (:mod:`unimas.config.plugin_params`)."""
    try:
        return plugin_params.params_spec(obj, name, keyword_only=keyword_only, inputs=inputs).check(params, where)[1]
    except UserError as exc:  # the plugin's annotations cannot be read
        return [(where, str(exc))]
