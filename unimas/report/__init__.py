"""Run reports: interactive charts and a self-contained HTML trajectory viewer.

``write_report`` only reads the run directory, so it works on a finished
run, a running one, one that was killed mid-way and one that is damaged:
what cannot be read is skipped, named on the page and in a warning line.
``write_overlay`` draws several runs into one page, one series per run.

May import: errors, output, safe_load.
"""

from __future__ import annotations

import sys
from pathlib import Path

from unimas.errors import UserError
from unimas.output.rundir import RunDir
from unimas.report.data import RunData, load_run
from unimas.report.sources import replace_file

OVERLAY_NAME = "compare.html"
"""Where an overlay goes without ``--out``: the first run's directory, beside (not over) its own report.html."""


def _load(run_dir: Path) -> RunData:
    """One run, its damaged parts named on stderr; a directory that is not a run is refused (exit 2)."""
    if not (run_dir / "metrics.jsonl").exists():
        raise UserError("no metrics.jsonl here: is this a unimas run directory?", where=str(run_dir))
    run = load_run(run_dir)
    for item in run.skipped:
        print(f"warning: {run_dir / item.file}" + (f":{item.line}" if item.line else "") + f": {item.why}",
              file=sys.stderr)
    return run


def _write(path: Path, page: str) -> Path:
    try:
        # errors="replace": a lone surrogate from a JSON escape in a metric name must not stop the page.
        path.write_text(page, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot write the report here ({exc.strerror or exc})", where=str(path)) from None
    return path


def _replace(path: Path, page: str) -> Path:
    """Write the page in the run directory, replacing what is there (see :func:`replace_file`)."""
    try:
        # errors="replace": a lone surrogate from a JSON escape in a metric name must not stop the page.
        replace_file(path, page.encode("utf-8", errors="replace"))
    except OSError as exc:
        raise UserError(f"cannot write the report here ({exc.strerror or exc})", where=str(path)) from None
    return path


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write ``RUN_DIR/plots/*.png`` and ``RUN_DIR/report.html`` (or only the page, at ``out``); the page's path.

    Prints one ``warning:`` line to stderr per damaged part skipped. Raises
    :class:`UserError` when ``metrics.jsonl`` is missing or cannot be read, or the report cannot be written.
    """
    from unimas.report.html import render  # matplotlib: not for `unimas validate`, which reads report.data
    from unimas.report.plots import write_plots

    run_dir = Path(run_dir)
    run = _load(run_dir)
    if out is not None:
        return _write(Path(out), render([run]))
    owner = RunDir(run_dir)  # a symlinked plots/ or report.html leading out of the run is refused (exit 2)
    path, plots = owner.owned(run_dir / "report.html"), owner.owned(run_dir / "plots")
    try:
        write_plots(run, plots)
    except OSError as exc:
        raise UserError(f"cannot write the report here ({exc.strerror or exc})", where=str(plots)) from None
    return _replace(path, render([run]))


def write_overlay(run_dirs: list[Path], out: Path | None = None) -> Path:
    """One page overlaying several runs, named by their directories; ``out`` defaults to ``OVERLAY_NAME`` in the
    first run's directory. Raises :class:`UserError` naming the first directory that is not a run."""
    from unimas.report.html import render

    runs = [_load(Path(d)) for d in run_dirs]
    for run, name in zip(runs, run_names([run.root for run in runs])):
        run.name = name
    if out is None:
        return _replace(RunDir(runs[0].root).owned(runs[0].root / OVERLAY_NAME), render(runs))
    return _write(Path(out), render(runs))


def run_names(roots: list[Path]) -> list[str]:
    """Directory names; two alike (``a/seed0``, ``b/seed0``) get their parent's name, and a rest a number."""
    paths = [Path(root).resolve() for root in roots]
    names = [p.name if [q.name for q in paths].count(p.name) == 1 else f"{p.parent.name}/{p.name}" for p in paths]
    return [name if names[:i].count(name) == 0 else f"{name} ({names[:i].count(name) + 1})"
            for i, name in enumerate(names)]
