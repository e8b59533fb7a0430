"""Hook specifications: the whole plugin contract of unimas.

A plugin is any module or object with functions marked ``@unimas.hookimpl``
and named after the hooks below. unimas finds plugins three ways:

1. the built-ins (``unimas_plugins.*``, ``unimas_workflows``), registered
   through the ``unimas`` entry-point group exactly like third-party ones;
2. any installed distribution that declares an entry point in the ``unimas``
   group, e.g. in its ``pyproject.toml``::

       [project.entry-points.unimas]
       my_team = "my_team.plugin"

3. modules named in the experiment config under ``plugins: [my_module]``.

Hooks are registries, not events: each takes no arguments and returns a
``dict`` mapping a public name to an object whose shape is the Protocol in
:mod:`unimas.contract.protocols`. unimas collects every plugin's dict by kind
(:mod:`unimas.contract.registry`) and never calls a hook for a result, so
pluggy's call options (``firstresult``, ``hookwrapper``) have no use here.
Names are global per kind: two plugins that provide the same workflow name
is an error that names both providers. A function named ``unimas_*`` that
matches no hook below, or one that lacks ``@unimas.hookimpl``, is an error
too. See ``docs/plugins.md`` for runnable examples of every hook.

Stability (``docs/plugins.md``, "What is stable", says the same): the eight
hooks of :data:`STABLE_HOOKS` and their protocols are stable. The four
algorithm hooks of :data:`EXPERIMENTAL_HOOKS` (rollout controls, replay
buffers, update orders, credit shapers; ``docs/algorithms.md``) are typed by
their protocols and written against :mod:`unimas.methods`, but are newer and
may still change. ``EstimatorFn`` and ``PolicyLossFn`` are verl's own
signatures (a loss's ``config`` is a verl ``ActorConfig``), so those two
follow the verl version unimas pins.
"""

from __future__ import annotations

from typing import Callable

import pluggy

from unimas.contract.protocols import (Backend, CreditShaper, DatasetFactory, EstimatorFn, ParserFactory, PolicyLossFn,
                                       ReplayBuffer, Reward, RolloutControl, Tool, UpdateOrder, Workflow)

hookspec = pluggy.HookspecMarker("unimas")

STABLE_HOOKS = ("unimas_workflows", "unimas_rewards", "unimas_tools", "unimas_datasets", "unimas_parsers",
                "unimas_estimators", "unimas_policy_losses", "unimas_backends")
"""Hooks whose names, signatures and protocols change only with a major version."""
EXPERIMENTAL_HOOKS = ("unimas_rollout_controls", "unimas_replay_buffers", "unimas_update_orders",
                      "unimas_credit_shapers")
"""The algorithm hooks: typed and documented, but newer; they may still change."""


@hookspec
def unimas_workflows() -> dict[str, Workflow]:
    """Return workflows by name.

    A workflow is an ``async def workflow(ctx, task) -> dict | None``. It calls
    ``await ctx.act(role, **template_vars)`` for every model turn and
    ``await ctx.tool(name, **arguments)`` for every tool call, with ordinary
    Python control flow in between (loops, branches, ``asyncio.gather``).
    Whatever it returns is stored as the trajectory's ``outcome``, which
    reward plugins read.

    Example::

        async def echo_twice(ctx, task):
            first = await ctx.act("writer", question=task["question"])
            final = await ctx.act("editor", draft=first)   # edge writer -> editor
            return {"answer": final.text}

        @unimas.hookimpl
        def unimas_workflows():
            return {"echo_twice": echo_twice}
    """


@hookspec
def unimas_rewards() -> dict[str, Reward]:
    """Return reward functions by name.

    A reward is ``reward(trajectory, task, **params)`` where ``params`` comes
    from the config entry. What it returns depends on the ``level`` the config
    asks for:

    * ``trajectory``: a float for the whole episode;
    * ``role``: ``{role_name: float}``;
    * ``turn``: ``{node_id: float}`` for individual turn nodes.

    Example::

        def exact_answer(trajectory, task, field="answer"):
            return float(trajectory.outcome.get(field) == task["answer"])

        @unimas.hookimpl
        def unimas_rewards():
            return {"exact_answer": exact_answer}
    """


@hookspec
def unimas_tools() -> dict[str, Tool]:
    """Return tools by name.

    A tool is a plain or ``async`` callable taking keyword arguments and
    returning JSON-serialisable data. Workflows call it with
    ``await ctx.tool(name, **kwargs)``; graph workflows with a ``tool`` node.
    A tool that raises is recorded on its node as an error; the episode
    decides what to do with it.

    Example::

        def add(a: int, b: int) -> int:
            return a + b

        @unimas.hookimpl
        def unimas_tools():
            return {"add": add}
    """


@hookspec
def unimas_datasets() -> dict[str, DatasetFactory]:
    """Return dataset factories by name.

    A factory is ``factory(split, seed, **params) -> list[dict]``; ``split`` is
    ``"train"`` or ``"eval"``. Each dict is one task; its keys are available to
    role templates and rewards. A task may carry ``"id"``; unimas assigns one
    otherwise.

    Example::

        def letters(split, seed, n=8):
            return [{"id": f"{split}-{i}", "target": "abcdefgh"[i]} for i in range(n)]

        @unimas.hookimpl
        def unimas_datasets():
            return {"letters": letters}
    """


@hookspec
def unimas_parsers() -> dict[str, ParserFactory]:
    """Return output parsers by name.

    A parser factory takes the ``params`` of a role's ``parser:`` entry, checks
    them (raise ``ValueError`` for bad ones: ``unimas validate`` reports it
    under ``roles.<role>.parser``) and returns ``parse(text) -> answer``.
    ``parse`` raises :class:`unimas.ParseError` with a reason when the text
    holds no answer: the turn records it as ``parse_error`` and the episode
    goes on. Built-ins: ``regex``, ``tagged``, ``boxed``, ``json``, ``code``,
    ``first_line``, ``last_number``.

    Example::

        def after(marker="=>"):
            def parse(text):
                if marker not in text:
                    raise unimas.ParseError(f"no {marker!r} in the output")
                return text.rsplit(marker, 1)[1].strip()
            return parse

        @unimas.hookimpl
        def unimas_parsers():
            return {"after": after}
    """


@hookspec
def unimas_estimators() -> dict[str, EstimatorFn]:
    """Return advantage estimators by name, beside verl's registry.

    An estimator has verl's signature::

        estimator(token_level_rewards, response_mask, index, config) -> (advantages, returns)

    with ``token_level_rewards`` and ``response_mask`` of shape ``(turns, 1)``
    (one credit scalar per turn) and ``index`` an array of group keys. unimas
    looks a name up here first and in verl's ``core_algos`` registry second,
    so ``grpo``, ``rloo``, ``reinforce_plus_plus`` and friends need no plugin.
    Validation reads its facts off the signature: a parameter ``index`` means
    it normalises within groups (``group_size`` must be >= 2); ``values`` means
    it needs a critic, and any other required parameter unimas does not
    provide makes it unusable — both are rejected by ``unimas validate``.
    Keyword-only arguments (after ``*``) are the estimator's own parameters,
    set with ``algorithm.estimator_params`` and checked against their type
    annotations (:mod:`unimas.config.plugin_params`).

    Example::

        def mean_baseline(token_level_rewards, response_mask, index, config):
            scores = token_level_rewards.sum(-1)
            adv = scores - scores.mean()
            return adv[:, None] * response_mask, adv[:, None] * response_mask

        @unimas.hookimpl
        def unimas_estimators():
            return {"mean_baseline": mean_baseline}
    """


@hookspec
def unimas_policy_losses() -> dict[str, PolicyLossFn]:
    """Return policy losses by name, beside verl's registry.

    A policy loss has verl's signature::

        loss_fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config) -> (loss, metrics)

    on ``(turns, tokens)`` tensors; ``config`` is a verl ``ActorConfig`` with
    the clip ratios. ``algorithm.loss`` (or ``models.<group>.algorithm.loss``)
    names it; unimas adds the entropy bonus and the KL term around it (see
    :func:`unimas.algorithms.losses.compose_loss`), in every backend. Keyword-only
    arguments (after ``*``) are the loss's own parameters, set with
    ``algorithm.loss_params`` and checked against their type annotations.

    Example::

        def plain_pg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
            per_token = -advantages * log_prob
            loss = (per_token * response_mask).sum() / response_mask.sum()
            return loss, {}

        @unimas.hookimpl
        def unimas_policy_losses():
            return {"plain_pg": plain_pg}
    """


@hookspec
def unimas_backends() -> dict[str, Backend]:
    """Return model-group backends by name.

    A backend is a class (usually a :class:`unimas.ModelGroup` subclass) with
    an ``options`` pydantic model, which validates ``models.<group>.options``,
    and a ``build(spec)`` classmethod that returns the model group for a
    :class:`unimas.GroupSpec` (name, group config, validated options, LoRA
    adapters, seed, the group's algorithm settings and policy loss). The group
    owns its weights, generates for every role mapped to it and updates them.

    Example::

        class EchoOptions(pydantic.BaseModel):
            suffix: str = "!"

        class EchoGroup(unimas.ModelGroup):
            options = EchoOptions

            @classmethod
            def build(cls, spec):
                ...

        @unimas.hookimpl
        def unimas_backends():
            return {"echo": EchoGroup}
    """


# -- algorithm hooks: each returns {name: factory}; ``factory(**params)`` makes the object for one run ----------
#
# ``params`` (``algorithm.<key>.params``) are checked before anything runs against a pydantic model made
# from the factory's annotated signature, or against the model in its ``params`` attribute; untyped
# parameters (and the extra names of a factory with ``**kwargs``) pass through unchecked
# (:mod:`unimas.config.plugin_params`, docs/algorithms.md "Typed parameters").


@hookspec
def unimas_rollout_controls() -> dict[str, Callable[..., RolloutControl]]:
    """Return rollout controls by name (``algorithm.rollout``).

    ``factory(**params)`` returns a :class:`~unimas.contract.protocols.RolloutControl`:
    ``async def rollout(session, specs) -> list[GraphTrajectory]`` turns a
    step's episode specs into trajectories through the
    :class:`~unimas.contract.protocols.RolloutSession` it is handed, and may
    fork recorded episodes at a turn (``await session.fork([(parent, k,
    siblings)])``), score them early (``session.score``) and spend more or
    fewer samples per task. A control that forks declares the capability
    flag ``uses_forks = True`` on its factory, so ``unimas validate`` refuses
    it for a ``workflow.agent`` program, whose episodes cannot be forked.

    Example::

        from unimas.methods import EpisodeSpec, RolloutSession

        class BranchFirstTurn:
            uses_forks = True

            async def rollout(self, session: RolloutSession, specs: list[EpisodeSpec]):
                roots = await session.run(specs[::2])
                return roots + await session.fork([(root, 1, 1) for root in roots])

        @unimas.hookimpl
        def unimas_rollout_controls():
            return {"branch_first_turn": BranchFirstTurn}
    """


@hookspec
def unimas_replay_buffers() -> dict[str, Callable[..., ReplayBuffer]]:
    """Return replay buffers by name (``algorithm.replay``).

    ``factory(**params)`` returns a :class:`~unimas.contract.protocols.ReplayBuffer`:
    ``observe(trajectories, step)``, ``revisit(specs, step) -> specs`` and
    ``mix(fresh, session) -> list[GraphTrajectory]``, optionally ``state()``
    and ``load_state(state)`` to survive a resume; mixed-in episodes are made
    with ``unimas.methods.replayed_copy``, which records each turn's staleness.

    Example::

        from unimas.methods import replayed_copy

        class LastStep:
            def __init__(self):
                self.kept = []

            def observe(self, trajectories, step):
                self.kept = [(t, step) for t in trajectories if not t.failed]

            def revisit(self, specs, step):
                return specs

            def mix(self, fresh, session):
                return [replayed_copy(t, born, session.step, f"{t.episode_id}/r") for t, born in self.kept[:2]]

        @unimas.hookimpl
        def unimas_replay_buffers():
            return {"last_step": LastStep}
    """


@hookspec
def unimas_update_orders() -> dict[str, Callable[..., UpdateOrder]]:
    """Return update orders by name (``algorithm.update_order``).

    ``factory(**params)`` returns an :class:`~unimas.contract.protocols.UpdateOrder`:
    ``stages(execution) -> list[list[role]]`` (``execution``: roles in the
    order they first acted) and ``adjust(role, turns, done) -> turns``, called
    before each stage with the statistics of the roles already updated. Its
    capability flags: ``needs_ratios`` (``adjust`` also gets each episode's
    product of probability ratios of the stages before) and
    ``rescales_advantages`` (``adjust`` changes advantages, which a critic's
    per-token GAE would not see; ``unimas validate`` refuses that pair).

    Example::

        class FirstActorLast:
            def stages(self, execution):
                return [[role] for role in reversed(execution)]

            def adjust(self, role, turns, done):
                return turns

        @unimas.hookimpl
        def unimas_update_orders():
            return {"first_actor_last": FirstActorLast}
    """


@hookspec
def unimas_credit_shapers() -> dict[str, Callable[..., CreditShaper]]:
    """Return credit shapers by name (``algorithm.credit``).

    ``factory(**params)`` returns a :class:`~unimas.contract.protocols.CreditShaper`,
    ``shape(turns) -> list[float]``: given a step's trainable
    ``unimas.methods.CreditedTurn`` list (turn, its trajectory, its group
    ``key``), it returns the per-turn signal the
    estimator receives instead of the summed reward, and may rewrite each
    turn's ``key`` to change what is normalised together. Methods that
    compute whole advantages pair with ``algorithm.estimator: passthrough``.

    Example::

        def by_history(**params):
            def shape(turns):
                for c in turns:
                    c.key = f"{c.trajectory.task_id}|{c.turn.role}|{len(c.turn.prompt_ids)}"
                return [c.turn.reward for c in turns]
            return shape

        @unimas.hookimpl
        def unimas_credit_shapers():
            return {"by_history": by_history}
    """
