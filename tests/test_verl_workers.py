"""``workers: ray``: a verl group hosted on verl's RayWorkerGroup of ActorRolloutRefWorker ranks (data parallel).

On CPU the two ranks are gloo processes, each with its FSDP2 shard and a
rollout server replica of its own (verl's hybrid layout). Checks what a broken
wiring gets wrong: the ranks must score tokens exactly as the one-rank
in-process engine with the same weights does (a wrong row order or a lost
padding row breaks it), the update must move log-probs with the advantages'
signs, after the sync *every* server must match the trainer and report the new
version, the reference must stay at the initial weights, and a checkpoint must
restore the ranks' weights exactly and refuse a different rank count.
"""

from __future__ import annotations

import pytest
import ray
import torch

from tests.conftest import save_tiny_model
from tests.test_verl_checkpoint_safety import Payload
from unimas.config.loading import config_from_dict
from unimas.config.schema import GenerationConfig
from unimas.contract.registry import build_registry
from unimas.errors import UserError
from unimas.groups.base import GenRequest, TrainTurn
from unimas.preflight.validate import check_config
from unimas.runtime.build import build_group, group_spec

TINY = {"architecture": "qwen2", "alphabet": "SL:abcdefgh", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
        "max_positions": 32}
GEN = GenerationConfig(max_new_tokens=3, temperature=1.0, require_eos=False)
TURNS = [TrainTurn([4, 6, 7], [8, 9, 10], [], 1.0, temperature=0.7), TrainTurn([5, 6], [11, 1], [], -1.0,
                                                                                  temperature=1.3),
         TrainTurn([5, 7], [11], [], 1.0)]


def experiment(group_change: dict | None = None, **options) -> dict:
    group = {"backend": "verl", "options": {"tiny": TINY, **options}, "optim": {"lr": 0.01}, **(group_change or {})}
    return {
        "name": "verl_workers", "models": {"dp": group},
        "roles": {"speaker": {"model": "dp", "template": "S:{target}"},
                  "listener": {"model": "dp", "template": "L:{message}"}},
        "workflow": {"name": "signalling"}, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "group_size": 4, "kl_coef": 0.1}, "trainer": {"steps": 10, "seed": 5},
    }


def problems(group_change: dict | None = None, **options) -> dict:
    return dict(check_config(config_from_dict(experiment(group_change, **options)), build_registry()))


def test_the_plan_counts_each_ranks_cpu_bundle():
    """Under runtime: ray too few CPUs would leave the ranks waiting forever for their bundles."""
    from unimas.runtime.placement import placement_plan

    plan = placement_plan(config_from_dict(experiment(workers="ray", world_size=2)))
    assert "model group dp: 3 CPU, 0 GPU" in plan and "Ray worker group of 2 rank(s) on CPU (gloo)" in plan


def test_validation_of_ranks_gpus_and_rollouts():
    assert problems(workers="ray", world_size=2) == {}
    assert "workers: ray" in problems(world_size=2)["models.dp.options.world_size"]
    assert "workers: ray" in problems({"resources": {"gpus": 2}})["models.dp.resources.gpus"]
    assert problems({"resources": {"gpus": 2}}, workers="ray", world_size=2) == {}
    assert "must equal" in problems({"resources": {"gpus": 2}}, workers="ray")["models.dp.options.world_size"]
    assert problems({"resources": {"gpus": 0.5}}, workers="ray") == {}  # two groups per GPU, one pool
    assert "1/k" in problems({"resources": {"gpus": 0.4}}, workers="ray")["models.dp.resources.gpus"]
    assert "1/k" in problems({"resources": {"gpus": 0.5}}, workers="ray", world_size=2)["models.dp.resources.gpus"]
    assert "frozen" in problems({"trainable": False}, workers="ray")["models.dp.options.workers"]
    assert "workers: ray" in problems({"resources": {"gpus": 1}}, rollout="vllm")["models.dp.options.workers"]
    assert problems({"resources": {"gpus": 1}}, rollout="vllm", workers="ray") == {}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny HF dir for verl's HFModelConfig to read."""
    return save_tiny_model(tmp_path_factory.mktemp("verl_workers_tiny"), TINY)


def test_the_worker_config_carries_the_translated_settings(model_dir):
    from verl.utils.config import omega_conf_to_dataclass

    from unimas.groups.verl import worker_config
    from unimas.groups.verl.options import SERVER_ROLLOUT

    config = config_from_dict(experiment(workers="ray", world_size=2, dynamic_batch_size=True))
    spec = group_spec(config, build_registry(), "dp")  # options already validated by the verl backend
    root = worker_config.compose(spec, model_dir)
    tree = root.actor_rollout_ref
    assert tree.model.path == model_dir and tree.model.override_config.attn_implementation == "sdpa"
    assert tree.actor.optim.lr == 0.01 and tree.actor.fsdp_config.strategy == "fsdp2"
    assert tree.actor.use_dynamic_bsz and tree.rollout.log_prob_use_dynamic_bsz  # verl asserts they agree
    assert tree.rollout.name == SERVER_ROLLOUT and tree.rollout.custom.group == "dp"
    assert tree.rollout.n_gpus_per_node == 2 and tree.rollout.checkpoint_engine.backend == "naive"
    assert tree.ref.fsdp_config.forward_only and not tree.actor.fsdp_config.forward_only
    assert worker_config.role(spec) == "actor_rollout_ref"
    assert omega_conf_to_dataclass(tree.actor.optim).lr == 0.01  # what the ranks build from it


@pytest.fixture(scope="module")
def groups():
    registry = build_registry()
    ray_before = ray.is_initialized()
    ranked = build_group(config_from_dict(experiment(workers="ray", world_size=2)), registry, "dp")
    single = build_group(config_from_dict(experiment()), registry, "dp")
    yield ranked, single
    ranked.close()
    if not ray_before:
        ray.shutdown()


def gap(x, y):
    return max(abs(p - q) for a, b in zip(x, y) for p, q in zip(a, b))


@pytest.mark.slow
def test_two_ranks_score_as_one_rank_and_have_a_server_each(groups):
    ranked, single = groups
    assert ranked.trainer.ranks == 2 and ranked.actor is None
    assert ranked.rollout.server_names == ["unimas_dp_hf_server_0_0", "unimas_dp_hf_server_1_0"]
    assert gap(ranked.trainer_logprobs(TURNS), single.trainer_logprobs(TURNS)) < 1e-5
    assert gap(ranked.trainer_logprobs(TURNS[:1]), single.trainer_logprobs(TURNS[:1])) < 1e-5  # 1 turn, 2 ranks
    # equal rows per rank, equal tokens per row: the ranks' averaged gradient is the one-rank gradient
    even = [TrainTurn([4 + i, 6], [8 + i, 9], [], 1.0 if i % 2 else -1.0) for i in range(4)]
    ranked.update(even)
    single.update(even)
    assert gap(ranked.trainer_logprobs(TURNS), single.trainer_logprobs(TURNS)) < 1e-4
    results = ranked.generate([GenRequest(prompt=p, generation=GEN) for p in ("S:a", "S:b", "S:c")])
    assert all(r.response_ids and len(r.logprobs) == len(r.response_ids) for r in results)
    assert {r.weight_version for r in results} == {1}


@pytest.mark.slow
def test_update_sync_reference_and_checkpoint(groups, tmp_path):
    ranked, single = groups
    before = ranked.trainer_logprobs(TURNS)
    version = ranked.rollout.weight_version + 1  # the module's groups may have trained in an earlier test
    metrics = ranked.update(TURNS)
    after = ranked.trainer_logprobs(TURNS)
    assert metrics["weight_version"] == version and metrics["lr"] == 0.01
    for turn, old, new in zip(TURNS, before, after):  # advantages +1, -1, +1
        assert (sum(new) > sum(old)) == (turn.advantage > 0)
    assert ranked.last_sync_diff < 1e-5 and ranked.rollout.weight_version == version
    served = ranked.rollout.logprobs_per_server([t.prompt_ids for t in TURNS], [t.response_ids for t in TURNS],
                                                [t.temperature or 1.0 for t in TURNS])
    assert len(served) == 2 and all(gap(answer, after) < 1e-5 for answer in served)
    initial = single.trainer_logprobs(TURNS, reference=True)  # both references hold the initial weights
    assert gap(ranked.trainer_logprobs(TURNS, reference=True), initial) < 1e-5

    ranked.save(tmp_path / "ckpt")
    ranked.update(TURNS)
    assert gap(ranked.trainer_logprobs(TURNS), after) > 1e-3
    ranked.load(tmp_path / "ckpt")
    assert ranked.trainer_logprobs(TURNS) == after and ranked.rollout.weight_version == version
    with pytest.raises(UserError, match="2 ranks"):
        single.load(tmp_path / "ckpt")
    shard = tmp_path / "ckpt" / "verl_actor" / "model_rank_1_of_2.safetensors"  # a rank's refusal reaches the group
    torch.save(Payload(tmp_path / "unpickled"), shard)
    with pytest.raises(UserError) as refused:
        ranked.load(tmp_path / "ckpt")
    assert refused.value.where == str(shard) and not (tmp_path / "unpickled").exists()


@pytest.mark.slow
def test_a_rollout_that_cannot_score_is_checked_on_tokens_it_samples(groups):
    """vLLM's servers only report log-probs of what they sample: the sync check then samples (4 prompts x 4)."""
    ranked, _ = groups
    ranked.rollout.can_score = False
    try:
        version = ranked.weight_version
        ranked.update(TURNS)
        assert ranked.rollout.weight_version == version + 1  # known from the probe's answers, not a query
        assert ranked.last_sync_diff is not None and ranked.last_sync_diff < 1e-5
    finally:
        ranked.rollout.can_score = True


@pytest.mark.slow
def test_the_transport_runs_a_worker_groups_calls_beside_other_work(groups):
    """Its ranks do the work, so its update must not hold the event loop: another group's update overlaps it."""
    import asyncio
    import time

    from unimas.runtime.local import LocalTransport

    ranked, single = groups
    spans: dict[str, list[float]] = {}

    def timed(name, group):
        update = group.update

        def wrapper(turns):
            start = time.perf_counter()
            try:
                return update(turns)
            finally:
                spans[name] = [start, time.perf_counter()]
        return wrapper

    transport = LocalTransport({"ranked": ranked, "single": single}, config_from_dict(experiment()),
                               build_registry())
    assert set(transport._own_threads) == {"ranked"}
    ranked.update, single.update = timed("ranked", ranked), timed("single", single)
    try:
        async def both():
            return await asyncio.gather(transport.update("ranked", TURNS), transport.update("single", TURNS))

        asyncio.run(both())
    finally:
        del ranked.update, single.update
        for executor in transport._own_threads.values():
            executor.shutdown(wait=True)
    assert spans["single"][0] < spans["ranked"][1]  # inline, the single group would start after the ranked one


@pytest.mark.slow
def test_the_workers_benchmark_runs(capsys):
    """``benchmarks/verl_workers.py --smoke`` in this process (the Ray job this module's groups started serves it
    too; the script's own path handling is what the subprocess smoke runs of the other benchmarks check)."""
    from benchmarks.verl_workers import main
    from tests.test_benchmarks_smoke import number, table_rows

    assert main(["--smoke"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out, "variant")
    assert [row[0] for row in rows] == ["one after the other", "together"]
    assert all(number(row[1]) > 0 for row in rows) and "together / sequential:" in out
