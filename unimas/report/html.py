"""Assemble report.html: one file that opens anywhere, offline.

CSS, JavaScript (the vendored uPlot chart library included), the chart data
and the episode data (JSON) are all inlined into ``viewer.html``, so the
report can be mailed, archived or opened from a CI artifact without a server
or network access.
"""

from __future__ import annotations

import html
import json
import math
import re
from importlib import resources
from typing import Any

from unimas.report.charts import chart_groups
from unimas.report.data import GroupMapping, RunData


def _asset(name: str) -> str:
    return resources.files("unimas.report").joinpath(name).read_text(encoding="utf-8")


def _number(value: Any) -> str:
    """A metric value as short text: floats (NaN and ±inf included) and long integers in 4 digits."""
    if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**16):
        try:
            return f"{value:.4g}"
        except OverflowError:  # an integer beyond any float
            return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"
    return str(value)


def facts(run: RunData) -> str:
    """One run's key facts, how it ended, its model mapping, its config and what was skipped."""
    planned = run.planned_steps
    done = max((int(r.get("step", 0)) for r in run.train_records), default=0)
    items = [("run", str(run.root)), ("steps", f"{done}/{planned}" if planned is not None else str(done)),
             ("roles", ", ".join(run.roles) or "–"), ("model groups", ", ".join(run.groups) or "–")]
    if run.end is not None:
        items.append(("ended", run.end.status))
    last = run.train_records[-1] if run.train_records else {}
    evals = [r for r in run.records if "eval/accuracy" in r]
    if "reward/mean" in last:
        items.append(("last reward/mean", _number(last["reward/mean"])))
    if evals:  # eval/accuracy is the primary reward's mean, graded or not: label it as a reward
        label = f"eval reward ({run.primary_reward})" if run.primary_reward else "eval reward"
        items.append((f"{label} @ step {evals[-1]['step']}", _number(evals[-1]["eval/accuracy"])))
    shown = "".join(f"<span>{html.escape(k)}: <b>{html.escape(v)}</b></span>" for k, v in items)
    return (f'<div class="facts">{shown}</div>{mapping(run.mapping)}{ending(run, done)}{config_block(run)}'
            f"{skipped(run)}")


def ending(run: RunData, done: int) -> str:
    """How the run ended (run_end.json); without that record, a warning only when steps are missing."""
    end, planned = run.end, run.planned_steps
    if end is not None and end.status == "stopped":
        return (f'<div class="stopped run-end">stopped early at step {end.step} of {end.planned_steps} by '
                f"{html.escape(end.reason)}</div>")
    if end is not None and end.status in ("crashed", "interrupted"):
        return (f'<div class="warn run-end">{end.status} at step {end.step} of {end.planned_steps}: '
                f"{html.escape(end.reason)}</div>")
    if not run.train_records:
        return ('<div class="warn">no training steps recorded: an `unimas eval` run, '
                "or training stopped before its first step</div>")
    if end is None and planned is not None and done < planned:
        return (f'<div class="warn">incomplete: metrics stop at step {done} of {planned} '
                "(still running, or killed: no run_end.json)</div>")
    return ""


def config_block(run: RunData) -> str:
    """The run's config.yaml, folded: what a reader checks first when two runs differ."""
    if run.config_text is None:
        return ""
    return (f'<details class="run-config"><summary>config.yaml</summary><pre>{html.escape(run.config_text)}</pre>'
            "</details>")


def header(run: RunData) -> str:
    return f"<h1>unimas report — {html.escape(run.name)}</h1>{facts(run)}"


def overlay_header(runs: list[RunData]) -> str:
    """An overlay's title and, per run, its facts under its name."""
    names = " vs ".join(run.name for run in runs)
    blocks = "".join(f'<div class="run-facts" data-run="{html.escape(run.name)}"><h2>{html.escape(run.name)}</h2>'
                     f"{facts(run)}</div>" for run in runs)
    return f"<h1>unimas report — {html.escape(names)}</h1>{blocks}"


def skipped(run: RunData) -> str:
    """The damaged parts left out, so a reader knows the page shows less than the run directory holds."""
    if not run.skipped:
        return ""
    items = "".join(f"<li>{html.escape(str(item))}</li>" for item in run.skipped)
    return (f'<details class="warn" id="skipped"><summary>damaged parts of the run directory were skipped '
            f"({len(run.skipped)} notes)</summary><ul>{items}</ul></details>")


def mapping(rows: list[GroupMapping]) -> str:
    """Which roles run on which weights: the first thing to know when comparing runs."""
    if not rows:
        return ""
    lines = []
    for row in rows:
        roles = ", ".join(f"{r} (frozen)" if r in row.frozen_roles else r for r in row.roles) or "–"
        lines.append(f"<li><b>{html.escape(row.group)}</b> [{html.escape(row.backend)}]: "
                     f"{html.escape(row.scheme)} — roles: {html.escape(roles)}</li>")
    return f'<ul class="mapping" id="model-mapping">{"".join(lines)}</ul>'


def chart_section(groups: list[dict[str, Any]], section: str) -> str:
    """Empty containers, one per chart group of ``section``, that charts.js fills."""
    return "\n".join(f'<div class="chart-group" id="{html.escape(g["id"])}"><h3>{html.escape(g["caption"])}</h3>'
                     f'<div class="charts"></div></div>' for g in groups if g["section"] == section)


def metrics_table(run: RunData) -> str:
    """Latest value of every metric, so nothing logged is hidden behind a plot that does not exist."""
    latest: dict[str, tuple[int, Any]] = {}
    for record in run.records:
        for key, value in record.items():
            if key != "step":
                latest[key] = (int(record.get("step", 0)), value)
    if not latest:
        return '<div class="empty">no metrics recorded yet</div>'
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td class=num>{html.escape(_number(v))}</td>"
                   f"<td class=num>{s}</td></tr>" for k, (s, v) in sorted(latest.items()))
    return (f"<details><summary>{len(latest)} metrics (see docs/metrics.md)</summary><table class=metrics>"
            f"<tr><th>name</th><th>value</th><th>step</th></tr>{rows}</table></details>")


def _finite(value: Any) -> Any:
    """NaN/inf become null: JSON.parse rejects them, and one bad reward must not blank the viewer."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                             "\u2028": "\\u2028", "\u2029": "\\u2029"})
"""Inline JSON escapes: with no ``<`` left, ``</script>`` and ``<!--`` in model output cannot end or
confuse the script element; JSON reads ``\\u003c`` as the same ``<``."""


def script_json(data: Any) -> str:
    """``data`` as JSON that is safe verbatim inside ``<script type="application/json">``."""
    return json.dumps(data, default=str).translate(SCRIPT_SAFE)


SCRIPTS = ("vendor/uPlot.iife.min.js", "charts.js", "viewer.js")
"""Concatenated into the page's one script element, uPlot first."""


def render(runs: list[RunData]) -> str:
    """The page of one run, or of several overlaid (each chart one series per run and line)."""
    groups = chart_groups(runs)
    runs_data = [{"name": run.name, "roles": run.roles, "episodes": run.episodes} for run in runs]
    workflow = chart_section(groups, "workflow")
    tables = metrics_table(runs[0]) if len(runs) == 1 else "".join(
        f"<h3>{html.escape(run.name)}</h3>{metrics_table(run)}" for run in runs)
    parts = {
        "title": html.escape("unimas report — " + " vs ".join(run.name for run in runs)),
        "style": _asset("vendor/uPlot.min.css") + "\n" + _asset("viewer.css"),
        "script": "\n;\n".join(_asset(name) for name in SCRIPTS),
        "header": header(runs[0]) if len(runs) == 1 else overlay_header(runs),
        "overview": chart_section(groups, "overview") or '<div class="empty">no metrics recorded yet</div>',
        "workflow": (f'<section id="workflow-metrics"><h2>Workflow metrics</h2><p class="hint">What the workflow '
                     f"logged with <code>ctx.metric(name, value)</code>: the mean over each step's episodes (train) and over the "
                     f"evaluation episodes (eval)."
                     f"</p>{workflow}</section>") if workflow else "",
        "health": chart_section(groups, "health"),
        "metrics": tables,
        "data": script_json(_finite({"runs": runs_data, "charts": groups})),
    }
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("viewer.html"))
