"""Hostile agent programs and hostile run directories: each case is one that once hung, crashed or did harm.

An agent program's last stdout line is the only thing of it the trainer
parses: JSON too deep to read must fail its episode saying so. A run
directory may come from anyone: ``unimas report`` must not hang on a FIFO
or ``/dev/zero`` planted where a file belongs, must not crash on a reward
nested a thousand levels deep or a role name matplotlib would read as TeX,
must stay quick with thousands of role names and small with a long
trajectory file, and must never write through a symlink planted where it
writes its page or its plots.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from unimas.errors import UserError
from unimas.gateway.agent import AgentFailed, run_command
from unimas.gateway.confine import confinement
from unimas.report import plots, write_report
from unimas.report.data import PER_OUTCOME, load_run, select_episodes, slim_episode

TRAIN = "trajectories/train.jsonl"


def outcome_of(last_line: str) -> dict:
    """The outcome of an agent whose stdout ends with the bytes the Python expression ``last_line`` makes,
    confined as in a run (the expression, not its value, keeps the command line short)."""
    source = f"import sys; sys.stdin.read(); sys.stdout.buffer.write({last_line})"
    return asyncio.run(run_command([sys.executable, "-c", source], {}, {}, 30, confinement()))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("last_line,reason", [
    ("""b'{"a":' * 100_000 + b'1' + b'}' * 100_000 + b'\\n'""", "nested too deeply"),
    ("""b'{"a":' + b'[' * 100_000 + b']' * 100_000 + b'}'""", "nested too deeply"),
    ("""b'{"answer": ' + b'9' * 5000 + b'}\\n'""", "Exceeds the limit (4300 digits) for integer string conversion"),
])
def test_an_outcome_python_cannot_read_fails_its_episode_naming_why(last_line, reason):
    """A RecursionError is not a ValueError: it used to escape as a bare "maximum recursion depth exceeded",
    and a 5000-digit integer was called "not a JSON object" although the line is one."""
    with pytest.raises(AgentFailed, match="the agent's last line of stdout") as failed:
        outcome_of(last_line)
    assert reason in str(failed.value)


# -- hostile run directories ---------------------------------------------------------------------------------------

def episode(rewards: object = None, role: str = "a") -> dict:
    return {"episode_id": "e0", "task_id": "t0", "task": {"id": "q"}, "outcome": {}, "error": None,
            "rewards": {"exact_match": 1.0} if rewards is None else rewards, "started": 0.0, "ended": 1.0,
            "step": 1, "nodes": [{"id": f"{role}#0", "kind": "turn", "role": role, "text": "hi", "reward": 1.0}],
            "edges": []}


def small_run(root: Path, roles: tuple[str, ...] = ("a",), records: int = 2) -> Path:
    """A run directory as a training writes it, in miniature: metrics, config, one training episode."""
    root.mkdir()
    (root / "config.yaml").write_text(json.dumps({
        "name": "small", "models": {"m": {"backend": "torch"}}, "roles": {r: {"model": "m"} for r in roles},
        "rewards": [{"name": "exact_match"}], "trainer": {"steps": records}}))
    (root / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "reward/mean": 0.5, **{f"role/{r}/reward_mean": 0.5 for r in roles}}) + "\n"
        for step in range(1, records + 1)))
    (root / "trajectories").mkdir()
    (root / TRAIN).write_text(json.dumps(episode(role=roles[0])) + "\n")
    return root


def plant(path: Path, kind: str) -> None:
    """Put a FIFO or a symlink to /dev/zero where the run directory has a file."""
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("name", [TRAIN, "config.yaml"])
def test_a_pipe_or_a_device_in_place_of_a_run_file_is_skipped_not_read_forever(name, kind, tmp_path):
    """Opening a FIFO waits for a writer that never comes; /dev/zero has no newline to end a line at."""
    run = small_run(tmp_path / "run")
    plant(run / name, kind)
    loaded = load_run(run)
    assert [(item.file, item.why) for item in loaded.skipped] == [
        (name, "cannot be read (not a regular file (a pipe or a device could be read without end)); "
               + ("its episodes are not shown" if name == TRAIN else "ignored"))]
    assert [r["step"] for r in loaded.records] == [1, 2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_pipe_or_a_device_as_metrics_is_refused_naming_it(kind, tmp_path):
    run = small_run(tmp_path / "run")
    plant(run / "metrics.jsonl", kind)
    with pytest.raises(UserError, match="metrics.jsonl: cannot be read \\(not a regular file"):
        load_run(run)


def nested(depth: int) -> object:
    value: object = 1.0
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.timeout(60)
def test_a_deeply_nested_reward_is_shown_as_text_and_the_page_is_written(tmp_path, monkeypatch):
    """The viewer's rewards were copied as they were; 900 levels (which json.loads still reads) then exhausted
    the recursion of the page's own encoding and the report ended in a traceback."""
    monkeypatch.setattr(plots, "PLOTS", {})  # the page is what failed; no PNGs needed
    run = small_run(tmp_path / "run")
    rewards = {"exact_match": 1.0, "per_role": {"a": float("nan")}, "deep": nested(900), "big": 10 ** 400}
    (run / TRAIN).write_text(json.dumps(episode(rewards)) + "\n")
    page = write_report(run).read_text()
    [shown] = load_run(run).episodes["train"]
    assert shown["rewards"]["exact_match"] == 1.0 and shown["rewards"]["per_role"] == {"a": None}
    deep = shown["rewards"]["deep"]["a"]  # the second level, and below it text
    assert shown["rewards"]["big"] is None and deep.startswith('{"a": {"a": ') and deep.endswith("more characters]")
    assert 'id="report-data"' in page


def only_plots(monkeypatch, *stems: str) -> None:
    """Draw only these PNGs (each costs about a second of matplotlib)."""
    monkeypatch.setattr(plots, "PLOTS", {stem: plots.PLOTS[stem] for stem in stems})


@pytest.mark.timeout(60)
def test_a_role_name_with_dollar_signs_is_drawn_as_text(tmp_path, monkeypatch):
    """matplotlib reads "$...$" in a title or a legend label as TeX, and an invalid formula raised."""
    only_plots(monkeypatch, "rewards", "reward_distribution")
    run = small_run(tmp_path / "run", roles=("a$\\frac{1}{$b", "$\\undefined$"))
    write_report(run)
    assert (run / "plots/rewards.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.timeout(60)
def test_thousands_of_roles_draw_a_bounded_figure(tmp_path, monkeypatch):
    """A panel per role took minutes (and gigabytes of pixels) for the 2000 roles a run directory may name."""
    only_plots(monkeypatch, "reward_distribution", "roles")
    run = small_run(tmp_path / "run", roles=tuple(f"r{i}" for i in range(2000)), records=1)
    started = time.monotonic()
    write_report(run)
    assert time.monotonic() - started < 30
    assert len(load_run(run).roles) == 2000  # the page still has them all


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,target", [("report.html", "inside"), ("plots/rewards.png", "inside"),
                                         ("plots/rewards.png", "outside")])
def test_the_report_replaces_a_planted_symlink_and_never_writes_through_it(name, target, tmp_path, monkeypatch):
    """A symlink at the page or a plot's path led the report to overwrite the run's metrics.jsonl, or any
    file of the user's outside the run directory, with HTML or PNG bytes. (A report.html leading outside
    was already refused by ``RunDir.owned``; plots/ was checked, the files in it were not.)"""
    only_plots(monkeypatch, "rewards")
    run = small_run(tmp_path / "run")
    victim = run / "metrics.jsonl" if target == "inside" else tmp_path / "precious.txt"
    if target == "outside":
        victim.write_text("precious\n")
    kept = victim.read_bytes()
    (run / "plots").mkdir()
    (run / name).symlink_to(victim)
    write_report(run)
    assert not (run / name).is_symlink() and (run / name).stat().st_size > 0
    assert victim.read_bytes() == kept


@pytest.mark.timeout(60)
def test_a_fifo_as_the_page_is_replaced_not_waited_on(tmp_path, monkeypatch):
    only_plots(monkeypatch)
    run = small_run(tmp_path / "run")
    os.mkfifo(run / "report.html")
    assert write_report(run).read_text().startswith("<!")
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl", "plots", "report.html",
                                                     "trajectories"]  # no temporary file left behind


@pytest.mark.timeout(60)
def test_a_long_trajectory_file_costs_the_memory_of_the_episodes_shown(tmp_path):
    """Every slimmed episode was kept until the selection at the end: a 2 GB file of long episodes took
    2.5 GB. Now each step's candidates are cut back as they come, and the same episodes are chosen."""
    run = small_run(tmp_path / "run")
    lines = []
    for index in range(3000):
        one = episode(rewards={"exact_match": (index * 7919 % 1000) / 1000})
        one.update(step=1 + index % 3, episode_id=f"e{index}", error="boom" if index % 5 == 0 else None)
        one["nodes"][0]["text"] = f"{index} " + "x" * 2000
        lines.append(json.dumps(one) + "\n")
    (run / TRAIN).write_text("".join(lines))
    tracemalloc.start()
    try:
        shown = load_run(run).episodes["train"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    everything = select_episodes([slim_episode(json.loads(line), "exact_match") for line in lines])
    assert [e["id"] for e in shown] == [e["id"] for e in everything] and len(shown) <= 3 * 3 * PER_OUTCOME
    assert peak < 4 << 20, f"{peak / 2**20:.0f} MiB to show {len(shown)} episodes"  # all 3000 kept: 17 MiB


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_resuming_a_run_whose_metrics_are_a_pipe_or_a_device_exits_2_naming_it(kind, tmp_path, capsys):
    """On resume the trainer appends to metrics.jsonl and reads it to see whether the run already ended; a FIFO
    there blocked the resume for good. Now it is refused by its kind, as a user error."""
    from tests.conftest import EXAMPLES
    from unimas.cli import main

    run = tmp_path / "run"
    quick = ["--set", "trainer.eval_every=0", "--set", "logging.report=false", "--set", "trainer.save_every=1"]
    assert main(["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(run), "--set", "trainer.steps=1",
                 *quick]) == 0
    plant(run / "metrics.jsonl", kind)
    code = main(["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(run), "--resume",
                 "--set", "trainer.steps=2", *quick])
    err = capsys.readouterr().err
    assert code == 2 and "metrics.jsonl" in err and "Traceback" not in err
    # a link to /dev/zero is refused as outside the run directory; a FIFO in it, by its kind
    assert ("not a regular file" if kind == "fifo" else "outside") in err
