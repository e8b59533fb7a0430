"""Assemble report.html: one file that opens anywhere, offline.

CSS, JavaScript, plot images (base64) and the episode data (JSON) are all
inlined into ``viewer.html``, so the report can be mailed, archived or opened
from a CI artifact without a server or network access.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

from unimas.report.data import GroupMapping, RunData
from unimas.report.plots import PLOTS


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


def header(run: RunData) -> str:
    planned = run.planned_steps
    done = max((int(r.get("step", 0)) for r in run.train_records), default=0)
    facts = [("run", str(run.root)), ("steps", f"{done}/{planned}" if planned is not None else str(done)),
             ("roles", ", ".join(run.roles) or "–"), ("model groups", ", ".join(run.groups) or "–")]
    last = run.train_records[-1] if run.train_records else {}
    evals = [r for r in run.records if "eval/accuracy" in r]
    if "reward/mean" in last:
        facts.append(("last reward/mean", _number(last["reward/mean"])))
    if evals:  # eval/accuracy is the primary reward's mean, graded or not: label it as a reward
        label = f"eval reward ({run.primary_reward})" if run.primary_reward else "eval reward"
        facts.append((f"{label} @ step {evals[-1]['step']}", _number(evals[-1]["eval/accuracy"])))
    items = "".join(f"<span>{html.escape(k)}: <b>{html.escape(v)}</b></span>" for k, v in facts)
    warning = ""
    if not run.train_records:
        warning = ('<div class="warn">no training steps recorded: an `unimas eval` run, '
                   "or training stopped before its first step</div>")
    elif planned is not None and done < planned:
        warning = (f'<div class="warn">incomplete: metrics stop at step {done} of {planned} '
                   "(still running, stopped early or killed)</div>")
    return (f'<h1>unimas report — {html.escape(run.name)}</h1><div class="facts">{items}</div>'
            f"{mapping(run.mapping)}{warning}{skipped(run)}")


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


OVERVIEW = ("rewards", "reward_distribution")
"""Plots shown above the trajectory viewer; the others go below it."""


def figures(images: dict[str, Path], stems: list[str]) -> str:
    """``<figure>`` elements with the PNGs inlined as base64 data URLs."""
    out = []
    for stem in stems:
        path = images[stem]
        encoded = base64.b64encode(path.read_bytes()).decode("ascii")
        caption = html.escape(PLOTS[stem][0])
        out.append(f'<figure><img id="plot-{stem}" alt="{caption}" src="data:image/png;base64,{encoded}">'
                       f"<figcaption>{caption} (plots/{stem}.png)</figcaption></figure>")
    return "\n".join(out)


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


def render(run: RunData, images: dict[str, Path]) -> str:
    data = _finite({"roles": run.roles, "episodes": run.episodes})
    parts = {
        "title": html.escape(f"unimas report — {run.name}"),
        "style": _asset("viewer.css"),
        "script": _asset("viewer.js"),
        "header": header(run),
        "overview": figures(images, [s for s in images if s in OVERVIEW]),
        "health": figures(images, [s for s in images if s not in OVERVIEW]),
        "metrics": metrics_table(run),
        "data": script_json(data),
    }
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("viewer.html"))
