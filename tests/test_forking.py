"""Forking at a recorded decision point: token-exact replay of the prefix, fresh sampling after it.

A real tiny torch model samples a three-role relay (speaker -> relay ->
listener), written once as a Python workflow and once as a YAML graph. Forks
of a recorded episode must reproduce its first k turns token for token, mark
them replayed, record parent and fork point, sample turn k afresh, and keep
the replayed turns out of credit.
"""

from __future__ import annotations

import asyncio

import pytest

import unimas
from unimas.algorithms.credit import CreditAssigner
from unimas.config.loading import config_from_dict
from unimas.controller.episodes import Controller
from unimas.controller.forking import episode_tree, fork_specs, sampled_tokens
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.controller.specs import ReplayPrefix
from unimas.runtime.transport import start_transport
from unimas.training.experiment import Experiment


async def relay(ctx, task):
    said = await ctx.act("speaker")
    passed = await ctx.act("relay", message=said)
    heard = await ctx.act("listener", message=passed)
    return {"answer": heard.text.strip(), "message": said.text}


@unimas.hookimpl
def unimas_workflows():
    return {"relay3": relay}


TINY = {"architecture": "qwen2", "alphabet": "SRL:abcdefgh01234567", "hidden_size": 32, "num_layers": 1,
        "num_heads": 2, "init_std": 0.5, "tie_embeddings": False}
GRAPH = {"start": "speak", "nodes": {"speak": {"kind": "llm", "role": "speaker"},
                                     "hand": {"kind": "llm", "role": "relay", "inputs": {"message": "speak"}},
                                     "listen": {"kind": "llm", "role": "listener", "inputs": {"message": "hand"}}},
         "edges": [{"from": "speak", "to": "hand"}, {"from": "hand", "to": "listen"}],
         "outcome": {"answer": "listen", "message": "speak"}}


def make(workflow: dict):
    generation = {"max_new_tokens": 3, "temperature": 1.0, "require_eos": False}
    config = config_from_dict({
        "name": "fork-test", "plugins": ["tests.test_forking"],
        "models": {"shared": {"backend": "torch", "options": {"tiny": TINY}}},
        "roles": {"speaker": {"model": "shared", "template": "S:{target}", "generation": generation},
                  "relay": {"model": "shared", "template": "R:{message}", "generation": generation},
                  "listener": {"model": "shared", "template": "L:{message}", "generation": generation}},
        "workflow": workflow, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"group_size": 2}, "trainer": {"steps": 1, "tasks_per_step": 1},
        "runtime": {"kind": "local"},
    })
    experiment = Experiment.resolve(config)
    transport = start_transport(config, experiment.registry)
    controller = Controller(experiment.workflow, config.roles, Router(transport), experiment.tools,
                            parsers=experiment.parsers)
    return experiment, controller


@pytest.mark.parametrize("workflow", [{"name": "relay3"}, {"graph": GRAPH}], ids=["python", "yaml-graph"])
def test_forked_siblings_replay_the_recorded_prefix_token_for_token(workflow):
    experiment, controller = make(workflow)
    task = experiment.tasks("train")[0]
    [parent] = asyncio.run(controller.run([EpisodeSpec("root", "t0", task)]))
    assert not parent.failed and [t.role for t in parent.turns()] == ["speaker", "relay", "listener"]
    for k in (1, 2):
        siblings = asyncio.run(controller.run(fork_specs(parent, k, siblings=4)))
        for child in siblings:
            assert not child.failed, child.error
            assert child.forked_from == "root" and child.fork_turn == parent.turns()[k].id
            assert child.task_id == parent.task_id
            turns, recorded = child.turns(), parent.turns()
            for mine, theirs in zip(turns[:k], recorded[:k]):
                assert mine.replayed and mine.id == theirs.id
                assert (mine.prompt_ids, mine.response_ids, mine.logprobs, mine.text) == \
                       (theirs.prompt_ids, theirs.response_ids, theirs.logprobs, theirs.text)
            assert not any(t.replayed for t in turns[k:])
            # turn k sees exactly the recorded history, then samples afresh
            assert turns[k].prompt_ids == recorded[k].prompt_ids
        assert any(child.turns()[k].response_ids != parent.turns()[k].response_ids for child in siblings), \
            "temperature-1 sampling of a random model never changed the fork turn: is it being replayed?"
        assert sampled_tokens(siblings) == sum(len(t.response_ids) for c in siblings for t in c.turns()[k:])
        tree = episode_tree([parent, *siblings])
        assert sorted(tree.successors("root")) == sorted(c.episode_id for c in siblings)
        assert {tree.edges["root", c.episode_id]["fork_turn"] for c in siblings} == {parent.turns()[k].id}
    # replayed turns are never trained twice: credit sees only the fresh ones
    credit = CreditAssigner(experiment.config, experiment.rewards, experiment.estimator)
    children = asyncio.run(controller.run(fork_specs(parent, 2, siblings=2)))
    credited = credit.assign([parent, *children]).turns
    assert sorted(c.turn.role for c in credited if c.trajectory is not parent) == ["listener", "listener"]
    again = type(parent).from_json(children[0].to_json())
    assert (again.forked_from, again.fork_turn, again.turns()[0].replayed) == ("root", "listener#0", True)


def test_a_fork_whose_history_differs_from_the_recording_fails_instead_of_training_on_it():
    experiment, controller = make({"name": "relay3"})
    task = experiment.tasks("train")[0]
    [parent] = asyncio.run(controller.run([EpisodeSpec("root", "t0", task)]))
    other = dict(task, target="h" if task["target"] != "h" else "a")
    [child] = asyncio.run(controller.run([EpisodeSpec("bad", "t0", other, prefix=ReplayPrefix.of(parent, 2))]))
    assert child.failed and "differs from the recorded one" in child.error
    with pytest.raises(ValueError, match="outside episode"):
        ReplayPrefix.of(parent, 4)
