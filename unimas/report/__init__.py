"""Run reports: plots and a self-contained HTML trajectory viewer.

``write_report`` only reads the run directory, so it works on a finished
run, a running one and one that was killed mid-way alike.
"""

from __future__ import annotations

from pathlib import Path

from unimas.report.data import load_run
from unimas.report.html import render
from unimas.report.plots import write_plots


def write_report(run_dir: Path) -> Path:
    """Write ``RUN_DIR/plots/*.png`` and ``RUN_DIR/report.html``; returns the HTML path."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    images = write_plots(run, run_dir / "plots")
    path = run_dir / "report.html"
    path.write_text(render(run, images), encoding="utf-8")
    return path
