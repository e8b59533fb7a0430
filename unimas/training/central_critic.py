"""The centralized critic (``algorithm.critic: centralized``): one value model that reads the whole episode so far.

MAPPO-style: instead of one critic per model group that sees only a role's own
prompt, a single model group (``algorithm.central_critic``, a torch or verl group with
a ``critic`` section and no roles) values every role's turns, each read after
everything the episode said before it. The roles' advantages are still GAE over
each (episode, role)'s trainable turns (``unimas.groups.role_gae``); only the
values come from the central critic. The policy groups train on those per-token
advantages with their unchanged loss.

**What the critic reads** for a turn (:func:`render_context`): for each earlier
turn of the episode, in execution order (the trajectory's node order), of any
role, trainable or not, one line ::

    <role name>: <its text>\\n

then the turn's own prompt ids and response ids, exactly as the policy saw and
sampled them. It values each response token given all of that (the value of the
state before the token, as a per-group critic does). Tool calls are not
rendered: what a tool returned reaches the critic through the later turns'
prompts. The context is tokenised by the critic group; its oldest tokens are cut
when the whole does not fit the model.

**Tokenizers.** Because the critic reads the policy's own token ids (one value per
sampled token, with no re-tokenising that could split a token differently),
the central critic group must have the same tokenizer as every group whose
roles train: ``unimas validate`` compares their vocabularies (token texts in id
order) and refuses a difference, naming ``models.<critic>.options``.

**Where it runs** (:func:`value_turns`, called by the trainer before any policy
group updates): the trainer hands every trainable turn of the step (of all
groups), each with its rendered context, to the critic group in one call
(``ModelGroup.critique``), which computes values, runs GAE, trains the critic on
the returns and answers per-token advantages; the trainer puts them on each
turn (``TrainTurn.token_advantages``) and then updates the policy groups as
usual. During ``algorithm.critic_warmup`` the policy groups' updates are empty.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from unimas.contract.protocols import Backend, capability
from unimas.runtime.build import backend_options

if TYPE_CHECKING:  # `unimas validate` imports this module: no transport (model groups, torch) or credit here
    from unimas.algorithms.credit import CreditedTurn
    from unimas.config.schema import ExperimentConfig
    from unimas.contract.registry import Registry
    from unimas.groups.base import TrainTurn
    from unimas.groups.base import Transport
    from unimas.trajectory import GraphTrajectory, TurnNode

CONTEXT_LINE = "{role}: {text}\n"
"""One earlier turn as the centralized critic reads it (docs/critic.md)."""


def render_context(trajectory: GraphTrajectory, turn: TurnNode) -> str:
    """Every turn of ``trajectory`` before ``turn``, in execution order, one :data:`CONTEXT_LINE` each."""
    lines = []
    for earlier in trajectory.turns():
        if earlier is turn:
            return "".join(lines)
        lines.append(CONTEXT_LINE.format(role=earlier.role, text=earlier.text))
    raise ValueError(f"turn {turn.id} is not a turn of episode {trajectory.episode_id}")


async def value_turns(transport: Transport, config: ExperimentConfig, credited: Sequence[CreditedTurn],
                      turns: Sequence[TrainTurn]) -> tuple[list[TrainTurn], dict[str, float], bool]:
    """``turns`` (``turns[i]`` is ``credited[i]``'s) with the central critic's per-token advantages, the critic's
    metrics as ``group/<critic>/critic/...``, and whether it is still warming up (then no policy trains)."""
    central = config.algorithm.central_critic
    asked = [dataclasses.replace(t, context=render_context(c.trajectory, c.turn)) for c, t in zip(credited, turns)]
    critique = await transport.critique(central, asked)
    valued = [dataclasses.replace(t, token_advantages=a) for t, a in zip(turns, critique.advantages, strict=True)]
    return valued, {f"group/{central}/{key}": value for key, value in critique.metrics.items()}, critique.warming_up


def config_problems(config: ExperimentConfig, registry: Registry, takes_values: bool) -> list[tuple[str, str]]:
    """``algorithm.critic`` and ``algorithm.central_critic`` checked against the groups and the estimator."""
    algorithm = config.algorithm
    if algorithm.critic == "per_group":
        if algorithm.central_critic is not None:
            return [("algorithm.central_critic", "is read only with algorithm.critic: centralized; set that, or "
                     "remove central_critic")]
        return []
    if not takes_values:
        return [("algorithm.critic", f"algorithm.estimator '{algorithm.estimator}' takes no values, so a "
                 "centralized critic would train for nothing; use estimator: gae, or critic: per_group")]
    central = algorithm.central_critic
    if central is None or central not in config.models:
        said = "is not set" if central is None else f"names '{central}', which is not declared under 'models'"
        return [("algorithm.central_critic", f"{said}: with critic: centralized name the model group that values "
                 f"every role's turns (declared: {', '.join(config.models)}; docs/critic.md)")]
    policy = _policy_group_problems(config, central)
    if policy:
        return policy
    problems: list[tuple[str, str]] = []
    group = config.models[central]
    if not group.trainable:
        problems.append((f"models.{central}.trainable", "the centralized critic trains its value model every step; "
                         "a frozen group (trainable: false) cannot"))
    backend = registry.get("backends", group.backend) if registry.has("backends", group.backend) else None
    if backend is not None and not capability(backend, Backend, "supports_critic"):
        problems.append((f"models.{central}.backend", f"backend '{group.backend}' has no critic; the centralized "
                         "critic needs a group of a backend with critics (torch, verl)"))
    if group.critic is None:
        problems.append((f"models.{central}.critic", "the centralized critic group needs a critic section (its "
                         "value model's settings, e.g. critic: {optim: {lr: 0.001}})"))
    for name, other in config.models.items():
        if name != central and other.critic is not None:
            problems.append((f"models.{name}.critic", f"with critic: centralized, '{central}' values this group's "
                             "turns; remove this per-group critic"))
    problems.extend(_tokenizer_problems(config, registry, central))
    return problems


def _policy_group_problems(config: ExperimentConfig, central: str) -> list[tuple[str, str]]:
    """``algorithm.central_critic`` naming a group that roles act with: both fields are named, the critic's first
    (the other checks would only list what a policy group lacks as a critic, and hide the cause)."""
    players = sorted(name for name, role in config.roles.items() if role.model == central)
    if not players:
        return []
    others = sorted(name for name in config.models if name != central and not any(
        role.model == name for role in config.roles.values()))
    hint = f" (groups without roles: {', '.join(others)})" if others else ""
    critic = ("algorithm.central_critic", f"names '{central}', the model group of role{'s' if len(players) > 1 else ''}"
              f" {', '.join(players)}: the centralized critic is a group of its own that only values turns, with a "
              f"critic section and no roles; name such a group{hint}, or move the roles (docs/critic.md)")
    return [critic] + [(f"roles.{name}.model", f"'{central}' is the centralized critic group: it only values turns; "
                        "put the role on another group") for name in players]


def _tokenizer_problems(config: ExperimentConfig, registry: Registry, central: str) -> list[tuple[str, str]]:
    """The critic reads the policies' token ids: every training group's vocabulary must be the critic's."""
    mine = _vocabulary(config, registry, central)
    if mine is None:
        return []
    groups = sorted({role.model for role in config.roles.values() if role.trainable and role.model in config.models})
    problems = []
    for name in groups:
        theirs = _vocabulary(config, registry, name)
        if theirs is not None and theirs != mine:
            problems.append((f"models.{central}.options", f"the centralized critic's tokenizer differs from that of "
                             f"model group '{name}' ({len(mine)} vs {len(theirs)} tokens"
                             f"{_first_difference(mine, theirs)}): it reads that group's token ids, so it needs the "
                             "same tokenizer (the same tiny alphabet, or a model with the same vocabulary)"))
    return problems


def _vocabulary(config: ExperimentConfig, registry: Registry, name: str) -> list[Any] | None:
    """The group's token texts in id order, as its backend reads them from the tokenizer (None: it cannot say)."""
    group = config.models[name]
    if not registry.has("backends", group.backend):
        return None
    vocabulary = getattr(registry.get("backends", group.backend), "vocabulary", None)
    if not callable(vocabulary):
        return None
    try:
        return vocabulary(backend_options(config, registry, name))
    except Exception:  # noqa: BLE001 - options or tokenizer problems are reported by the group's own checks
        return None


def _first_difference(mine: list[Any], theirs: list[Any]) -> str:
    index = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
    return "" if index is None else f"; first difference at token {index}: {mine[index]!r} vs {theirs[index]!r}"
