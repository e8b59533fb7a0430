"""PNG plots of a run (``RUN_DIR/plots/*.png``, for slides and papers), drawn with matplotlib's Agg canvas.

The page itself draws interactive charts (:mod:`unimas.report.charts`); these files are the static copies.

Figures are built with ``matplotlib.figure.Figure`` rather than pyplot, so
writing a report never switches the global backend or opens a window, even
when called from inside a notebook or a training process.
"""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path
from typing import Any, Callable

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from unimas.report.charts import CRITIC_METRICS, EPISODE_METRICS, GROUP_METRICS, ROLE_METRICS, plottable, series
from unimas.report.data import RunData
from unimas.report.sources import replace_file

LINE_STYLES = ["-", "--", ":", "-."]
"""Cycled per line so that identical series (e.g. roles sharing a team reward) stay distinguishable."""
LEFT_OUT = "{count} not drawn (NaN, ±inf, text or |value| > 1e300)"
MAX_DRAWN = 12
"""Roles and model groups drawn in the PNGs (the page charts them all). Each is a panel or a line with a
legend entry, and a run directory can name thousands (as metric names): drawing them all took minutes and
a figure of gigabytes."""


PANEL_INCHES = (4.2, 3.0)
"""Width and height of one panel with its share of the margins."""
MARGIN_INCHES = {"left": 0.65, "right": 0.2, "bottom": 0.5, "top": 0.7, "between_columns": 0.6, "between_rows": 0.8}
"""Room for what surrounds the axes: y tick labels (left, between columns), "step" and the x tick labels
(bottom, between rows), each panel's title and the figure's caption (top, between rows). Fixed margins, not
matplotlib's constrained layout: that costs a second, hidden draw of every figure (a third of the CPU of writing a
report's PNGs), and these plots have no axis titles and fixed font sizes, so fixed room fits their labels."""


def _grid(count: int, columns: int = 3) -> tuple[Figure, list[Axes]]:
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    width, height = PANEL_INCHES[0] * columns, PANEL_INCHES[1] * rows
    m = MARGIN_INCHES
    axes_width = (width - m["left"] - m["right"] - (columns - 1) * m["between_columns"]) / columns
    axes_height = (height - m["bottom"] - m["top"] - (rows - 1) * m["between_rows"]) / rows
    figure = Figure(figsize=(width, height))
    figure.subplots_adjust(left=m["left"] / width, right=1 - m["right"] / width, bottom=m["bottom"] / height,
                           top=1 - m["top"] / height, wspace=m["between_columns"] / axes_width,
                           hspace=m["between_rows"] / axes_height)
    axes = figure.subplots(rows, columns, squeeze=False).ravel().tolist()
    for extra in axes[count:]:
        extra.set_visible(False)
    return figure, axes[:count]


def _empty(axes: Axes, message: str) -> None:
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes, color="0.4")


def _mark_left_out(axes: Axes, count: int) -> None:
    if count:
        axes.text(0.01, 0.01, LEFT_OUT.format(count=count), ha="left", va="bottom", transform=axes.transAxes,
                  color="C3", fontsize=7)


def _lines(axes: Axes, records: list[dict[str, Any]], keys: dict[str, str], title: str) -> None:
    """One line per label -> metric key; a note instead of an empty frame."""
    drawn, left_out = False, 0
    for index, (label, key) in enumerate(keys.items()):
        steps, values, skipped = series(records, key)
        left_out += skipped
        if steps:
            axes.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=label,
                      linestyle=LINE_STYLES[index % len(LINE_STYLES)])
            drawn = True
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    if not drawn:
        _empty(axes, "not logged yet" if not left_out else "nothing drawable")
    elif len(keys) > 1:
        axes.legend(fontsize=8)
    _mark_left_out(axes, left_out)


def reward_plot(run: RunData) -> Figure:
    """Training reward overall and per role, next to evaluation reward per role."""
    figure, (train, evaluation) = _grid(2, 2)
    keys = {"all episodes": "reward/mean"} | {role: f"role/{role}/reward_mean" for role in run.roles}
    _lines(train, run.train_records, keys, "training reward (per role = mean turn credit)")
    means = dict(zip(*series(run.train_records, "reward/mean")[:2]))
    stds = dict(zip(*series(run.train_records, "reward/std")[:2]))
    steps = [step for step in means if step in stds]
    if steps:
        train.fill_between(steps, [means[s] - stds[s] for s in steps], [means[s] + stds[s] for s in steps],
                           alpha=0.15, color="C0")
    eval_keys = {"accuracy": "eval/accuracy"} | {role: f"eval/role/{role}/reward_mean" for role in run.roles}
    _lines(evaluation, run.records, eval_keys, "evaluation")
    return figure


def group_plot(run: RunData) -> Figure:
    """Per model group optimisation health: loss, KL, entropy, clipping, gradients, throughput."""
    figure, axes = _grid(len(GROUP_METRICS))
    for ax, metric in zip(axes, GROUP_METRICS):
        _lines(ax, run.train_records, {g: f"group/{g}/{metric}" for g in run.groups}, metric)
    return figure


def role_plot(run: RunData) -> Figure:
    """Per role output health: format errors, length, advantage spread, flat groups."""
    figure, axes = _grid(len(ROLE_METRICS), 2)
    for ax, metric in zip(axes, ROLE_METRICS):
        _lines(ax, run.train_records, {r: f"role/{r}/{metric}" for r in run.roles}, metric)
    return figure


def critic_plot(run: RunData) -> Figure:
    """Per group with a critic: value loss, explained variance, mean value, value clipping; and the spread of
    each role's per-token advantages (``critic/advantage_std/<role>``)."""
    groups = run.critic_groups
    figure, axes = _grid(len(CRITIC_METRICS) + 1)
    for ax, metric in zip(axes, CRITIC_METRICS):
        _lines(ax, run.train_records, {g: f"group/{g}/critic/{metric}" for g in groups}, metric)
    spread = {(role if len(groups) == 1 else f"{role} ({g})"): f"group/{g}/critic/advantage_std/{role}"
              for g in groups for role in run.roles
              if any(f"group/{g}/critic/advantage_std/{role}" in r for r in run.train_records)}
    _lines(axes[-1], run.train_records, spread, "advantage_std per role")
    return figure


def episode_plot(run: RunData) -> Figure:
    figure, axes = _grid(len(EPISODE_METRICS))
    for ax, key in zip(axes, EPISODE_METRICS):
        _lines(ax, run.train_records, {key: key}, key)
    return figure


def distribution_plot(run: RunData) -> Figure:
    """Histograms of turn credit per role in the first vs the last third of the sampled training steps."""
    episodes = run.episodes.get("train", [])
    steps = sorted({e["step"] for e in episodes})
    cut = max(1, len(steps) // 3)
    phases = {"early": set(steps[:cut]), "late": set(steps[-cut:])}
    figure, axes = _grid(max(1, len(run.roles)))
    for ax, role in zip(axes, run.roles or ["(no roles)"]):
        ax.set_title(f"{role}: turn reward", fontsize=10)
        drawn, left_out = False, 0
        for index, (label, chosen) in enumerate(phases.items()):
            rewards = [n["reward"] for e in episodes if e["step"] in chosen for n in e["nodes"]
                       if n.get("role") == role and n.get("reward") is not None]
            values = [v for v in map(plottable, rewards) if v is not None]
            left_out += len(rewards) - len(values)
            if values:
                span = f"steps {min(chosen)}-{max(chosen)}"
                ax.hist(values, bins=20, alpha=0.55, color=f"C{index}", label=f"{label} ({span})")
                drawn = True
        if drawn:
            ax.legend(fontsize=8)
        else:
            _empty(ax, "no sampled training episodes")
        _mark_left_out(ax, left_out)
    return figure


PLOTS: dict[str, tuple[str, Callable[[RunData], Figure]]] = {
    "rewards": ("Reward per role", reward_plot),
    "reward_distribution": ("Reward distribution, early vs late", distribution_plot),
    "groups": ("Per model group: loss, KL, entropy", group_plot),
    "roles": ("Per role: format errors, length, advantages", role_plot),
    "critic": ("Critic: value loss, explained variance, values, advantages per role", critic_plot),
    "episodes": ("Episodes and timing", episode_plot),
}
"""File stem -> (caption, figure builder), in report order."""
ONLY_WHEN = {"critic": lambda run: bool(run.critic_groups)}
"""Plots drawn only for runs that log what they show."""


def write_plots(run: RunData, directory: Path) -> dict[str, Path]:
    """Write every plot as ``directory/<stem>.png``, replacing what is there (a symlink is not written
    through: :func:`replace_file`); returns stem -> path in report order."""
    directory.mkdir(parents=True, exist_ok=True)
    drawn = dataclasses.replace(run, roles=run.roles[:MAX_DRAWN], groups=run.groups[:MAX_DRAWN])
    left_out = [f"{len(names)} {kind}" for kind, names in (("roles", run.roles), ("model groups", run.groups))
                if len(names) > MAX_DRAWN]
    note = f" (the first {MAX_DRAWN} of {' and '.join(left_out)} drawn)" if left_out else ""
    written = {}
    # Role and group names are text from the run directory: a "$" in one must not start a mathtext formula,
    # which fails to parse (and stops the report) when the name is not valid TeX.
    with matplotlib.rc_context({"text.parse_math": False}):
        for stem, (caption, build) in PLOTS.items():
            if not ONLY_WHEN.get(stem, lambda run: True)(drawn):
                continue
            figure = build(drawn)
            figure.suptitle(caption + note, fontsize=12)
            png = io.BytesIO()
            figure.savefig(png, format="png", dpi=90)
            path = directory / f"{stem}.png"
            replace_file(path, png.getvalue())
            written[stem] = path
    return written
