"""A torch group's rollout replica in a child process (``models.<g>.options.rollout_process``).

The replica samples with the weights of the version it reports, holds the
trainer's weights bit for bit after an update, continues its sampling stream
across a checkpoint, dies with its parent (normal exit, an error, SIGKILL),
and a replica that dies is a clear error naming the group, not a hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.async_golden import run
from tests.conftest import REPO
from tests.test_torch_backend import ALPHABET, PROMPTS, gen, group_spec, response_logprob, turns_from
from unimas.config.schema import ModelGroupConfig, OptimConfig
from unimas.errors import ModelGroupError
from unimas.groups.base import GenRequest
from unimas.groups.torch import TorchModelGroup
from unimas.groups.torch.rollout_replica import RNG_FILE, RolloutProcessError, digests


def make_group(seed: int = 0, replica: bool = True, **algorithm) -> TorchModelGroup:
    """A tiny trainable group sampling in a rollout process (``replica``) or in this one."""
    tiny = dict(alphabet=ALPHABET, hidden_size=32, num_layers=2, num_heads=4, max_positions=64)
    config = ModelGroupConfig(options={"tiny": tiny, "rollout_process": replica}, optim=OptimConfig(lr=1e-2))
    return TorchModelGroup.build(group_spec(config, seed=seed, **algorithm))


def requests(max_new: int = 4) -> list[GenRequest]:
    return [GenRequest(prompt=p, generation=gen(max_new)) for p in PROMPTS]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def group():
    group = make_group(max_staleness=1)
    yield group
    group.close()


@pytest.mark.slow
def test_the_replica_samples_with_the_weights_of_the_version_it_reports(group):
    assert group.sampler.replica is not None and group.sampler.replica.pid != os.getpid()
    before = group.generate(requests())
    assert {r.weight_version for r in before} == {0}
    old = [response_logprob(group, r) for r in before]
    for r, logp in zip(before, old):  # the child's log-probs are the trainer's for the same weights
        assert sum(r.logprobs) == pytest.approx(logp, abs=1e-4)
    assert group.sampler.replica.weight_digests() == digests(group.policy.model)

    metrics = group.update(turns_from(before, advantage=1.0))
    assert metrics["weight_version"] == 1.0 and 0 <= metrics["weight_sync_s"] < 5 and metrics["weight_sync_wait_s"] >= 0
    assert group.sampler.replica.weight_digests() == digests(group.policy.model)  # bit-identical after the update
    after = group.generate(requests())
    assert {r.weight_version for r in after} == {1}
    for r in after:
        assert sum(r.logprobs) == pytest.approx(response_logprob(group, r), abs=1e-4)
    assert [response_logprob(group, r) for r in before] != pytest.approx(old, abs=1e-4)  # the update moved them


@pytest.mark.slow
def test_the_replica_samples_what_the_group_samples_in_process_stop_strings_and_streams_included():
    """Same seed, same requests: the same tokens, texts and streamed texts as sampling in this process."""
    def sample(group: TorchModelGroup) -> tuple[list, list[list[str]]]:
        streams: list[list[str]] = [[] for _ in PROMPTS]
        batch = [GenRequest(prompt=p, generation=gen(8), stop=["a", "b"], progress=streams[i].append)
                 for i, p in enumerate(PROMPTS)]
        results = group.generate(batch) + group.generate(requests(5))
        return [(r.response_ids, r.text, r.stop, r.finished) for r in results], streams

    here, there = make_group(replica=False), make_group()
    try:
        expected, (got, streamed) = sample(here), sample(there)
        assert got == expected[0] and streamed == expected[1]
        assert any(stop is not None for _, _, stop, _ in got[:len(PROMPTS)])  # the stop strings did cut some rows
        assert all(s and s[0] == "" and s[-1] == text for s, (_, text, _, _) in zip(streamed, got))
    finally:
        there.close()


@pytest.mark.slow
def test_a_checkpoint_continues_the_replicas_sampling_stream(group, tmp_path):
    group.save(tmp_path)
    assert (tmp_path / RNG_FILE).is_file()
    expected = [r.response_ids for r in group.generate(requests(6))]
    other = make_group(seed=7, max_staleness=1)
    try:
        other.load(tmp_path)
        assert other.sampler.replica.weight_digests() == digests(group.policy.model)
        assert [r.response_ids for r in other.generate(requests(6))] == expected
        assert {r.weight_version for r in other.generate(requests(2))} == {group.weight_version}
    finally:
        other.close()


@pytest.mark.slow
def test_a_replica_that_dies_is_an_error_naming_the_group():
    group = make_group()
    try:
        group.generate(requests(1))
        os.kill(group.sampler.replica.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RolloutProcessError) as failure:
            group.generate(requests(1))
        assert time.monotonic() - started < 10
        first = str(failure.value).splitlines()[0]
        assert "rollout process of model group 'm'" in first and "exited with code -9" in first, first
        wrapped = ModelGroupError("m", "generate", failure.value)  # as every transport reports it
        assert "model group 'm' failed during generate" in str(wrapped) and "rollout process" in str(wrapped)
    finally:
        group.close()
    assert not alive(group.sampler.replica.pid)


PARENT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from tests.test_rollout_process import make_group
    group = make_group()
    group.sampler.replica.generator_state()  # started and ready
    print(group.sampler.replica.pid, group.sampler.replica.path, flush=True)
    if {mode!r} == "error":
        raise RuntimeError("the parent fails")
    if {mode!r} == "killed":
        time.sleep(60)
""")


@pytest.mark.slow  # two parents, each importing torch and starting a replica: ~20 s on two cores, minutes loaded
def test_the_replica_dies_with_its_parent(tmp_path):
    """No orphan: the parent exits on an error without closing the group (interpreter exit: the group's finalizer),
    or is SIGKILLed (the child's request pipe closes; a watchdog sees the parent gone). Run side by side."""
    parents = {}
    for mode in ("error", "killed"):
        script = tmp_path / f"{mode}.py"
        script.write_text(PARENT.format(repo=str(REPO), mode=mode))
        parents[mode] = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    started = {mode: parent.stdout.readline().split() for mode, parent in parents.items()}
    children = {mode: int(pid) for mode, (pid, _) in started.items()}
    assert alive(children["killed"])
    parents["killed"].kill()
    for mode, parent in parents.items():
        _, err = parent.communicate(timeout=120)
        assert parent.returncode == {"error": 1, "killed": -9}[mode], err
        assert mode != "error" or "the parent fails" in err
    deadline = time.monotonic() + 10
    while any(map(alive, children.values())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [mode for mode, pid in children.items() if alive(pid)] == []
    assert [path for _, path in started.values() if os.path.exists(path)] == []  # their shared weight files too


PIPELINED = ["algorithm.max_staleness=1", "models.listener_model.options.rollout_process=true"]
"""The listener samples in a rollout process, the speaker from its in-process rollout copy."""


@pytest.mark.slow  # two runs of 4 steps, a replica each
def test_a_pipelined_run_with_rollout_processes_keeps_its_bound_and_resumes_losslessly(tmp_path, monkeypatch):
    from tests.test_async_pipeline import Killed, record_and_kill_at_step_3
    from unimas.training.pipeline import PENDING

    trained, attempt = record_and_kill_at_step_3(monkeypatch)
    settings = [*PIPELINED, "trainer.steps=4", "trainer.save_every=2", "trainer.eval_every=0"]
    with pytest.raises(Killed):
        run("quickstart_separate.yaml", tmp_path / "run", settings)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert {json.loads(line)["step"] for line in (checkpoint / PENDING).read_text().splitlines()} == {2}
    assert (checkpoint / "listener_model" / RNG_FILE).is_file() and not (checkpoint / "speaker_model" / RNG_FILE).exists()
    attempt["n"] = 2
    records = run("quickstart_separate.yaml", tmp_path / "run", settings, resume=True)
    assert [r["step"] for r in records] == list(range(5))  # no step lost, none logged twice

    for group in ("speaker_model", "listener_model"):  # step 2's turns were sampled before any update: one old
        assert records[2][f"group/{group}/staleness_max"] == 1  # records[0]: the evaluation before step 1
        assert all(r[f"group/{group}/staleness_max"] <= 1 and r[f"group/{group}/stale_dropped"] == 0
                   for r in records[1:])
    assert all(0 <= r["group/listener_model/weight_sync_s"] < 5 for r in records[1:])
    assert not any("speaker_model/weight_sync_s" in key for r in records for key in r)  # no replica: no hand-over
    first = [t for t in trained if t[0] == 1]
    second = [t for t in trained if t[0] == 2]
    step_of = lambda episode: int(episode.split("-")[0][1:])  # noqa: E731
    # the saved rollouts of step 3 were trained after the resume token for token, with the versions they carried
    assert [t[1:] for t in second if step_of(t[1]) == 2] == [t[1:] for t in first if step_of(t[1]) == 2]
    history = [t[1:3] for t in first if step_of(t[1]) < 2] + [t[1:3] for t in second]
    assert len(history) == len(set(history)) and sorted({step_of(e) for e, _ in history}) == list(range(4))
    # step k's rollouts start once update k-2 is done and end before update k: versions k-1 or k
    assert all(max(0, step_of(t[1]) - 1) <= t[3] <= step_of(t[1]) for t in trained), sorted({(step_of(t[1]), t[3])
                                                                                             for t in trained})


@pytest.mark.slow  # a 3-step run with one replica
def test_max_staleness_0_with_a_rollout_process_samples_what_it_trains(tmp_path):
    """The synchronous loop with the replica on: every turn is fresh (staleness 0), versions count each update."""
    records = run("quickstart_separate.yaml", tmp_path / "run", ["models.listener_model.options.rollout_process=true"])
    assert [r["group/listener_model/weight_version"] for r in records[1:]] == [1.0, 2.0, 3.0]
    assert all(r["group/listener_model/staleness_max"] == 0 for r in records[1:])
    assert all(r["group/listener_model/rollout_logprob_diff"] < 1e-4 for r in records[1:])  # the trainer's weights


def test_the_option_is_off_by_default_and_checked():
    from pydantic import ValidationError

    from unimas.groups.torch import TorchOptions

    assert TorchOptions.model_validate({"tiny": {"alphabet": "ab"}}).rollout_process is False
    with pytest.raises(ValidationError):
        TorchOptions.model_validate({"tiny": {"alphabet": "ab"}, "rollout_process": "sometimes"})


@pytest.mark.slow  # a short run with one replica
def test_a_replica_killed_during_a_run_stops_it_with_one_line_naming_the_group(tmp_path, monkeypatch, capsys):
    from tests.async_golden import SETTINGS
    from tests.conftest import EXAMPLES
    from unimas.cli import main
    from unimas.groups.torch.rollout_replica import RolloutReplica

    sample, calls = RolloutReplica.sample, {"n": 0}

    def dying_sample(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:  # the child dies between two batches of step 2 (killed by the OOM killer, say)
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait()
        return sample(self, *args)

    monkeypatch.setattr(RolloutReplica, "sample", dying_sample)
    sets = sum((["--set", s] for s in [*SETTINGS, *PIPELINED]), [])
    started = time.monotonic()
    code = main(["train", str(EXAMPLES / "quickstart_separate.yaml"), "--run-dir", str(tmp_path / "run"), *sets])
    err = capsys.readouterr().err
    assert code == 1 and time.monotonic() - started < 300, err
    line = next(line for line in err.splitlines() if line.startswith("error:"))
    assert "model group 'listener_model' failed during step 2" in line and "generate" in line, err
    assert "rollout process of model group 'listener_model'" in line and "exited with code -9" in line, err
    assert "Traceback" not in err
