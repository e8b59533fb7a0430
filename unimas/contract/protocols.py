"""The typed shapes of what plugins provide; the hookspecs are annotated with them.

Every hook returns ``{name: object}``; these Protocols say what each object
must look like. They are structural: a plain function of the right shape
satisfies them, nothing needs to inherit from them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np
    import torch
    from pydantic import BaseModel

    from unimas.controller.context import EpisodeContext
    from unimas.groups.base import GroupSpec, ModelGroup
    from unimas.trajectory import GraphTrajectory


class Workflow(Protocol):
    """``async def workflow(ctx, task, **params)``: drives one episode; its return value is the outcome."""

    def __call__(self, ctx: "EpisodeContext", task: dict[str, Any], /) -> Awaitable[Mapping[str, Any] | None]: ...


class Reward(Protocol):
    """Scores one episode: a number (level ``trajectory``), ``{role: number}`` or ``{node_id: number}``."""

    def __call__(self, trajectory: "GraphTrajectory", task: dict[str, Any], /,
                 **params: Any) -> float | Mapping[str, float]: ...


class Tool(Protocol):
    """A plain or ``async`` callable with keyword arguments returning JSON-serialisable data."""

    def __call__(self, **arguments: Any) -> Any: ...


class DatasetFactory(Protocol):
    """``factory(split, seed, **params)``: the tasks of ``split`` (``train`` or ``eval``), one dict each."""

    def __call__(self, split: str, seed: int, **params: Any) -> list[dict[str, Any]]: ...


class ParserFactory(Protocol):
    """``factory(**params)`` checks its parameters and returns ``parse(text) -> answer``.

    ``parse`` raises :class:`unimas.ParseError` with the reason when the text holds no answer.
    """

    def __call__(self, **params: Any) -> Callable[[str], Any]: ...


class EstimatorFn(Protocol):
    """verl's advantage-estimator signature; declare only the keywords you use (``index``, ``config`` ...)."""

    def __call__(self, token_level_rewards: "torch.Tensor", response_mask: "torch.Tensor",
                 index: "np.ndarray", config: Any = None, **kwargs: Any) -> tuple["torch.Tensor", "torch.Tensor"]: ...


class PolicyLossFn(Protocol):
    """verl's policy-loss signature: (turns, tokens) tensors in, a scalar loss and its metrics out."""

    def __call__(self, old_log_prob: "torch.Tensor", log_prob: "torch.Tensor", advantages: "torch.Tensor",
                 response_mask: "torch.Tensor", loss_agg_mode: str = "token-mean",
                 config: Any = None) -> tuple["torch.Tensor", dict[str, Any]]: ...


class Backend(Protocol):
    """What ``unimas_backends`` returns per name: the :class:`unimas.ModelGroup` subclass itself, or a light
    class whose ``build`` imports it (the torch backend's ``TorchBackend``, so that checking a config
    imports no modelling code).

    ``options`` validates ``models.<group>.options``; ``build`` makes the
    group. Optional class attributes: ``can_train = False`` for backends that
    only generate (validation keeps trainable groups off them), and
    ``vocabulary(options)`` listing token strings for the stand-in model of
    ``unimas validate --episodes``; ``has_chat_template(options)``, which
    ``unimas validate`` reports per role.
    """

    options: ClassVar[type["BaseModel"]]

    @classmethod
    def build(cls, spec: "GroupSpec") -> "ModelGroup": ...


def stand_in_vocabulary(backend: Any, options: Any) -> Sequence[str] | None:
    """The backend's token strings for a stand-in model, or None when it cannot list them cheaply."""
    vocabulary = getattr(backend, "vocabulary", None)
    return vocabulary(options) if callable(vocabulary) else None
