"""``unimas validate --episodes N``: a workflow's episodes end to end, with stand-in models.

Static checks cannot see what a workflow does at run time: which roles act,
which tools it calls, what the rewards return, where user code raises. A dry
run answers that in seconds, before any weights load: every model group is
replaced by a :class:`StandInGroup` that samples random tokens from the
group's vocabulary, and the episodes go through the real controller, router,
rewards and credit path.
"""

from __future__ import annotations

import asyncio
import random
import string
from collections import Counter
from dataclasses import dataclass, field

from unimas.controller.episodes import Controller

from unimas.algorithms.credit import CreditAssigner, reward_keys
from unimas.contract.protocols import stand_in_vocabulary
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.errors import UserError
from unimas.groups.base import GenRequest, GenResult, ModelGroup, TrainTurn
from unimas.runtime.build import backend_options, group_seed
from unimas.runtime.local import LocalTransport
from unimas.training.experiment import Experiment
from unimas.trajectory import GraphTrajectory

FALLBACK_VOCABULARY = list(string.ascii_letters + string.digits + string.punctuation + " ")


class StandInGroup(ModelGroup):
    """Random tokens from a vocabulary, no weights: exercises workflows, parsers and rewards, learns nothing."""

    trainable = False

    def __init__(self, name: str, vocabulary: list[str], seed: int):
        self.name = name
        self.vocabulary = vocabulary or FALLBACK_VOCABULARY
        self.rng = random.Random(seed)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        results = []
        for request in requests:
            ids = [self.rng.randrange(len(self.vocabulary))
                   for _ in range(self.rng.randint(1, request.generation.max_new_tokens))]
            results.append(GenResult(text="".join(self.vocabulary[i] for i in ids), prompt_ids=[],
                                     response_ids=ids, logprobs=[0.0] * len(ids), finished=True))
        return results

    def update(self, turns: list[TrainTurn]) -> dict[str, float]:
        raise RuntimeError("a stand-in model group does not train")

    def save(self, directory) -> None:
        raise RuntimeError("a stand-in model group has nothing to save")

    def load(self, directory) -> None:
        raise RuntimeError("a stand-in model group has nothing to load")


@dataclass
class DryRun:
    trajectories: list[GraphTrajectory]
    credited_turns: Counter = field(default_factory=Counter)

    @property
    def failures(self) -> list[GraphTrajectory]:
        return [t for t in self.trajectories if t.failed]


def dry_run(experiment: Experiment, episodes: int) -> DryRun:
    """Run ``episodes`` episodes (groups of ``algorithm.group_size`` per task) with stand-in models."""
    config, registry = experiment.config, experiment.registry
    groups = {}
    for name, group in config.models.items():
        backend = registry.get("backends", group.backend, where=f"models.{name}.backend")
        vocabulary = stand_in_vocabulary(backend, backend_options(config, registry, name))
        groups[name] = StandInGroup(name, list(vocabulary or []), group_seed(config.trainer.seed, name))
    router = Router(LocalTransport(groups, config, registry), config.runtime.max_batch_size,
                    config.runtime.max_wait_ms / 1000)
    runtime = config.runtime
    controller = Controller(experiment.workflow, config.roles, router, experiment.tools,
                            runtime.max_concurrent_episodes, runtime.tool_timeout_s, runtime.episode_timeout_s,
                            experiment.parsers)
    tasks = experiment.tasks("train")
    size = min(config.algorithm.group_size, episodes)
    specs = [EpisodeSpec(f"dry-{i}", f"dry-t{i // size}", tasks[(i // size) % len(tasks)]) for i in range(episodes)]
    trajectories = asyncio.run(controller.run(specs))
    credit = CreditAssigner(config, experiment.rewards, experiment.estimator).assign(trajectories)
    result = DryRun(trajectories, Counter(c.turn.role for c in credit.turns))
    if all(t.failed for t in trajectories):
        first = trajectories[0]
        raise UserError(f"every one of the {episodes} dry-run episodes failed; the first: {first.error}. "
                        "Fix the workflow or reward code (run with --debug for the traceback)",
                        where="validate --episodes") from first.exception
    return result


def describe_dry_run(experiment: Experiment, result: DryRun) -> str:
    """What the episodes did: roles acted, tools called, reward values by key and level, failures."""
    config = experiment.config
    trajectories = result.trajectories
    turns = Counter(turn.role for t in trajectories for turn in t.turns())
    parse_errors = Counter(turn.role for t in trajectories for turn in t.turns() if turn.parse_error)
    lines = [f"dry run: {len(trajectories)} episodes with stand-in models (random tokens, no weights)"]
    for role in config.roles:
        lines.append(f"  role {role}: {turns[role]} turns, {parse_errors[role]} parse errors, "
                     f"{result.credited_turns[role]} trainable turns credited")
    tools = Counter(node.tool for t in trajectories for node in t.tool_calls())
    tool_errors = Counter(node.tool for t in trajectories for node in t.tool_calls() if node.error)
    for tool, count in sorted(tools.items()):
        lines.append(f"  tool {tool}: {count} calls, {tool_errors[tool]} errors")
    scored = [t for t in trajectories if not t.failed]
    for key, spec in zip(reward_keys(config.rewards), config.rewards):
        values = [t.rewards[key] for t in scored]
        if spec.level == "trajectory":
            shown = sample_values([float(v) for v in values]) if values else "no scored episodes"
            lines.append(f"  reward {key} (level {spec.level}, weight {spec.weight:g}): {shown}")
            continue
        reached = sorted({k for value in values for k in value})
        shown = f"keys {', '.join(reached[:6]) or 'none'}{' ...' if len(reached) > 6 else ''}"
        lines.append(f"  reward {key} (level {spec.level}, weight {spec.weight:g}): {shown}")
        for role, role_values in per_role_values(scored, key).items():
            lines.append(f"    {role}: {sample_values(role_values)}")
    for error, count in Counter(t.error for t in result.failures).most_common(5):
        lines.append(f"  failed x{count}: {error}")
    return "\n".join(lines)


SAMPLE_SIZE = 4
"""Values of a reward shown as they came, besides mean and range: a sign error shows in them."""


def per_role_values(trajectories: list[GraphTrajectory], key: str) -> dict[str, list[float]]:
    """A role- or turn-level reward's values grouped by the role they go to (a turn id maps to its role)."""
    grouped: dict[str, list[float]] = {}
    for trajectory in trajectories:
        role_of = {turn.id: turn.role for turn in trajectory.turns()}
        for name, value in trajectory.rewards[key].items():
            grouped.setdefault(role_of.get(name, name), []).append(float(value))
    return dict(sorted(grouped.items()))


def sample_values(values: list[float]) -> str:
    """``mean m (min a, max b; first: v1, v2, ...)``, each to 3 significant digits."""
    first = ", ".join(f"{v:.3g}" for v in values[:SAMPLE_SIZE]) + (" ..." if len(values) > SAMPLE_SIZE else "")
    return f"mean {sum(values) / len(values):.3g} (min {min(values):.3g}, max {max(values):.3g}; first: {first})"
