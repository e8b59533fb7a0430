"""Observability: the HTML report from a real short CPU run (checked in headless Chromium),
the report on a killed run, episode selection, console progress and the optional loggers."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unimas.config.loading import load_config
from unimas.errors import UserError
from unimas.output.console import ConsoleLogger
from unimas.output.loggers import build_loggers
from unimas.output.metrics import read_metrics
from unimas.output.rundir import RunDir
from unimas.report.data import select_episodes, slim_episode
from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CLI = [sys.executable, "-c", "import sys; from unimas.cli import main; sys.exit(main(sys.argv[1:]))"]


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
             "--no-first-run", "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp}",
             "--virtual-time-budget=3000"]
    return subprocess.run([str(CHROMIUM), *flags, *args], capture_output=True, text=True, timeout=120, check=True)


# -- the report of a real run ----------------------------------------------------------------------


def test_train_writes_a_self_contained_report(real_run):
    page = (real_run / "report.html").read_text()
    for stem in ("rewards", "reward_distribution", "groups", "roles", "episodes"):
        png = (real_run / "plots" / f"{stem}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000, stem
        assert f'id="plot-{stem}"' in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "the report must not load anything remote"
    assert "<link" not in page and "<img" not in page  # charts are drawn in the page; the PNGs are copies
    assert "finished" in page and "incomplete" not in page


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the Debian `chromium` package at /usr/bin/chromium")
def test_viewer_in_headless_chromium_shows_every_role_and_the_reward_charts(real_run, tmp_path):
    url = (real_run / "report.html").as_uri()
    dom = chromium("--dump-dom", url, tmp=tmp_path / "profile-dom").stdout
    graph = re.search(r'<svg id="episode-graph".*?</svg>', dom, re.S)
    assert graph, "the trajectory viewer drew no graph"
    drawn_roles = set(re.findall(r'<g class="node turn[^"]*"[^>]*data-role="([^"]+)"', graph.group(0)))
    assert drawn_roles == set(load_config(real_run / "config.yaml").roles)
    assert "reward " in graph.group(0) and "adv " in graph.group(0)
    assert re.search(r'<details data-node-id="speaker#0"', dom), "node texts are listed under the graph"
    rewards = re.search(r'<div class="chart-group" id="plot-rewards">.*?</figure>', dom, re.S)
    assert rewards and 'data-chart="reward-train"' in rewards.group(0) and "<canvas" in rewards.group(0)
    assert re.search(r'data-charts="(\d+)"', dom) and 'data-chart-errors' not in dom

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-screenshot.png"
    shot.unlink(missing_ok=True)
    chromium(f"--screenshot={shot}", "--window-size=1400,2000", url, tmp=tmp_path / "profile-shot")
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 50_000
    shutil.copy(real_run / "report.html", ARTIFACTS / "report.html")


@pytest.mark.slow
def test_report_survives_a_killed_run(tmp_path):
    run = tmp_path / "killed"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([*CLI, "train", str(QUICKSTART), "--run-dir", str(run), "--set", "trainer.steps=1000",
                             "--set", "trainer.tasks_per_step=4"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (run / "metrics.jsonl").exists() or len(read_metrics(run / "metrics.jsonl")) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "training did not get going"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with open(run / "metrics.jsonl", "a") as handle:  # what a kill during a write leaves behind
        handle.write('{"step": 99, "reward/me')
    with open(run / "trajectories" / "train.jsonl", "a") as handle:
        handle.write('{"episode_id": "torn", "nodes": [{"id"')

    result = subprocess.run([*CLI, "report", str(run)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    page = (run / "report.html").read_text()
    assert "incomplete: metrics stop at step" in page
    assert (run / "plots" / "rewards.png").stat().st_size > 10_000


# -- episode selection and layout ------------------------------------------------------------------


def _episode(step: int, index: int, reward: float, error: str | None = None, tool_error: str | None = None) -> dict:
    traj = GraphTrajectory(f"s{step}-{index}", f"t{index}", outcome={"_step": step}, error=error,
                           rewards={"exact_match": reward})
    first = traj.add_node(TurnNode("solver#0", "solver", "m", "p", text="1", reward=reward, advantage=0.5))
    tool = traj.add_node(ToolNode("tool:calc#0", "calc", {"e": "1"}, error=tool_error), [first.id])
    traj.add_node(TurnNode("verifier#0", "verifier", "m", "p", text="x" * 5000, reward=reward),
                  [first.id, tool.id])
    return slim_episode(traj.to_dict(), "exact_match")


def test_episodes_are_laid_out_by_depth_and_slimmed():
    episode = _episode(3, 0, 1.0, tool_error="ZeroDivisionError")
    positions = {n["id"]: (n["layer"], n["slot"]) for n in episode["nodes"]}
    assert positions == {"solver#0": (0, 0), "tool:calc#0": (1, 0), "verifier#0": (2, 0)}
    assert episode["step"] == 3 and episode["score"] == 1.0 and episode["failed"]  # the tool errored
    verifier = next(n for n in episode["nodes"] if n["id"] == "verifier#0")
    assert len(verifier["text"]) < 2100 and "more characters" in verifier["text"]
    assert "logprobs" not in verifier and "response_ids" not in verifier


def test_selection_keeps_best_worst_and_failed_per_step():
    episodes = [_episode(1, i, i / 20, error="boom" if i == 10 else None) for i in range(20)]
    kept = {e["id"] for e in select_episodes(episodes)}
    assert {"s1-19", "s1-0", "s1-10"} <= kept
    assert len(kept) <= 12


# -- live progress and loggers ---------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_is_quiet_off_a_terminal(real_run):
    config = load_config(real_run / "config.yaml")
    records = read_metrics(real_run / "metrics.jsonl")
    stream = io.StringIO()
    logger = ConsoleLogger(config, RunDir(real_run), stream=stream)
    for record in records:
        logger.log(record)
    logger.close()
    lines = stream.getvalue().splitlines()
    evals = [r for r in records if "eval/accuracy" in r]
    assert len(lines) == len(evals) + 1
    assert lines[0].startswith("step    0/3") and lines[-1].startswith("done: 3/3 steps")
    assert "\x1b[" not in stream.getvalue()


def test_console_on_a_terminal_shows_progress_and_roles(real_run):
    config = load_config(real_run / "config.yaml")
    stream = _Terminal()
    logger = ConsoleLogger(config, RunDir(real_run), stream=stream)
    for record in read_metrics(real_run / "metrics.jsonl"):
        logger.log(record)
    logger.close()
    text = stream.getvalue()
    assert "3/3" in text and "ETA" in text and "reward" in text
    for column in ("speaker", "listener", "adv std", "KL", "entropy", "len"):
        assert column in text


def test_console_in_eval_mode_prints_the_result_once(real_run):
    config = load_config(real_run / "config.yaml")
    stream = io.StringIO()
    logger = ConsoleLogger(config, RunDir(real_run), stream=stream, mode="eval")
    logger.log(read_metrics(real_run / "metrics.jsonl")[-1])
    logger.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "eval reward (exact_match)" in lines[0] and lines[1].startswith("evaluation done")


def test_tensorboard_logger_writes_every_metric(real_run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = load_config(real_run / "config.yaml", ["logging.tensorboard=true", "logging.console=false"])
    loggers = build_loggers(config, RunDir(tmp_path))
    records = read_metrics(real_run / "metrics.jsonl")
    for record in records:
        loggers.log(record)
    loggers.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {k for r in records for k in r if k != "step"}


def test_wandb_without_the_package_is_a_config_error(real_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails as if wandb were not installed
    config = load_config(real_run / "config.yaml", ["logging.wandb={project: x}"])
    with pytest.raises(UserError, match="logging.wandb"):
        build_loggers(config, RunDir(tmp_path))


def test_metrics_records_are_json_lines(real_run):
    lines = (real_run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]
