"""PNG plots of a run, drawn with matplotlib's Agg canvas.

Figures are built with ``matplotlib.figure.Figure`` rather than pyplot, so
writing a report never switches the global backend or opens a window, even
when called from inside a notebook or a training process.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from unimas.report.data import RunData, finite

GROUP_METRICS = ["policy_loss", "kl", "entropy", "clip_frac", "grad_norm", "train_tokens_per_s"]
ROLE_METRICS = ["format_error_rate", "response_length", "advantage_std", "zero_variance_frac"]
LINE_STYLES = ["-", "--", ":", "-."]
"""Cycled per line so that identical series (e.g. roles sharing a team reward) stay distinguishable."""
EPISODE_METRICS = ["episode/turns", "episode/tool_calls", "episode/failures", "episode/wall_s", "time/step_s"]


def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that carry a finite number under ``key``."""
    points = [(r["step"], finite(r.get(key))) for r in records]
    return [s for s, v in points if v is not None], [v for _, v in points if v is not None]


def _grid(count: int, columns: int = 3) -> tuple[Figure, list[Axes]]:
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(4.2 * columns, 3.0 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel().tolist()
    for extra in axes[count:]:
        extra.set_visible(False)
    return figure, axes[:count]


def _empty(axes: Axes, message: str) -> None:
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes, color="0.4")


def _lines(axes: Axes, records: list[dict[str, Any]], keys: dict[str, str], title: str) -> None:
    """One line per label -> metric key; a note instead of an empty frame."""
    drawn = False
    for index, (label, key) in enumerate(keys.items()):
        steps, values = series(records, key)
        if steps:
            axes.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=label,
                      linestyle=LINE_STYLES[index % len(LINE_STYLES)])
            drawn = True
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    if not drawn:
        _empty(axes, "not logged yet")
    elif len(keys) > 1:
        axes.legend(fontsize=8)


def reward_plot(run: RunData) -> Figure:
    """Training reward overall and per role, next to evaluation reward per role."""
    figure, (train, evaluation) = _grid(2, 2)
    keys = {"all episodes": "reward/mean"} | {role: f"role/{role}/reward_mean" for role in run.roles}
    _lines(train, run.train_records, keys, "training reward (per role = mean turn credit)")
    steps, means = series(run.train_records, "reward/mean")
    _, stds = series(run.train_records, "reward/std")
    if steps and len(stds) == len(means):
        train.fill_between(steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
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
        drawn = False
        for index, (label, chosen) in enumerate(phases.items()):
            values = [n["reward"] for e in episodes if e["step"] in chosen for n in e["nodes"]
                      if n.get("role") == role and n.get("reward") is not None]
            if values:
                span = f"steps {min(chosen)}-{max(chosen)}"
                ax.hist(values, bins=20, alpha=0.55, color=f"C{index}", label=f"{label} ({span})")
                drawn = True
        if drawn:
            ax.legend(fontsize=8)
        else:
            _empty(ax, "no sampled training episodes")
    return figure


PLOTS: dict[str, tuple[str, Callable[[RunData], Figure]]] = {
    "rewards": ("Reward per role", reward_plot),
    "reward_distribution": ("Reward distribution, early vs late", distribution_plot),
    "groups": ("Per model group: loss, KL, entropy", group_plot),
    "roles": ("Per role: format errors, length, advantages", role_plot),
    "episodes": ("Episodes and timing", episode_plot),
}
"""File stem -> (caption, figure builder), in report order."""


def write_plots(run: RunData, directory: Path) -> dict[str, Path]:
    """Write every plot as ``directory/<stem>.png``; returns stem -> path in report order."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for stem, (caption, build) in PLOTS.items():
        figure = build(run)
        figure.suptitle(caption, fontsize=12)
        path = directory / f"{stem}.png"
        figure.savefig(path, dpi=90)
        written[stem] = path
    return written
