"""The typed shapes of what plugins provide; the hookspecs are annotated with them.

Every hook returns ``{name: object}``; these Protocols say what each object
must look like. They are structural: a plain function of the right shape
satisfies them, nothing needs to inherit from them.

A protocol may also declare *capability flags*: class attributes with a
default (``RolloutControl.uses_forks = False``) that a plugin sets when it
does something the rest of a run must know about before it starts. unimas
reads them only through :func:`capability`, which refuses a flag the protocol
does not declare, so the flags a plugin can set are exactly the ones listed
here, with their defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np
    import torch
    from pydantic import BaseModel

    from unimas.algorithms.credit import CreditedTurn
    from unimas.controller.context import EpisodeContext
    from unimas.controller.specs import EpisodeSpec
    from unimas.groups.base import GroupSpec, ModelGroup, TrainTurn
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
    group. Optional class methods: ``vocabulary(options)`` listing token
    strings for the stand-in model of ``unimas validate --episodes``, and
    ``has_chat_template(options)``, which ``unimas validate`` reports per role.

    The capability flags say up front what the backend's groups can do, so
    that ``unimas validate`` refuses a config needing what they cannot, naming
    the field, instead of the run failing once the feature is first used
    (after episodes were sampled). The defaults are what the torch and verl
    backends do, except ``supports_critic``'s (off unless declared).
    """

    options: ClassVar[type["BaseModel"]]
    can_train: ClassVar[bool] = True
    """Capability flag: False for a backend that only generates (``unimas validate`` keeps trainable groups off it)."""
    supports_critic: ClassVar[bool] = False
    """Capability flag: True for a backend that trains a value model: a group's ``models.<group>.critic``, and
    ``ModelGroup.critique`` as the group of ``algorithm.central_critic``. Off unless declared (unlike the other
    flags): a group that ignored its critic section would train an estimator that takes values (gae) on none."""
    can_score_turns: ClassVar[bool] = True
    """Capability flag: False for a backend whose groups cannot ``score`` turns (their log-probability under the
    current weights), which an ``algorithm.update_order`` with ``needs_ratios`` asks of every group it trains."""
    can_host_adapters: ClassVar[bool] = True
    """Capability flag: False for a backend that cannot host LoRA adapters (``models.<group>.lora``,
    ``roles.<role>.adapter``)."""
    can_save_weights: ClassVar[bool] = True
    """Capability flag: False for a backend that cannot save its weights alone and load them back (an API endpoint
    holds them): a snapshot pool (``models.<group>.snapshot``) copies the weights of ``snapshot.of`` that way."""

    @classmethod
    def build(cls, spec: "GroupSpec") -> "ModelGroup": ...


# -- the algorithm hooks: ``factory(**params)`` returns one of these per run (docs/algorithms.md) ---------------


class RolloutSession(Protocol):
    """A rollout control's (and a replay buffer's) handle on one training step: run, fork and score episodes."""

    step: int
    """The 0-based training step being collected."""
    group_size: int
    """``algorithm.group_size``: episodes per task a plain step would run."""

    async def run(self, specs: list["EpisodeSpec"]) -> list["GraphTrajectory"]:
        """Run ``specs`` concurrently, one trajectory each, in the order given."""

    async def fork(self, forks: Sequence[tuple["GraphTrajectory", int, int]]) -> list["GraphTrajectory"]:
        """Run ``(parent, k, siblings)`` forks: each sibling replays ``parent``'s first ``k`` turns, then goes on."""

    def score(self, trajectories: Sequence["GraphTrajectory"]) -> None:
        """Allocate rewards now (``turn.reward``) to decide on them; credit later re-scores them identically."""


class RolloutControl(Protocol):
    """``await control.rollout(session, specs)``: the step's trajectories (forks included) for ``specs``."""

    uses_forks: ClassVar[bool] = False
    """Capability flag, read on the factory (the class): True for a control that calls ``session.fork``.
    ``unimas validate`` refuses it for a ``workflow.agent`` program, whose episodes cannot be forked."""

    async def rollout(self, session: RolloutSession, specs: list["EpisodeSpec"]) -> list["GraphTrajectory"]: ...


class ReplayBuffer(Protocol):
    """Keeps credited episodes and mixes copies of them into later steps (``algorithm.replay``).

    Two optional methods make a buffer survive ``--resume``: ``state()`` returns its contents as JSON data,
    saved with each checkpoint, and ``load_state(state)`` restores them; a buffer without them starts
    empty after a resume.
    """

    uses_forks: ClassVar[bool] = False
    """Capability flag, read on the factory: True for a buffer whose ``mix`` calls ``session.fork``."""

    def observe(self, trajectories: list["GraphTrajectory"], step: int) -> None:
        """Step ``step``'s credited episodes (the fresh ones): keep what is worth replaying."""

    def revisit(self, specs: list["EpisodeSpec"], step: int) -> list["EpisodeSpec"]:
        """The step's episode specs, possibly with stored tasks swapped in (return ``specs`` to keep them)."""

    def mix(self, fresh: list["GraphTrajectory"], session: RolloutSession) -> list["GraphTrajectory"]:
        """Copies of stored episodes, made with ``unimas.methods.replayed_copy``, to train on with ``fresh``."""


class UpdateOrder(Protocol):
    """Stages of roles updated one after another (``algorithm.update_order``), each stage's turns adjustable."""

    needs_ratios: ClassVar[bool] = False
    """Capability flag, read on the built object (a property may derive it from the params): True to be passed
    ``ratios=`` in :meth:`adjust`, episode -> product of the ratios new/behaviour of the turns earlier stages
    trained in that episode (1.0 where they trained none). Costs one scoring pass per group per stage."""
    rescales_advantages: ClassVar[bool] = False
    """Capability flag, read on the built object: True for an order whose :meth:`adjust` changes ``advantage``.
    A group with a critic replaces that scalar by per-token GAE advantages inside its update, so
    ``unimas validate`` refuses such an order with an estimator that takes values (docs/critic.md)."""

    def stages(self, execution: list[str]) -> list[list[str]]:
        """Roles in stages, given the roles in the order they first acted this step; each role exactly once."""

    def adjust(self, role: str, turns: list["TrainTurn"],
               done: Mapping[str, Mapping[str, float]]) -> list["TrainTurn"]:
        """``role``'s turns before its stage; ``done`` holds each already-updated role's group statistics.

        An order with ``needs_ratios`` takes one more keyword argument, ``ratios`` (see that flag).
        """


class CreditShaper(Protocol):
    """``shape(turns) -> signals``: one credit scalar per trainable turn of a step (``algorithm.credit``).

    The signal replaces the turn's summed reward as what the estimator receives; the shaper may also rewrite
    each turn's ``key`` to change which turns are normalised together.
    """

    def __call__(self, turns: list["CreditedTurn"], /) -> list[float]: ...


def capability(obj: Any, protocol: type, flag: str) -> bool:
    """The capability ``flag`` that ``protocol`` declares, as ``obj`` sets it, else the protocol's default.

    One place reads every flag, and only declared ones: asking for a flag the protocol does not declare is a
    programming error (``AttributeError``), not a silent False.
    """
    if not declares(protocol, flag):
        raise AttributeError(f"{protocol.__name__} declares no capability flag {flag!r}")
    return bool(getattr(obj, flag, getattr(protocol, flag)))


def declares(protocol: type, flag: str) -> bool:
    """Whether ``protocol`` declares the capability ``flag`` (so :func:`capability` may read it)."""
    return flag in getattr(protocol, "__annotations__", {}) and hasattr(protocol, flag)


def stand_in_vocabulary(backend: Any, options: Any) -> Sequence[str] | None:
    """The backend's token strings for a stand-in model, or None when it cannot list them cheaply."""
    vocabulary = getattr(backend, "vocabulary", None)
    return vocabulary(options) if callable(vocabulary) else None
