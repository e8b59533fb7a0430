"""Run reports: plots and a self-contained HTML trajectory viewer.

``write_report`` only reads the run directory, so it works on a finished
run, a running one, one that was killed mid-way and one that is damaged:
what cannot be read is skipped, named on the page and in a warning line.

May import: errors, output.
"""

from __future__ import annotations

import sys
from pathlib import Path

from unimas.errors import UserError
from unimas.output.rundir import RunDir
from unimas.report.data import load_run


def write_report(run_dir: Path) -> Path:
    """Write ``RUN_DIR/plots/*.png`` and ``RUN_DIR/report.html``; returns the HTML path.

    Prints one ``warning:`` line to stderr per damaged part skipped. Raises
    :class:`UserError` when ``metrics.jsonl`` cannot be read or the report cannot be written.
    """
    from unimas.report.html import render  # matplotlib: not for `unimas validate`, which reads report.data
    from unimas.report.plots import write_plots

    run_dir = Path(run_dir)
    run = load_run(run_dir)
    for item in run.skipped:
        print(f"warning: {run_dir / item.file}" + (f":{item.line}" if item.line else "") + f": {item.why}",
              file=sys.stderr)
    owner = RunDir(run_dir)  # a symlinked plots/ or report.html leading out of the run is refused (exit 2)
    path, target = owner.owned(run_dir / "report.html"), owner.owned(run_dir / "plots")
    try:
        images = write_plots(run, target)
        target = path
        # errors="replace": a lone surrogate from a JSON escape in a metric name must not stop the page.
        path.write_text(render(run, images), encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot write the report here ({exc.strerror or exc})", where=str(target)) from None
    return path
