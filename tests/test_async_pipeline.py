"""The asynchronous pipeline: max_staleness 0 is the recorded synchronous loop (its metrics and counts; a second run on
the same machine repeats it exactly); above 0 rollouts run ahead of updates within the bound, stale turns are
dropped or re-weighted, and a resume is lossless."""

from __future__ import annotations

import json

import pytest

from tests.async_golden import CONFIGS, GOLDEN, run

NEW_KEYS = ("/staleness_mean", "/staleness_max", "/stale_dropped", "/weight_version", "/stale_turns",
            "/importance_weight", "/rerendered_turns", "/clipped", "episode/no_turns", "/entropy", "/distinct_answers")
"""Metrics added since the recording: the pipeline's, the count of episodes without a model turn, per-role exploration."""


COUNTED = ("step", "/turns", "/lr", "episode/failures", "/truncated_prompts")
"""Recorded values the config alone decides (how many turns each role takes, the learning rate, the step): the same on
every machine. Rewards, losses and token counts are not among them: they follow the sampled tokens, and another CPU's
kernels may move a logit by its last bit, enough to tip one draw and so a whole run."""


def counted(record: dict) -> dict:
    return {k: v for k, v in record.items() if k.endswith(COUNTED)}


@pytest.mark.parametrize("config", CONFIGS)
def test_max_staleness_0_is_the_recorded_synchronous_loop(tmp_path, config):
    """Depth 0 has the recorded run's shape (its metrics, its counts) and is synchronous: every trained turn was sampled
    by the weights of the step before, nothing is dropped or re-weighted, one weight version per step."""
    recorded = json.loads(GOLDEN.read_text())[config]
    records = run(config, tmp_path / "run", ["algorithm.max_staleness=0"])
    assert len(records) == len(recorded)
    for now, then in zip(records, recorded):
        assert set(then) <= set(now), sorted(set(then) - set(now))
        assert counted(now) == counted(then)
        added = set(now) - set(then)
        assert all(k.endswith(NEW_KEYS) for k in added), sorted(added)
        assert all(now[k] == 0 for k in added if k.endswith(("/staleness_max", "/stale_dropped", "/stale_turns", "/clipped")))
        assert all(now[k] == 1 for k in added if k.endswith("/importance_weight"))
    group = "listener_model" if "separate" in config else "shared"
    assert [r[f"group/{group}/weight_version"] for r in records[1:]] == [1.0, 2.0, 3.0]


def test_max_staleness_0_reproduces_itself_exactly(tmp_path):
    """Two depth-0 runs on one machine draw the same tokens and compute the same floats: the pipeline adds no
    scheduling-dependent order (both runs here, so no other CPU's last bits enter the comparison)."""
    first = run("quickstart_separate.yaml", tmp_path / "first", ["algorithm.max_staleness=0"])
    second = run("quickstart_separate.yaml", tmp_path / "second", ["algorithm.max_staleness=0"])
    assert first == second


def _staleness_run(tmp_path, extra: list[str], resume: bool = False) -> list[dict]:
    return run("quickstart_separate.yaml", tmp_path / "run", ["algorithm.max_staleness=1", *extra], resume)


def test_rollouts_run_one_step_ahead_and_every_trained_turn_is_within_the_bound(tmp_path):
    records = _staleness_run(tmp_path, [])[1:]
    for group in ("speaker_model", "listener_model"):
        # step 2's episodes were sampled alongside step 1's (before any update): every turn is one version old
        assert records[1][f"group/{group}/staleness_max"] == 1 and records[1][f"group/{group}/stale_turns"] > 0
        assert all(r[f"group/{group}/staleness_max"] <= 1 and r[f"group/{group}/stale_dropped"] == 0 for r in records)
        assert 0 < records[1][f"group/{group}/importance_weight"] <= 2.0  # truncated at algorithm.importance_cap
    assert records[0]["group/listener_model/staleness_max"] == 0  # step 1: nothing trained before it


@pytest.mark.parametrize("policy", ["drop", "reweight"])
def test_a_group_with_a_lower_bound_drops_or_reweights_its_stale_turns(tmp_path, policy):
    """The pipeline runs one step ahead for the speaker; the listener's own bound is 0."""
    records = _staleness_run(tmp_path, ["models.listener_model.algorithm.max_staleness=0",
                                        f"algorithm.stale_turns={policy}"])
    step2 = records[2]
    assert step2["group/listener_model/staleness_max"] == 1 and step2["group/speaker_model/stale_dropped"] == 0
    if policy == "drop":
        assert step2["group/listener_model/stale_dropped"] == step2["role/listener/turns"]
        assert "group/listener_model/tokens" not in step2  # nothing left to train: no update
    else:
        assert step2["group/listener_model/stale_dropped"] == 0 and step2["group/listener_model/stale_turns"] > 0


class Killed(BaseException):
    """Stands in for SIGKILL: nothing in the trainer catches it."""


def record_and_kill_at_step_3(monkeypatch) -> tuple[list[tuple], dict[str, int]]:
    """Patch the trainer to record every trained turn and, on the first attempt, die as step 3 starts.

    Returns the record, ``(attempt, episode, turn id, weight version, response tokens)`` per trained turn,
    and the attempt counter (set ``attempt["n"] = 2`` before the resume).
    """
    from unimas.training.trainer import Trainer

    trained: list[tuple[int, str, str, int, tuple]] = []
    attempt = {"n": 1}
    update, train_step = Trainer._update_groups, Trainer.train_step

    async def recording_update(self, credited):
        trained.extend((attempt["n"], c.trajectory.episode_id, c.turn.id, c.turn.weight_version,
                        tuple(c.turn.response_ids)) for c in credited)
        return await update(self, credited)

    async def dying_step(self, step):
        if attempt["n"] == 1 and step == 3:
            raise Killed()
        return await train_step(self, step)

    monkeypatch.setattr(Trainer, "_update_groups", recording_update)
    monkeypatch.setattr(Trainer, "train_step", dying_step)
    return trained, attempt


def test_a_resume_trains_the_saved_pending_rollouts_and_loses_no_step(tmp_path, monkeypatch):
    from unimas.training.pipeline import PENDING

    trained, attempt = record_and_kill_at_step_3(monkeypatch)
    settings = ["trainer.steps=6", "trainer.save_every=2", "trainer.eval_every=0"]
    with pytest.raises(Killed):
        _staleness_run(tmp_path, settings)
    pending = (tmp_path / "run" / "checkpoints" / "step_000002" / PENDING).read_text().splitlines()
    assert {json.loads(line)["step"] for line in pending} == {2}  # rolled out ahead of checkpoint 2, not trained
    attempt["n"] = 2
    records = _staleness_run(tmp_path, settings, resume=True)
    assert [r["step"] for r in records] == list(range(7))  # no step lost, none logged twice

    def step_of(episode: str) -> int:
        return int(episode.split("-")[0][1:])

    first = [t for t in trained if t[0] == 1]
    second = [t for t in trained if t[0] == 2]
    # the resumed run trained the saved rollouts of step 3 token for token (the same versions): not regenerated
    assert [t[1:] for t in second if step_of(t[1]) == 2] == [t[1:] for t in first if step_of(t[1]) == 2]
    # the run's history: steps 1-2 from before the checkpoint, 3-6 after the resume; each turn trained once
    history = [t[1:3] for t in first if step_of(t[1]) < 2] + [t[1:3] for t in second]
    assert len(history) == len(set(history))
    assert sorted({step_of(episode) for episode, _ in history}) == list(range(6))


@pytest.mark.slow
def test_the_async_benchmark_runs():
    """``benchmarks/async_pipeline.py --smoke`` as a reader runs it; numbers are not asserted (shared machine)."""
    from tests.test_benchmarks_smoke import run_benchmark, table_rows

    rows = table_rows(run_benchmark("async_pipeline.py"), "task")
    assert [(row[0], row[1]) for row in rows] == [(t, s) for t in ("2-role", "3-role")
                                                  for s in ("0", "1", "2", "1 + process")]
    assert all(float(row[3].replace(",", "")) > 0 for row in rows)  # trained tokens/s
    assert all(row[5] == "1.00× (1.00-1.00)" for row in rows if row[1] == "0")  # steps/s: sync against itself
    assert all(float(row[5].split("×")[0]) > 0 for row in rows)


def test_batched_grpo_advantages_are_verls_bit_for_bit():
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from unimas.algorithms.credit import grouped_advantages

    generator = torch.Generator().manual_seed(0)
    sizes = [1, 2, 3, 8, 8, 8, 5, 16]  # lone turns, uneven and repeated group sizes
    keys = [f"task{g}|role" for g, size in enumerate(sizes) for _ in range(size)]
    order = torch.randperm(len(keys), generator=generator).tolist()  # groups interleaved, as turns arrive
    keys = [keys[i] for i in order]
    scores = torch.randint(0, 3, (len(keys), 1), generator=generator).float() * 0.5
    scores[::7] += torch.rand(len(scores[::7]), 1, generator=generator)
    for norm in (True, False):
        expected, _ = compute_grpo_outcome_advantage(scores.clone(), torch.ones_like(scores), np.array(keys, object),
                                                     norm_adv_by_std_in_grpo=norm)
        assert torch.equal(grouped_advantages(scores, keys, norm), expected)


def test_the_bound_drops_late_pipeline_turns_but_keeps_replayed_ones():
    from tests.conftest import EXAMPLES
    from unimas.algorithms.credit import CreditedTurn
    from unimas.config.loading import load_config
    from unimas.training.pipeline import WeightVersions
    from unimas.trajectory import GraphTrajectory, TurnNode

    config = load_config(EXAMPLES / "quickstart_separate.yaml")  # max_staleness 0, stale_turns drop
    episode = GraphTrajectory("e", "t")

    def turn(version: int, staleness: int = 0) -> CreditedTurn:
        node = TurnNode(id=f"speaker#{version}", role="speaker", model_group="speaker_model", prompt="",
                        weight_version=version, staleness=staleness)
        return CreditedTurn(episode, node, "t|speaker")

    versions = WeightVersions(config, {"speaker_model": 3})
    fresh, late, replayed = turn(3), turn(2), turn(1, staleness=2)
    kept, metrics = versions.admit([fresh, late, replayed])
    assert kept == [fresh, replayed] and (fresh.turn.staleness, late.turn.staleness) == (0, 1)
    assert metrics["group/speaker_model/stale_dropped"] == 1 and metrics["group/speaker_model/staleness_max"] == 2


@pytest.mark.slow  # two process starts: ~20 s on two cores
def test_a_pipelined_run_killed_with_sigkill_resumes_on_its_saved_rollouts(tmp_path):
    """SIGKILL inside the step-6 checkpoint write (``rng.pt`` is a FIFO nobody reads); the resume from checkpoint
    4 trains the rollouts that checkpoint saved for step 5, token for token, and logs every step once."""
    import os
    import subprocess
    import sys

    from tests.async_golden import EXAMPLES, SETTINGS
    from tests.conftest import REPO
    from tests.test_kill_resume import kill_when
    from unimas.training.pipeline import PENDING
    from unimas.trajectory import GraphTrajectory, read_jsonl

    run_dir = tmp_path / "run"
    sets = [*SETTINGS, "algorithm.max_staleness=1", "trainer.steps=6", "trainer.save_every=2", "trainer.eval_every=0",
            "trainer.sample_trajectories=64"]  # 32 episodes per step: every one is written with its step
    stalled = run_dir / "checkpoints" / "step_000006" / "speaker_model"
    stalled.mkdir(parents=True)
    os.mkfifo(stalled / "rng.pt")
    command = [sys.executable, "-m", "unimas.cli", "train", str(EXAMPLES / "quickstart_separate.yaml"),
               "--run-dir", str(run_dir), *sum((["--set", s] for s in sets), [])]
    with open(tmp_path / "run.log", "w") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log,
                                   env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    kill_when(process, lambda: (stalled / "model").exists(), timeout=120)
    saved = [json.loads(line) for line in (run_dir / "checkpoints" / "step_000004" / PENDING).read_text().splitlines()]
    assert {record["step"] for record in saved} == {4} and len(saved) == 32  # step 5's rollouts, generated ahead

    records = run("quickstart_separate.yaml", run_dir, sets[len(SETTINGS):], resume=True)
    assert [r["step"] for r in records] == list(range(7))
    trained = read_jsonl(run_dir / "trajectories" / "train.jsonl")
    assert sorted(t.step for t in trained) == [step for step in range(1, 7) for _ in range(32)]
    assert len({t.episode_id for t in trained}) == len(trained)  # no episode trained twice

    def tokens(trajectory: GraphTrajectory) -> list[tuple]:
        return [(n.id, n.weight_version, tuple(n.response_ids)) for n in trajectory.turns()]

    pending = {e["episode"]["episode_id"]: tokens(GraphTrajectory.from_dict(e["episode"])) for e in saved}
    assert {t.episode_id: tokens(t) for t in trained if t.step == 5} == pending
