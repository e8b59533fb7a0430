"""The report's interactive charts, its header (config, how the run ended) and overlays of several runs.

Hand-written run directories (no training) hold two roles, a trajectory-level, a role-level and a
turn-level reward and workflow metrics; the chart data is checked in Python and the drawn page in
headless Chromium, where a script dispatches hover, legend clicks and a drag-to-zoom and records any
JavaScript error.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from unimas.cli import main
from unimas.config.loading import load_config
from unimas.errors import UserError
from unimas.output.run_end import RUN_END, describe_end, read_run_end
from unimas.report import OVERLAY_NAME, run_names, write_overlay, write_report
from unimas.report.charts import MAX_POINTS, chart_groups
from unimas.report.data import load_run
from unimas.report.html import header

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
CHROMIUM = Path("/usr/bin/chromium")
ROLES = ["solver", "verifier"]
CONFIG = {
    "name": "hand",
    "models": {"policy": {"backend": "torch"}},
    "roles": {role: {"model": "policy"} for role in ROLES},
    "rewards": [{"name": "exact_match", "level": "trajectory"}, {"name": "format", "level": "role"},
                {"name": "brevity", "level": "turn", "roles": ["solver"]}, {"name": "agreement"}],
    "trainer": {"steps": 4},
}


def _record(step: int, shift: float) -> dict:
    record = {"step": step, "reward/mean": 0.1 * step + shift, "reward/std": 0.1, "reward/clipped": 0.0,
              "workflow/rounds": 2.0 + step, "workflow/rounds/count": 8.0, "workflow/agree_rate": 0.5,
              "group/policy/policy_loss": 0.01 * step}
    for index, role in enumerate(ROLES):
        record |= {f"reward/exact_match/{role}": 0.1 * step + shift, f"reward/format/{role}": 0.2 * index + shift,
                   f"reward/agreement/{role}": 1.0 + index, f"role/{role}/turns": 1.0 + index,
                   f"role/{role}/reward_mean": 0.1 * step + index}
    return record | {"reward/brevity/solver": -0.1}


def _run(root: Path, shift: float = 0.0, end: dict | None = None, steps: int = 4) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    records = [{"step": 0, "eval/accuracy": 0.25, "eval/reward/exact_match": 0.25}]
    records += [_record(step, shift) for step in range(1, steps + 1)]
    records[-1] |= {"eval/accuracy": 0.5 + shift, "eval/reward/exact_match": 0.5 + shift, "eval/workflow/rounds": 7.0}
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if end is not None:
        (root / RUN_END).write_text(json.dumps({"planned_steps": 4, "ended_at": "2026-01-01T00:00:00Z", **end}))
    return root


FINISHED = {"status": "finished", "step": 4, "reason": "all 4 steps trained"}


@pytest.fixture
def hand_run(tmp_path: Path) -> Path:
    return _run(tmp_path / "hand", end=FINISHED)


def _group(groups: list[dict], group_id: str) -> dict[str, dict]:
    (group,) = [g for g in groups if g["id"] == group_id]
    return {chart["id"]: chart for chart in group["charts"]}


def _labels(chart: dict) -> list[str]:
    return [s["label"] for s in chart["series"]]


# -- chart data ------------------------------------------------------------------------------------


def test_each_reward_has_a_chart_with_one_series_per_role_and_a_trajectory_reward_once(hand_run):
    terms = _group(chart_groups([load_run(hand_run)]), "plot-reward-terms")
    assert list(terms) == ["term-exact_match", "term-format", "term-brevity", "term-agreement"]
    exact = terms["term-exact_match"]
    assert _labels(exact) == ["train (episode mean)", "eval"] and "trajectory level" in exact["title"]
    assert exact["series"][0]["points"] == [[s, pytest.approx(0.1 * s)] for s in range(1, 5)]
    assert exact["series"][1]["points"] == [[0, 0.25], [4, 0.5]]
    assert _labels(terms["term-format"]) == ROLES and "role level" in terms["term-format"]["title"]
    assert _labels(terms["term-brevity"]) == ["solver"]  # the roles a reward reaches, no more
    # Roles sharing a value stay apart: each series has its own colour and dash.
    styles = {(s["color"], tuple(s["dash"])) for s in terms["term-format"]["series"]}
    assert len(styles) == 2


def test_a_trajectory_reward_that_is_not_the_primary_one_is_its_mean_over_turns(hand_run):
    (train,) = _group(chart_groups([load_run(hand_run)]), "plot-reward-terms")["term-agreement"]["series"]
    assert train["label"] == "train (mean over turns)"
    # solver: value 1 over 1 turn, verifier: value 2 over 2 turns -> (1 + 4) / 3
    assert [v for _, v in train["points"]] == [pytest.approx(5 / 3)] * 4


def test_without_a_config_every_logged_reward_is_drawn_per_role(hand_run):
    (hand_run / "config.yaml").unlink()
    terms = _group(chart_groups([load_run(hand_run)]), "plot-reward-terms")
    assert set(terms) == {"term-exact_match", "term-format", "term-brevity", "term-agreement"}
    assert _labels(terms["term-exact_match"]) == ROLES  # level unknown: nothing is merged


@pytest.mark.slow
def test_every_workflow_metric_gets_a_chart_and_none_without_them(hand_run, tmp_path):
    workflow = _group(chart_groups([load_run(hand_run)]), "plot-workflow")
    assert list(workflow) == ["workflow-workflow/rounds", "workflow-workflow/agree_rate"]  # no chart of counts
    rounds = workflow["workflow-workflow/rounds"]
    assert _labels(rounds) == ["train", "eval"] and rounds["series"][1]["points"] == [[4, 7.0]]
    assert rounds["series"][0]["points"][0] == [1, 3.0]
    page = write_report(hand_run).read_text(encoding="utf-8")
    assert 'id="workflow-metrics"' in page and 'id="plot-workflow"' in page

    plain = _run(tmp_path / "plain", end=FINISHED)
    lines = [json.loads(line) for line in (plain / "metrics.jsonl").read_text().splitlines()]
    (plain / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items()
                                                             if "workflow/" not in k}) + "\n" for r in lines))
    assert not [g for g in chart_groups([load_run(plain)]) if g["id"] == "plot-workflow"]
    assert 'id="workflow-metrics"' not in write_report(plain).read_text(encoding="utf-8")


def test_values_a_chart_cannot_take_are_counted_and_long_runs_thinned(hand_run):
    with open(hand_run / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"step": 5, "workflow/rounds": "many"}) + "\n")
        handle.write('{"step": 6, "workflow/rounds": NaN}\n')
        for step in range(7, 7 + 2 * MAX_POINTS):
            handle.write(json.dumps({"step": step, "workflow/agree_rate": step}) + "\n")
    workflow = _group(chart_groups([load_run(hand_run)]), "plot-workflow")
    assert workflow["workflow-workflow/rounds"]["left_out"] == 2
    points = workflow["workflow-workflow/agree_rate"]["series"][0]["points"]
    assert len(points) == MAX_POINTS and points[0][0] == 1 and points[-1][0] == 6 + 2 * MAX_POINTS


def test_an_overlay_has_one_series_per_run_and_line(tmp_path):
    runs = [load_run(_run(tmp_path / name, shift=shift)) for name, shift in (("a", 0.0), ("b", 0.5))]
    for run, name in zip(runs, ("a", "b")):
        run.name = name
    groups = chart_groups(runs)
    agree = _group(groups, "plot-workflow")["workflow-workflow/agree_rate"]
    assert _labels(agree) == ["a", "b"] and len({s["color"] for s in agree["series"]}) == 2
    fmt = _group(groups, "plot-reward-terms")["term-format"]
    assert _labels(fmt) == ["a · solver", "a · verifier", "b · solver", "b · verifier"]
    assert [s["points"][0][1] for s in fmt["series"]] == [0.0, 0.2, 0.5, pytest.approx(0.7)]


def test_run_names_come_from_directories_and_stay_distinct(tmp_path):
    assert run_names([tmp_path / "x" / "seed0", tmp_path / "y" / "seed0", tmp_path / "z"]) == \
        ["x/seed0", "y/seed0", "z"]
    assert run_names([tmp_path / "a", tmp_path / "a"]) == [f"{tmp_path.name}/a", f"{tmp_path.name}/a (2)"]


# -- header: config and how the run ended ----------------------------------------------------------


def test_the_header_folds_in_the_config_and_says_the_run_finished(hand_run):
    page = header(load_run(hand_run))
    assert "ended: <b>finished</b>" in page and "incomplete" not in page
    config = re.search(r'<details class="run-config"><summary>config.yaml</summary><pre>(.*?)</pre>', page, re.S)
    assert config and yaml.safe_load(html.unescape(config.group(1))) == CONFIG


@pytest.mark.parametrize("end, shown, banner", [
    ({"status": "stopped", "step": 2, "reason": "trainer.stop_when: eval/accuracy = 1 (>= 1)"},
     "stopped early at step 2 of 4 by trainer.stop_when: eval/accuracy = 1 (&gt;= 1)", False),
    ({"status": "crashed", "step": 2, "reason": "RunError: model group policy failed"},
     "crashed at step 2 of 4: RunError: model group policy failed", False),
    ({"status": "interrupted", "step": 2, "reason": "Ctrl-C (KeyboardInterrupt)"},
     "interrupted at step 2 of 4: Ctrl-C (KeyboardInterrupt)", False),
    (None, "incomplete: metrics stop at step 2 of 4", True),
    ({**FINISHED, "step": 1}, "incomplete: metrics stop at step 2 of 4", True),  # a resume outran the record
])
def test_a_run_that_ended_early_says_how(tmp_path, end, shown, banner):
    page = header(load_run(_run(tmp_path / "run", end=end, steps=2)))
    assert shown in page
    assert ("incomplete" in page) == banner


def test_a_damaged_end_record_is_named_and_the_run_reads_as_unfinished(hand_run, capsys):
    (hand_run / RUN_END).write_text('{"status": "exploded"}')
    assert main(["report", str(hand_run)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {hand_run / RUN_END}: does not match the expected contents" in err and "Traceback" not in err
    assert 'id="skipped"' in (hand_run / "report.html").read_text(encoding="utf-8")


def test_the_end_record_says_finished_stopped_crashed_or_interrupted():
    config = load_config(QUICKSTART, ["trainer.steps=10", "trainer.stop_at_accuracy=0.9"])
    assert describe_end(config, [{"step": 10, "eval/accuracy": 0.95}], None, 10).status == "finished"
    stopped = describe_end(config, [{"step": 4, "eval/accuracy": 0.95}], None, 4)
    assert (stopped.status, stopped.step) == ("stopped", 4)
    assert stopped.reason == "trainer.stop_at_accuracy: eval/accuracy = 0.95 (>= 0.9)"
    crashed = describe_end(config, [], ValueError("bad value\nmore"), 3)
    assert (crashed.status, crashed.step, crashed.reason) == ("crashed", 3, "ValueError: bad value")
    assert describe_end(config, [], KeyboardInterrupt(), 3).status == "interrupted"


@pytest.mark.slow  # one real (short) training run: ~25 s on a loaded 2-core machine
def test_a_stopped_training_run_records_why_and_its_report_has_no_incomplete_banner(tmp_path):
    run = tmp_path / "run"
    stop = "trainer.stop_when={metric: episode/turns, at_least: 0}"
    args = ["--set", "trainer.steps=50", "--set", "trainer.tasks_per_step=2", "--set", "trainer.eval_size=2", "--set",
            stop]
    assert main(["train", str(QUICKSTART), "--run-dir", str(run), *args]) == 0
    end = read_run_end(run)
    assert (end.status, end.step, end.planned_steps) == ("stopped", 1, 50)
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "stopped early at step 1 of 50 by trainer.stop_when: episode/turns" in page and "incomplete" not in page


# -- the command -------------------------------------------------------------------------------------


def test_report_of_several_runs_writes_one_overlay(tmp_path, capsys):
    a, b = _run(tmp_path / "a", end=FINISHED), _run(tmp_path / "b", shift=0.5)
    out = tmp_path / "both.html"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out}"
    page = out.read_text(encoding="utf-8")
    assert '<div class="run-facts" data-run="a">' in page and '<div class="run-facts" data-run="b">' in page
    assert not (a / "report.html").exists() and not (a / "plots").exists()
    assert main(["report", str(a), str(b)]) == 0
    assert (a / OVERLAY_NAME).is_file() and not (a / "report.html").exists()


@pytest.mark.parametrize("bad", ["missing", "empty dir", "a file"])
def test_report_refuses_a_directory_that_is_not_a_run(tmp_path, capsys, bad):
    good = _run(tmp_path / "good", end=FINISHED)
    target = tmp_path / "other"
    if bad == "empty dir":
        target.mkdir()
    elif bad == "a file":
        target.write_text("x")
    assert main(["report", str(good), str(target), "--out", str(tmp_path / "o.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {target}: no metrics.jsonl here") and "Traceback" not in err
    assert not (tmp_path / "o.html").exists()


def test_report_out_into_a_missing_folder_exits_2(hand_run, tmp_path, capsys):
    assert main(["report", str(hand_run), "--out", str(tmp_path / "nope" / "r.html")]) == 2
    assert "--out" in capsys.readouterr().err


def test_write_overlay_refuses_before_writing(tmp_path):
    with pytest.raises(UserError, match="no metrics.jsonl"):
        write_overlay([_run(tmp_path / "a"), tmp_path / "nothing"], tmp_path / "o.html")
    assert not (tmp_path / "o.html").exists()


# -- in the browser ----------------------------------------------------------------------------------

CATCH = "<script>window.__errors = []; addEventListener('error', (e) => __errors.push(String(e.message)));</script>"
INTERACT = """<script>
setTimeout(async () => {
  const out = { errors: window.__errors, charts: [] };
  const settle = () => new Promise((done) => setTimeout(done, 0));  // uPlot applies a zoom in a microtask
  try {
    for (const fig of document.querySelectorAll("figure.chart")) {
      const over = fig.querySelector(".u-over");
      if (!over) continue;
      const r = over.getBoundingClientRect();
      // movementX: uPlot ignores a move without movement while a drag is on
      const mouse = (type, fx, target) => (target || over).dispatchEvent(new MouseEvent(type,
        { clientX: r.left + fx * r.width, clientY: r.top + r.height / 2, movementX: 1, bubbles: true, view: window }));
      const legend = () => [...fig.querySelectorAll(".u-legend tr.u-series .u-value")].map((v) => v.textContent);
      const idle = legend();
      mouse("mouseenter", 0.02); mouse("mousemove", 0.02);
      const values = legend();
      const label = fig.querySelector(".u-legend tr.u-series:nth-child(2) th");
      label.dispatchEvent(new MouseEvent("click", { bubbles: true }));
      const hidden = fig.querySelector(".u-legend tr.u-series:nth-child(2)").classList.contains("u-off");
      const before = fig.dataset.xRange;
      mouse("mousedown", 0.05); mouse("mousemove", 0.5); mouse("mouseup", 0.5, document);
      await settle();
      mouse("mouseleave", 0.5);  // the cursor leaves, here and in the charts that followed it
      out.charts.push({ id: fig.dataset.chart, series: Number(fig.dataset.series), idle, values, hidden, before,
                        after: fig.dataset.xRange,
                        labels: [...fig.querySelectorAll(".u-legend .u-label")].map((l) => l.textContent) });
    }
  } catch (error) { out.errors.push(String(error)); }
  const pre = document.createElement("pre");
  pre.id = "self-test";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 200);
</script>"""


def browse(page: Path, tmp_path: Path) -> tuple[str, dict]:
    """The DOM after the page ran in headless Chromium with the interaction script, and what it recorded."""
    probe = tmp_path / f"probe-{page.stem}.html"
    text = page.read_text(encoding="utf-8")
    probe.write_text(text.replace("<head>", "<head>" + CATCH, 1).replace("</body>", INTERACT + "</body>", 1),
                     encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--window-size=1300,1000",
             "--dump-dom"]
    dom = subprocess.run([str(CHROMIUM), *flags, probe.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    found = re.search(r'<pre id="self-test">(.*?)</pre>', dom, re.S)
    assert found, "the interaction script did not finish"
    return dom, json.loads(html.unescape(found.group(1)))


needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the Debian `chromium` package")


@pytest.mark.slow
@needs_chromium
def test_charts_draw_and_answer_hover_toggle_and_zoom_without_errors(hand_run, tmp_path):
    page = write_report(hand_run)
    dom, probe = browse(page, tmp_path)
    assert probe["errors"] == [] and "data-chart-errors" not in dom
    charts = {c["id"]: c for c in probe["charts"]}
    expected = {c["id"] for g in chart_groups([load_run(hand_run)]) for c in g["charts"]}
    assert set(charts) == expected and len(re.findall(r"<canvas", dom)) == len(expected)
    assert f'data-charts="{len(expected)}"' in dom
    assert {"term-exact_match", "term-format", "term-brevity", "workflow-workflow/rounds"} <= set(charts)
    assert charts["term-format"]["labels"] == ["step", *ROLES]
    assert re.search(r'<section id="workflow-metrics">.*?data-chart="workflow-workflow/rounds"', dom, re.S)
    for chart in probe["charts"]:
        assert chart["hidden"], f"{chart['id']}: a legend click did not hide the series"
        if chart["id"].startswith("distribution-"):
            continue
        # Idle, the legend shows the last step; hovering the left edge shows the first step's values.
        assert chart["idle"][0] == "4" and any(v != "–" for v in chart["idle"][1:]), chart
        assert chart["values"][0] in ("0", "1") and any(v != "–" for v in chart["values"][1:]), chart
        assert chart["before"] != chart["after"], f"{chart['id']}: dragging did not zoom"


@needs_chromium
def test_the_overlay_page_draws_one_series_per_run(tmp_path):
    a, b = _run(tmp_path / "a", end=FINISHED), _run(tmp_path / "b", shift=0.5)
    dom, probe = browse(write_overlay([a, b], tmp_path / "both.html"), tmp_path)
    assert probe["errors"] == []
    charts = {c["id"]: c for c in probe["charts"]}
    assert charts["workflow-workflow/agree_rate"]["labels"] == ["step", "a", "b"]
    assert charts["term-exact_match"]["labels"] == ["step", "a · train (episode mean)", "a · eval",
                                                    "b · train (episode mean)", "b · eval"]
    assert re.search(r'<select id="pick-run">\s*<option value="0">a</option><option value="1">b</option>', dom)


@pytest.mark.slow  # starts the quickstart's model for the step-0 evaluation: ~15-20 s on a loaded machine
def test_a_crash_mid_training_is_recorded_with_its_step_and_error(tmp_path, monkeypatch):
    import unimas
    from unimas.training.trainer import Trainer

    async def boom(self, step):
        raise RuntimeError("the update blew up\ndetails")

    monkeypatch.setattr(Trainer, "train_step", boom)
    with pytest.raises(RuntimeError, match="blew up"):
        unimas.train(QUICKSTART, run_dir=tmp_path / "run", trainer={"steps": 3, "eval_size": 2},
                     logging={"report": False})
    end = read_run_end(tmp_path / "run")
    assert (end.status, end.step, end.reason) == ("crashed", 0, "RuntimeError: the update blew up")
    assert main(["report", str(tmp_path / "run")]) == 0
    assert "crashed at step 0 of 3: RuntimeError: the update blew up" in \
        (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
