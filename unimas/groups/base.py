"""The model-group contract: what every backend implements and the records that cross the star.

A model group owns one set of weights (plus, optionally, one LoRA adapter per
role). The controller sends it thin records — prompt text in; token ids,
text and per-token log-probs out; turns with scalar advantages back in — and
never sees logits or activations. Keeping this contract small is what lets
one controller drive an in-process torch model, a Ray actor, verl workers on
GPUs, or an API endpoint.

A backend is a class with a pydantic ``options`` model (its settings under
``models.<group>.options``, validated by the backend itself) and a ``build``
classmethod; see :class:`unimas.contract.protocols.Backend`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from pydantic import BaseModel, ConfigDict

from unimas.config.schema import AlgorithmConfig, GenerationConfig, ModelGroupConfig


@dataclass
class Continuation:
    """The role's previous turn in the same conversation: the messages it rendered and the ids it saw and sampled.

    A group extends these ids instead of re-rendering the conversation, so
    sampled text is never tokenised again (token-exact multi-turn traces).
    """

    messages: list[dict[str, str]]
    prompt_ids: list[int]
    response_ids: list[int]
    finished: bool
    tools: Optional[list[dict[str, Any]]] = None
    """The function definitions the previous turn was rendered with: the ids extend only under the same list."""


@dataclass
class GenRequest:
    """One role turn to generate."""

    prompt: str
    """The turn as one plain text (system + every message's content): for models without a chat template."""
    generation: GenerationConfig
    adapter: Optional[str] = None
    greedy: bool = False
    messages: Optional[list[dict[str, str]]] = None
    """The turn as chat messages (system, the conversation so far, the new input last); None = ``prompt`` only."""
    continuation: Optional[Continuation] = None
    use_chat_template: bool = True
    """False: render ``messages`` as plain text even when the tokenizer has a chat template."""
    allow_truncation: bool = True
    """False: a prompt longer than the context is not cut: the result comes back empty with ``truncated``."""
    tools: Optional[list[dict[str, Any]]] = None
    """Function definitions handed to the chat template with ``messages`` (the gateway's ``tools``)."""
    stop: Optional[list[str]] = None
    """Stop strings: sampling of this request ends at the token whose decoded text completes one (kept in
    ``response_ids``; the result's ``text`` ends before the stop string)."""
    response_prefix: str = ""
    """Text forced at the start of the answer (the gateway's ``tool_choice``): its ids are appended to the
    prompt ids — context the answer is sampled after, never trained as sampled."""
    token_texts: bool = False
    """Also return each response token's text (the gateway's ``logprobs``)."""
    progress: Optional[Callable[[str], None]] = None
    """Called with the answer's text so far while it is sampled (a streamed gateway request): first with ``""``
    once the prompt is rendered, then whenever the shown text grows. Only text that can no longer change is
    shown: complete characters, never a possible start of a stop string, and nothing from a stop string on.
    A backend that cannot stream never calls it. It lives in this process only: dropped when the request is
    pickled or copied (a Ray actor answers in one piece)."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "progress": None}


@dataclass
class GenResult:
    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    """Response tokens up to and including the first EOS (if any)."""
    logprobs: list[float]
    """Log-probs of ``response_ids`` under the sampling distribution."""
    finished: bool
    """True when EOS was produced within ``max_new_tokens``."""
    logprobs_exact: bool = False
    """True when ``logprobs`` are the distribution the group trains (no top-k / top-p renormalisation):
    the group says so, because only it knows how it sampled."""
    prompt_text: str = ""
    """The prompt as the model saw it (chat template markers included); empty when it is ``GenRequest.prompt``."""
    continued: bool = False
    """The prompt ids extend the continuation's prompt + response ids exactly."""
    truncated: bool = False
    """The prompt was cut to fit the model's context (``roles.<role>.truncation: left``)."""
    stop: Optional[str] = None
    """The stop string of the request that ended sampling (None: EOS, the token limit, or no stop strings)."""
    forced_ids: list[int] = field(default_factory=list)
    """The ids of the request's ``response_prefix``: the last ids of ``prompt_ids``."""
    token_texts: list[str] = field(default_factory=list)
    """Each response token as text, when the request asked for them."""
    controls: list[str] = field(default_factory=list)
    """The request controls the backend applied (``stop``, ``response_prefix``): a caller that asked for one
    the backend does not list refuses the result rather than pass it off as honoured."""
    rerendered: str = ""
    """Why the prompt was rendered afresh although a continuation was offered (empty: continued, or none)."""
    weight_version: Optional[int] = None
    """How many updates the group had made when it sampled this (its weight version); None: the backend does
    not count. The trainer bounds and reports staleness with it (``algorithm.max_staleness``)."""
    error: Optional[str] = None
    """Why this request could not be served although its group is fine (its messages made the chat template
    or the tokenizer fail): nothing was sampled, and the other requests of the batch went on. The caller
    fails this request's turn with the message (:class:`~unimas.controller.context.RequestRefused`)."""


@dataclass
class TrainTurn:
    """One trainable turn handed back to the group that produced it.

    ``rollout_logprobs`` are what the group reported at sampling time; when
    ``rollout_logprobs_exact`` is false the group recomputes them with its
    current weights before the first update epoch.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    advantage: float
    rollout_logprobs_exact: bool = False
    temperature: float = 1.0
    adapter: Optional[str] = None
    weight_version: Optional[int] = None
    """The group's weight version that sampled the turn; older than the group's own (asynchronous pipeline):
    the update recomputes the old log-probs with its current weights and reweights each token by the truncated
    ratio current/behaviour (``algorithm.importance_cap``). None: treated as sampled by the current weights."""
    episode: str = ""
    """The episode the turn belongs to: a sequential update order relates a role's turns to the turns of the
    same episode that earlier stages already trained (their probability ratios)."""
    role: str = ""
    """The role that acted: a group with a critic chains the turns of one (episode, role), in list order, into
    one GAE sequence (docs/critic.md)."""
    reward: float = 0.0
    """The turn's credit scalar: what a group with a critic puts on the turn's last token for GAE."""
    token_advantages: Optional[list[float]] = None
    """One advantage per response token (a critic's GAE, set inside the group, or the centralized critic's,
    set by the trainer); None: ``advantage`` on every token."""
    context: str = ""
    """For the centralized critic only: the episode before this turn, rendered as text (``unimas.training.central_critic``);
    the critic reads its tokens before ``prompt_ids``."""


@dataclass
class Critique:
    """What the centralized critic group answers for a step's turns (``ModelGroup.critique``)."""

    advantages: list[list[float]]
    """Per turn, in the order given: one GAE advantage per response token."""
    metrics: dict[str, float]
    """The critic's statistics (``critic/value_loss``, ...), as a per-group critic reports them."""
    warming_up: bool
    """Within ``algorithm.critic_warmup``: the policies should not train on these advantages yet."""


class NoOptions(BaseModel):
    """For backends without settings of their own: any key under ``options`` is an error."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class GroupSpec:
    """Everything a backend needs to build one model group, resolved from the config."""

    name: str
    config: ModelGroupConfig
    options: Any
    """``config.options`` validated by the backend's ``options`` model."""
    adapters: list[str]
    """LoRA adapter names the roles on this group use."""
    seed: int
    """Already specific to the group."""
    algorithm: AlgorithmConfig
    """The global algorithm with this group's overrides applied."""
    policy_loss: Any = None
    """The resolved policy-loss function (plugin or verl) for ``algorithm.loss``."""
    estimator: Any = None
    """The resolved estimator (:class:`unimas.algorithms.estimators.Estimator`) when the group has a critic: it computes
    token-level advantages from the critic's values inside the group."""
    total_updates: int = 0
    """Updates the run will make (``trainer.steps``): the horizon of learning-rate schedules."""
    role_objectives: dict[str, Any] = field(default_factory=dict)
    """Roles on this group with their own loss terms (:class:`unimas.algorithms.losses.RoleObjective` by
    role name, ``roles.<role>.entropy_coef`` / ``loss_weight``); empty: one objective for all its turns."""


UPDATE_METRICS = ("policy_loss", "entropy", "kl", "clip_frac", "ppo_kl", "grad_norm", "nonfinite_skipped",
                  "rollout_logprob_diff", "lr", "tokens", "update_time_s", "stale_turns", "importance_weight")
"""What every trainable group's ``update`` reports (docs/metrics.md); an update without turns reports them as 0."""


class ModelGroup(ABC):
    """Weights for one or more roles: generate, update, checkpoint."""

    name: str
    trainable: bool
    waits_on_workers: bool = False
    """True when the group's calls mostly wait on other processes (e.g. Ray ranks): the in-process transport
    then runs them on a thread of the group's own, so other groups' calls and the controller go on meanwhile."""

    @abstractmethod
    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Generate for a batch of requests, possibly for several adapters; results in request order."""

    @abstractmethod
    def update(self, turns: list[TrainTurn]) -> dict[str, float]:
        """One PPO/GRPO update on this group's turns (settings from its spec); returns metrics."""

    def critique(self, turns: list[TrainTurn]) -> Critique:
        """As the centralized critic: value every turn (its ``context`` first), GAE, one critic update."""
        raise NotImplementedError(f"model group '{self.name}' ({type(self).__name__}) has no centralized critic")

    def score(self, turns: list[TrainTurn]) -> list[float]:
        """Each turn's response log-probability (summed over its tokens, at its temperature) under the current
        weights: how far an update moved the policy on those turns. Backends that cannot score say so."""
        raise NotImplementedError(f"model group '{self.name}' ({type(self).__name__}) cannot score turns")

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write weights (safetensors / PEFT adapter dirs) and optimiser + RNG state."""

    @abstractmethod
    def load(self, directory: Path) -> None:
        """Restore exactly what :meth:`save` wrote."""

    def save_weights(self, directory: Path) -> None:
        """Write the policy's weights only, as a plain Hugging Face model: ``directory/model/`` (weights,
        config, tokenizer) and ``directory/adapters/<name>/`` (PEFT dirs) for LoRA adapters.

        What a frozen snapshot group plays (:mod:`unimas.training.snapshots`) and ``options.init_from``
        starts from. One format for every backend, so a verl learner's snapshots are played by a torch
        group: no optimiser, RNG or counts, which belong to a resume (:meth:`save`). A backend with no
        weights of its own (an API endpoint) cannot, and says so.
        """
        raise NotImplementedError(f"model group '{self.name}' ({type(self).__name__}) cannot save its weights")

    def load_weights(self, directory: Path) -> None:
        """Play the weights a :meth:`save_weights` wrote (of this group or another one of the same model),
        copied in place: the group's own random stream, weight version and optimiser stay as they are."""
        raise NotImplementedError(f"model group '{self.name}' ({type(self).__name__}) cannot load weights")

    def close(self) -> None:
        """Stop what the group started beyond this object (Ray actors, servers); called once when it is dropped.

        Garbage collection is too late for them: a second run in the same
        process would find their names and placement groups still taken.
        """


class Transport(Protocol):
    """How the hub reaches the spokes: every call on a model group, in process or remote (:mod:`unimas.runtime`)."""

    async def generate(self, group: str, requests: list[GenRequest]) -> list[GenResult]:
        """Results in request order; one result per request."""

    async def update(self, group: str, turns: list[TrainTurn]) -> dict[str, float]:
        """One update of ``group`` on its turns; the group's metrics."""

    async def critique(self, group: str, turns: list[TrainTurn]) -> Critique:
        """The centralized critic group's per-token advantages for every role's turns, and one critic update."""

    async def score(self, group: str, turns: list[TrainTurn]) -> list[float]:
        """Each turn's response log-probability under the group's current weights (sequential update orders)."""

    async def save(self, group: str, directory: Path) -> None: ...

    async def load(self, group: str, directory: Path) -> None: ...

    async def save_weights(self, group: str, directory: Path) -> None:
        """:meth:`ModelGroup.save_weights`: the weights only, a plain Hugging Face model (snapshots)."""

    async def load_weights(self, group: str, directory: Path) -> None:
        """:meth:`ModelGroup.load_weights`: play weights another group saved, in place."""

    async def restart(self, group: str, checkpoint: Path | None) -> None:
        """Replace the group by a fresh one from ``checkpoint`` (initial weights when None)."""

    def shutdown(self) -> None:
        """Stop every group (and a Ray instance this transport started). Idempotent."""
