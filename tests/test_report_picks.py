"""Which episodes the report's viewer offers as a step's best and worst (unimas/report/data.py, viewer.js).

An episode that ended in an error is scored 0 by rule (credit never grades it); ranked like a graded 0 it
outranks every graded episode of a step whose rewards are negative, and the viewer's "best" showed a crash.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from unimas.report import write_overlay
from unimas.report.data import PER_OUTCOME, select_episodes, slim_episode, step_picks
from unimas.trajectory import GraphTrajectory, TurnNode

CHROMIUM = Path("/usr/bin/chromium")


def _trajectory(index: int, reward: float, error: str | None = None) -> dict:
    traj = GraphTrajectory(f"e{index}", f"t{index}", outcome={}, error=error, rewards={"f1_delta": reward})
    traj.add_node(TurnNode("solver#0", "solver", "m", "p", text="x", reward=reward))
    traj.step = 1
    return traj.to_dict()


def _episode(index: int, reward: float, error: str | None = None) -> dict:
    return slim_episode(_trajectory(index, reward, error), "f1_delta")


def test_a_crashed_episode_is_ungraded_and_never_the_best_or_the_worst():
    graded = [_episode(i, -1.0 + i / 10) for i in range(10)]  # rewards -1.0 .. -0.1: the best is e9
    crashed = [_episode(100 + i, 0.0, error="TimeoutError: the episode ran out of time") for i in range(PER_OUTCOME)]
    assert {e["score"] for e in crashed} == {None}
    kept = step_picks(crashed + graded)
    graded_kept = sorted((e for e in kept if e["score"] is not None), key=lambda e: -e["score"])
    assert graded_kept[0]["id"] == "e9" and graded_kept[-1]["id"] == "e0"
    assert {e["id"] for e in crashed} <= {e["id"] for e in kept}  # still shown, under "failed"


def test_an_episode_nothing_scored_is_ungraded_not_zero():
    traj = GraphTrajectory("e", "t", outcome={})
    traj.add_node(TurnNode("solver#0", "solver", "m", "p", text="x"))
    traj.step = 1
    assert slim_episode(traj.to_dict(), None)["score"] is None


def test_selection_over_many_steps_keeps_each_steps_true_best():
    episodes = [_episode(i, -1.0 + i / 40) for i in range(40)]
    episodes += [_episode(200 + i, 0.0, error="RuntimeError: boom") for i in range(2 * PER_OUTCOME)]
    kept = {e["id"] for e in select_episodes(episodes)}
    assert "e39" in kept and "e0" in kept


def _run(root: Path) -> Path:
    """A hand-written run: one step whose graded rewards are all negative, and two crashed episodes (0 by rule)."""
    (root / "trajectories").mkdir(parents=True)
    (root / "config.yaml").write_text("name: picks\nmodels:\n  policy: {backend: torch}\nroles:\n"
                                      "  solver: {model: policy}\nrewards:\n  - {name: f1_delta, level: trajectory}\n"
                                      "trainer: {steps: 1}\n")
    (root / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": -0.5}) + "\n")
    episodes = [_trajectory(100, 0.0, "RuntimeError: boom"), *(_trajectory(i, -1.0 + i / 10) for i in range(5)),
                _trajectory(101, 0.0, "RuntimeError: boom")]
    (root / "trajectories" / "train.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return root


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the Debian `chromium` package at /usr/bin/chromium")
def test_the_overlay_viewer_opens_on_the_best_graded_episode(tmp_path):
    page = write_overlay([_run(tmp_path / "a"), _run(tmp_path / "b")])
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom"]
    dom = subprocess.run([str(CHROMIUM), *flags, page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert re.search(r'<svg id="episode-graph"[^>]*data-episode="e4"', dom), "the best graded episode (-0.6)"
    options = re.findall(r'<option value="\d+">(e\d+)  task', dom)
    assert options[:5] == ["e4", "e3", "e2", "e1", "e0"] and set(options[5:]) == {"e100", "e101"}
