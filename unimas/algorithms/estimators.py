"""Advantage estimators by name: plugins first, then verl's ``core_algos`` registry.

An estimator is ``(token_level_rewards, response_mask, index, config) ->
(advantages, returns)``, so ``grpo`` means here what it means in a verl run and
a plugin can add (or shadow) any name. The facts validation needs (normalises
within groups, needs a critic, needs inputs unimas does not produce) are read
off each function's signature once, into an :class:`Estimator` record, so they
cannot drift from the pinned verl. Beside verl's inputs an estimator may take
keyword-only parameters (after ``*``), set with ``algorithm.estimator_params``
and checked like every algorithm plugin's (:mod:`unimas.config.plugin_params`);
they are bound once, when the name is resolved.

verl's names come from :mod:`unimas.algorithms.verl_catalog` (cached, no
``import verl``); verl itself is imported inside functions, because it costs
seconds and commands that never train (``unimas validate``) should not pay for
it. torch is imported only for type hints, for the same reason.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from unimas.algorithms import verl_catalog
from unimas.config import plugin_params
from unimas.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    import torch


class PluginTable(Protocol):
    """The plugins' estimators and losses by name: :class:`unimas.contract.registry.Registry` is one.

    Named by shape rather than imported, so this layer (below the model
    groups) does not depend on the plugin contract (above them).
    """

    def names(self, kind: str) -> list[str]: ...

    def get(self, kind: str, name: str, *, where: str | None = None) -> Any: ...

    def provider(self, kind: str, name: str) -> str: ...

PROVIDED_INPUTS = frozenset({"token_level_rewards", "response_mask", "index", "norm_adv_by_std_in_grpo", "config"})
"""What unimas can hand an estimator: one credit scalar per turn, group keys, verl's AlgoConfig."""


CRITIC_INPUTS = frozenset({"values", "gamma", "lam"})
"""What a model group with a critic adds: token-level values, ``algorithm.gamma`` and ``algorithm.lam``."""


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator with the facts validation needs, derived from its signature."""

    name: str
    fn: Callable[..., Any]
    provider: str
    group_normalised: bool
    """Takes ``index``: normalises within groups of turns, so it needs ``group_size >= 2``."""
    needs_critic: bool
    """Takes value estimates (``gae``): unimas trains no critic."""
    missing_inputs: tuple[str, ...]
    """Required arguments unimas does not produce (e.g. ``reward_baselines`` for ``remax``)."""

    @classmethod
    def from_function(cls, name: str, fn: Callable[..., Any], provider: str) -> "Estimator":
        params = inspect.signature(fn).parameters
        # keyword-only arguments are the estimator's own parameters (estimator_params), not inputs
        required = [key for key, p in params.items()
                    if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        return cls(name=name, fn=fn, provider=provider, group_normalised="index" in params,
                   needs_critic="values" in params,
                   missing_inputs=tuple(key for key in required if key not in PROVIDED_INPUTS))

    @property
    def usable(self) -> bool:
        return not self.needs_critic and not self.missing_inputs

    @property
    def usable_with_critic(self) -> bool:
        """Takes values, and everything else it needs a group with a critic provides (docs/critic.md)."""
        return self.needs_critic and set(self.missing_inputs) <= CRITIC_INPUTS

    def with_values(self, token_level_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                    gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns), (rows, tokens), of an estimator that takes values: the critic path."""
        params = inspect.signature(self.fn).parameters
        available = {"token_level_rewards": token_level_rewards, "values": values, "response_mask": response_mask,
                     "gamma": gamma, "lam": lam, "config": _algo_config(float(gamma), True)}
        return self.fn(**{key: value for key, value in available.items() if key in params})

    def __call__(self, scores: torch.Tensor, index: np.ndarray, *, norm_by_std: bool = True,
                 gamma: float = 1.0) -> torch.Tensor:
        """Advantages for ``scores`` (turns, 1): one credit scalar per turn, grouped by ``index``."""
        params = inspect.signature(self.fn).parameters
        available = {"token_level_rewards": scores, "response_mask": scores.new_ones(scores.shape), "index": index,
                     "norm_adv_by_std_in_grpo": norm_by_std, "config": _algo_config(float(gamma), bool(norm_by_std))}
        advantages, _returns = self.fn(**{key: value for key, value in available.items() if key in params})
        return advantages


@functools.lru_cache(maxsize=16)
def _algo_config(gamma: float, norm_by_std: bool):
    from verl.trainer.config import AlgoConfig

    return AlgoConfig(gamma=gamma, norm_adv_by_std_in_grpo=norm_by_std)


def estimators(registry: "PluginTable") -> dict[str, Estimator]:
    """Every estimator by name: plugins first (they may shadow a verl name), then verl's registry."""
    table = {name: Estimator.from_function(name, fn, "verl")
             for name, fn in verl_catalog.functions("estimators").items()}
    for name in registry.names("estimators"):
        table[name] = Estimator.from_function(name, registry.get("estimators", name),
                                              registry.provider("estimators", name))
    return table


def resolve_estimator(name: str, registry: "PluginTable", params: dict[str, Any] | None = None) -> Estimator:
    """The estimator ``name`` with its checked ``algorithm.estimator_params`` bound."""
    table = estimators(registry)
    if name not in table:
        raise UserError(f"unknown estimator '{name}'. Known: {', '.join(sorted(table))}", where="algorithm.estimator")
    estimator = table[name]
    kwargs = plugin_params.bind(estimator.fn, name, params or {}, "algorithm.estimator_params", keyword_only=True)
    return dataclasses.replace(estimator, fn=functools.partial(estimator.fn, **kwargs)) if kwargs else estimator
