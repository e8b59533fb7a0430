"""A method from a plugin module outside unimas, through the algorithm hooks alone (no edit to unimas).

This module is the plugin: the config lists it under ``plugins:``. Its rollout
control forks every second episode at its second turn; its update order
updates the listener before the speaker; both record what they did, and the
run's trajectories must show it.
"""

from __future__ import annotations

import json

import unimas
from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.config.loading import load_config
from unimas.preflight.algorithm_reference import parameter_lines
from unimas.preflight.validate import validate
from unimas.training.rollout import _build
from unimas.trajectory import read_jsonl

CALLS: list[tuple[str, object]] = []


class BranchFirstTurn:
    async def rollout(self, session, specs):
        roots = await session.run(specs[::2])
        CALLS.append(("rollout", len(roots)))
        return roots + await session.fork([(root, 1, 1) for root in roots])


def by_length(scale=1.0, **extra):
    """Written before typed parameters: ``scale`` and the ``extra`` names reach it unchecked."""
    CALLS.append(("by_length", (scale, extra)))

    def shape(turns):
        return [scale * c.turn.reward for c in turns]
    return shape


class FirstActorLast:
    def stages(self, execution):
        CALLS.append(("stages", list(execution)))
        return [[role] for role in reversed(execution)]

    def adjust(self, role, turns, done):
        CALLS.append(("adjust", (role, sorted(done))))
        return turns


@unimas.hookimpl
def unimas_rollout_controls():
    return {"branch_first_turn": BranchFirstTurn}


@unimas.hookimpl
def unimas_update_orders():
    return {"first_actor_last": FirstActorLast}


@unimas.hookimpl
def unimas_credit_shapers():
    return {"by_length": by_length}


def test_an_outside_plugin_adds_a_rollout_control_and_an_update_order(tmp_path):
    CALLS.clear()
    args = ["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(tmp_path)]
    for item in ["plugins=[tests.test_methods_external]", "trainer.steps=2", "trainer.tasks_per_step=4",
                 "trainer.eval_size=4", "algorithm.group_size=4", "trainer.sample_trajectories=64",
                 "algorithm.rollout={name: branch_first_turn}", "algorithm.update_order={name: first_actor_last}",
                 "logging.report=false", "trainer.stop_at_accuracy=null"]:
        args += ["--set", item]
    assert main(args) == 0
    assert ("rollout", 8) in CALLS and ("stages", ["speaker", "listener"]) in CALLS
    assert ("adjust", ("listener", [])) in CALLS and ("adjust", ("speaker", ["listener"])) in CALLS
    episodes = read_jsonl(tmp_path / "trajectories" / "train.jsonl")
    forks = [t for t in episodes if t.forked_from]
    assert len(forks) == len(episodes) / 2
    by_id = {t.episode_id: t for t in episodes}
    for fork in forks:
        parent = by_id[fork.forked_from]
        assert fork.turns()[0].response_ids == parent.turns()[0].response_ids
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "group/shared/policy_loss" in records[-1]


def test_untyped_parameters_of_an_outside_plugin_pass_through_unchecked(capsys):
    CALLS.clear()
    params = "{scale: '2', window: [1, 2]}"  # a string and an unknown name: no types to check them against
    config = load_config(EXAMPLES / "quickstart.yaml", ["plugins=[tests.test_methods_external]",
                                                      f"algorithm.credit={{name: by_length, params: {params}}}"])
    experiment = validate(config)
    _build(experiment.registry, "credit_shapers", config.algorithm.credit, "algorithm.credit")
    assert CALLS == [("by_length", ("2", {"window": [1, 2]}))]
    lines = parameter_lines("credit_shapers", "by_length", by_length)
    assert lines[0] == "scale: any (unchecked) = 1.0"
    assert "untyped parameters are passed through unchecked" in lines
