"""Server mode of the verl backend on CPU: two groups whose rollouts are served through verl's own machinery.

Each group's generation goes through verl's ``LLMServerManager`` (hybrid), its
load balancer and ``LLMServerClient``, to a server Ray actor that verl's
``RolloutReplicaRegistry`` built; each weight sync goes through verl's
``CheckpointEngineManager`` (naive). Checks what a broken wiring gets wrong:
the two servers' actor names differ (a shared name would be one server for
both groups), after every sync the server scores tokens as the trainer does and
reports the new version, and an update of one group leaves the other's server
untouched.
"""

from __future__ import annotations

import pytest
import ray

from unimas.config.loading import config_from_dict
from unimas.config.schema import GenerationConfig
from unimas.contract.registry import build_registry
from unimas.groups.base import GenRequest, TrainTurn
from unimas.groups.verl.options import SERVER_ROLLOUT
from unimas.preflight.validate import check_config
from unimas.runtime.build import build_group

TINY = {"architecture": "qwen2", "alphabet": "SL:abcdefgh", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
        "max_positions": 32}
GEN = GenerationConfig(max_new_tokens=3, temperature=1.0, require_eos=False)
FIXED = [TrainTurn([4, 6, 7], [8, 9, 10], [], 0.0, temperature=0.7), TrainTurn([5, 6], [11, 1], [], 0.0,
                                                                                   temperature=1.3)]


def experiment(**change) -> dict:
    group = {"backend": "verl", "options": {"tiny": TINY, "rollout_server": True}, "optim": {"lr": 0.01}}
    return {
        "name": "verl_server", "models": {"srv_a": {**group, **change}, "srv_b": group},
        "roles": {"speaker": {"model": "srv_a", "template": "S:{target}"},
                  "listener": {"model": "srv_b", "template": "L:{message}"}},
        "workflow": {"name": "signalling"}, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "group_size": 4}, "trainer": {"steps": 10, "seed": 5},
    }


def test_validation_accepts_trained_hf_groups_and_refuses_the_rest():
    registry = build_registry()
    assert dict(check_config(config_from_dict(experiment()), registry)) == {}
    frozen = dict(check_config(config_from_dict(experiment(trainable=False)), registry))
    assert "trained group" in frozen["models.srv_a.options.rollout_server"]


@pytest.fixture(scope="module")
def groups():
    cfg, registry = config_from_dict(experiment()), build_registry()
    ray_before = ray.is_initialized()
    built = {name: build_group(cfg, registry, name) for name in ("srv_a", "srv_b")}
    yield built
    for group in built.values():
        group.close()
    if not ray_before:
        ray.shutdown()  # the groups started a local Ray job; later tests start their own


def served(group, turns=FIXED):
    return group.rollout.logprobs([t.prompt_ids for t in turns], [t.response_ids for t in turns],
                                  [t.temperature for t in turns])


def gap(x, y):
    return max(abs(p - q) for a, b in zip(x, y) for p, q in zip(a, b))


@pytest.mark.slow
def test_each_group_has_its_own_named_server_built_by_verl(groups):
    a, b = groups["srv_a"], groups["srv_b"]
    assert a.configs.rollout.name == b.configs.rollout.name == SERVER_ROLLOUT
    assert a.rollout.server_names == ["unimas_srv_a_hf_server_0_0"]
    assert b.rollout.server_names == ["unimas_srv_b_hf_server_0_0"]
    for group in (a, b):
        name = group.rollout.server_names[0]
        # the actor verl's replica launched is the one the trainer-side adapter finds by name
        assert ray.get_actor(name)._actor_id == group.rollout.servers[0]._actor_id
        assert type(group.rollout.replicas[0]).__name__ == "HFServerReplica"
    assert a.rollout.servers[0]._actor_id != b.rollout.servers[0]._actor_id


@pytest.mark.slow
def test_requests_are_routed_in_the_groups_process_without_a_balancer_actor(groups):
    """No verl routing actor (it imported all of verl per group); every request routed is released."""
    for group in groups.values():
        results = group.generate([GenRequest(prompt=p, generation=GEN) for p in ("S:a", "S:b", "S:c")])
        assert len(results) == 3
        assert group.rollout.manager.global_load_balancer is None  # verl starts its actor only there
        assert group.rollout.client.router.in_flight() == {group.rollout.manager.server_addresses[0]: 0}


@pytest.mark.slow
def test_sync_through_the_checkpoint_engine_matches_the_trainer_and_isolates_groups(groups):
    a, b = groups["srv_a"], groups["srv_b"]
    b_served = served(b)
    for step in range(2):
        version = a.weight_version
        results = a.generate([GenRequest(prompt=p, generation=GEN) for p in ("S:a", "S:bc", "S:h", "S:dd")])
        assert {r.weight_version for r in results} == {version}
        assert all(len(r.response_ids) == len(r.logprobs) > 0 for r in results)
        before = served(a)
        turns = [TrainTurn(r.prompt_ids, r.response_ids, r.logprobs, adv, rollout_logprobs_exact=r.logprobs_exact,
                           temperature=1.0, weight_version=r.weight_version)
                 for r, adv in zip(results, (1.0, -1.0, 1.0, -1.0))]
        metrics = a.update(turns)
        assert metrics["rollout_logprob_diff"] <= 1e-5  # the server's sampling log-probs were the trainer's
        assert a.weight_version == version + 1 and a.rollout.weight_version == version + 1
        after = served(a)
        assert gap(after, before) > 1e-3, "the update did not reach the server"
        assert gap(after, a.trainer_logprobs(FIXED)) <= 1e-5
        assert a.last_sync_diff <= 1e-5
        assert served(b) == b_served and b.rollout.weight_version == 0


@pytest.mark.slow
def test_load_restores_the_servers_weights_version_and_sampling_state(groups, tmp_path):
    b = groups["srv_b"]
    b.save(tmp_path / "b")
    version, logprobs = b.weight_version, served(b)
    one = [GenRequest(prompt="L:c", generation=GEN)]
    sampled = b.generate(one)[0].response_ids
    results = b.generate([GenRequest(prompt=p, generation=GEN) for p in ("L:a", "L:b")])
    b.update([TrainTurn(r.prompt_ids, r.response_ids, r.logprobs, adv, temperature=1.0,
                        weight_version=r.weight_version) for r, adv in zip(results, (1.0, -1.0))])
    assert b.rollout.weight_version == version + 1 and gap(served(b), logprobs) > 1e-3
    b.load(tmp_path / "b")
    assert b.weight_version == b.rollout.weight_version == version
    assert gap(served(b), logprobs) <= 1e-6
    assert b.generate(one)[0].response_ids == sampled  # the request seeds came back with the checkpoint
