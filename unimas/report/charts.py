"""The report's interactive charts as plain data: which metric goes into which chart, with which series.

The page (``charts.js``, drawing with the vendored uPlot) only draws what is
listed here, so what a chart shows is decided and tested in Python. Charts
come in groups (rewards, reward terms, workflow metrics, health...), each
chart holds one series per role, group or reward, and an overlay of several
runs holds one series per run for each of them. Values a chart cannot take
(text, NaN, ±inf, huge magnitudes) are left out and counted on the chart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from unimas.report.data import RunData, finite

GROUP_METRICS = ["policy_loss", "kl", "entropy", "clip_frac", "grad_norm", "train_tokens_per_s"]
ROLE_METRICS = ["format_error_rate", "response_length", "advantage_std", "zero_variance_frac", "entropy",
                "distinct_answers"]
"""``role/<r>/<metric>`` of every role; entropy and distinct_answers show a role that stopped exploring."""
CRITIC_METRICS = ["value_loss", "explained_variance", "value_mean", "value_clip_frac"]
"""``group/<g>/critic/<metric>`` of each group with a critic (docs/critic.md), beside the advantage spread per role."""
EPISODE_METRICS = ["episode/turns", "episode/tool_calls", "episode/failures", "episode/wall_s", "time/step_s"]
REWARD_SUMMARIES = {"mean", "std", "clipped"}
"""``reward/<x>`` keys that summarise the step rather than name a reward term."""
PLOT_LIMIT = 1e300
"""Largest magnitude drawn: axis arithmetic (span, margins, tick steps) overflows near the float maximum, so
such points are left out and counted instead."""
MAX_POINTS = 2000
"""Points per series embedded in the page; a longer run is thinned evenly, its first and last step kept."""
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
           "#79706e"]
DASHES: list[list[int]] = [[], [8, 4], [2, 3], [10, 3, 2, 3]]
"""Cycled per series so that identical series (roles sharing a team reward) stay apart where they overlap."""


def plottable(value: Any) -> float | None:
    """``value`` as a float a chart can take, or None (text, bool, NaN, ±inf, magnitude over ``PLOT_LIMIT``)."""
    number = finite(value)
    return number if number is not None and abs(number) <= PLOT_LIMIT else None


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float], int]:
    """(steps, values) of the records that carry a plottable number under ``key``, and how many records carry
    something else there (text, NaN, ±inf, a huge number, or a step too large to plot): those are left out."""
    points = [(plottable(r["step"]), plottable(r[key])) for r in records if r.get(key) is not None]
    kept = [(s, v) for s, v in points if s is not None and v is not None]
    return [s for s, _ in kept], [v for _, v in kept], len(points) - len(kept)


@dataclass
class Line:
    """One series of one run: its label within the chart and its points."""

    label: str
    steps: list[float]
    values: list[float]
    left_out: int = 0
    detail: str = ""
    """Shown after the label but not part of it: lines of several runs with one label share a colour."""


Chart = tuple[str, str, list[Line]]
"""(chart id, title, lines) of one run; charts of several runs with the same id are overlaid."""


def lines(records: list[dict[str, Any]], keys: dict[str, str]) -> list[Line]:
    """label -> metric key as lines; keys never logged give none."""
    out = []
    for label, key in keys.items():
        steps, values, left_out = series(records, key)
        if steps or left_out:
            out.append(Line(label, steps, values, left_out))
    return out


def reward_charts(run: RunData) -> Iterator[Chart]:
    """The headline: reward of all episodes and per role in training, and evaluation."""
    train = {"all episodes": "reward/mean"} | {role: f"role/{role}/reward_mean" for role in run.roles}
    yield "reward-train", "training reward (per role = mean turn credit)", lines(run.train_records, train)
    evaluation = {"accuracy": "eval/accuracy"} | {role: f"eval/role/{role}/reward_mean" for role in run.roles}
    yield "reward-eval", "evaluation", lines(run.records, evaluation)


def reward_terms(run: RunData) -> list[str]:
    """Reward keys with ``reward/<key>/<role>`` metrics: the config's order, then any others as first logged."""
    logged: dict[str, None] = {}
    for record in run.train_records:
        for key in record:
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "reward" and parts[1] not in REWARD_SUMMARIES:
                logged[parts[1]] = None
    return [k for k in run.reward_levels if k in logged] + [k for k in logged if k not in run.reward_levels]


def _roles_of(run: RunData, term: str) -> list[str]:
    logged = {key.split("/", 2)[2] for r in run.train_records for key in r if key.startswith(f"reward/{term}/")}
    return [role for role in run.roles if role in logged] + sorted(logged - set(run.roles))


def _turn_mean(run: RunData, term: str, roles: list[str]) -> list[dict[str, Any]]:
    """Per step, a trajectory-level reward's mean over the turns it reached: the per-role means weighted by the
    role's turn count (``role/<r>/turns``; unweighted where that is missing)."""
    out = []
    for record in run.train_records:
        parts = [(finite(record.get(f"reward/{term}/{role}")), finite(record.get(f"role/{role}/turns")))
                 for role in roles if f"reward/{term}/{role}" in record]
        if not parts:
            continue
        weights = [w if w is not None and w > 0 else 0.0 for _, w in parts]
        if not sum(weights):
            weights = [1.0] * len(parts)
        values = [v for v, _ in parts]
        mean = None if None in values else sum(v * w for v, w in zip(values, weights)) / sum(weights)
        out.append({"step": record.get("step"), "value": mean if mean is not None else "not finite"})
    return out


def reward_term_charts(run: RunData) -> Iterator[Chart]:
    """A chart per reward term: one series per role it reaches, or, for a trajectory-level reward (the same
    value for every role of an episode), one training series and its evaluation mean."""
    for term in reward_terms(run):
        level = run.reward_levels.get(term)
        roles = _roles_of(run, term)
        if level == "trajectory":
            if term == run.primary_reward:
                train = lines(run.train_records, {"train (episode mean)": "reward/mean"})
            else:
                train = lines(_turn_mean(run, term, roles), {"train (mean over turns)": "value"})
            title = f"{term} (trajectory level: one value per episode, shared by its roles)"
            yield f"term-{term}", title, train + lines(run.records, {"eval": f"eval/reward/{term}"})
        else:
            title = f"{term} ({level} level) per role" if level else f"{term} per role"
            yield f"term-{term}", title, lines(run.train_records, {role: f"reward/{term}/{role}" for role in roles})


def workflow_charts(run: RunData) -> Iterator[Chart]:
    """A chart per ``workflow/<name>`` metric a workflow logged with ``ctx.metric`` (mean over the step's
    episodes), its evaluation mean (``eval/workflow/<name>``) beside it. The ``<name>/count`` companions (how
    many episodes logged it) stay in the metrics table."""
    logged = dict.fromkeys(key.removeprefix("eval/") for record in run.records for key in record
                           if key.startswith(("workflow/", "eval/workflow/")))
    for key in logged:
        if key.endswith("/count") and key.removesuffix("/count") in logged:
            continue
        yield f"workflow-{key}", key, lines(run.records, {"train": key, "eval": f"eval/{key}"})


def group_charts(run: RunData) -> Iterator[Chart]:
    for metric in GROUP_METRICS:
        yield f"group-{metric}", metric, lines(run.train_records, {g: f"group/{g}/{metric}" for g in run.groups})


def role_charts(run: RunData) -> Iterator[Chart]:
    for metric in ROLE_METRICS:
        yield f"role-{metric}", metric, lines(run.train_records, {r: f"role/{r}/{metric}" for r in run.roles})


def critic_charts(run: RunData) -> Iterator[Chart]:
    groups = run.critic_groups
    for metric in CRITIC_METRICS:
        yield f"critic-{metric}", metric, lines(run.train_records, {g: f"group/{g}/critic/{metric}" for g in groups})
    spread = {(role if len(groups) == 1 else f"{role} ({g})"): f"group/{g}/critic/advantage_std/{role}"
              for g in groups for role in run.roles}
    yield "critic-advantage_std", "advantage_std per role", lines(run.train_records, spread)


def episode_charts(run: RunData) -> Iterator[Chart]:
    for key in EPISODE_METRICS:
        yield f"episode-{key}", key, lines(run.train_records, {key: key})


GROUPS: list[tuple[str, str, str, Callable[[RunData], Iterator[Chart]]]] = [
    ("plot-rewards", "overview", "Reward per role", reward_charts),
    ("plot-reward-terms", "overview", "Each reward term: per role, or once for a trajectory-level reward",
     reward_term_charts),
    ("plot-workflow", "workflow", "Workflow metrics (ctx.metric)", workflow_charts),
    ("plot-groups", "health", "Per model group: loss, KL, entropy", group_charts),
    ("plot-roles", "health", "Per role: format errors, length, advantages", role_charts),
    ("plot-critic", "health", "Critic: value loss, explained variance, values, advantages per role", critic_charts),
    ("plot-episodes", "health", "Episodes and timing", episode_charts),
]
"""(element id, page section, caption, charts of one run), in page order."""


BINS = 20
"""Histogram bins of the reward distribution, shared by every run of an overlay."""


def _phases(run: RunData) -> dict[str, set[int]]:
    """The first and the last third of the sampled training steps."""
    steps = sorted({e["step"] for e in run.episodes.get("train", [])})
    cut = max(1, len(steps) // 3)
    return {"early": set(steps[:cut]), "late": set(steps[-cut:])} if steps else {}


def _turn_rewards(run: RunData, role: str, chosen: set[int]) -> tuple[list[float], int]:
    rewards = [n["reward"] for e in run.episodes.get("train", []) if e["step"] in chosen for n in e["nodes"]
               if n.get("role") == role and n.get("reward") is not None]
    values = [v for v in map(plottable, rewards) if v is not None]
    return values, len(rewards) - len(values)


def distribution_group(runs: list[RunData]) -> dict[str, Any] | None:
    """Per role, a histogram of turn rewards in the early vs the late sampled training steps; bins shared
    across runs, so an overlay's bars line up."""
    names = [run.name for run in runs]
    roles = list(dict.fromkeys(role for run in runs for role in run.roles))
    charts = []
    for role in roles:
        found = [(index, label, chosen, *_turn_rewards(run, role, chosen)) for index, run in enumerate(runs)
                 for label, chosen in _phases(run).items()]
        every = [v for *_, values, _ in found for v in values]
        if not every:
            continue
        low, high = min(every), max(every)
        if high - low <= 1e-9 * max(1.0, abs(low)):  # one value (all rewards 0): a unit-wide span around it
            low, high = low - 0.5, high + 0.5
        width = (high - low) / BINS
        centres = [low + (i + 0.5) * width for i in range(BINS)]
        entries = []
        for index, label, chosen, values, left_out in found:
            counts = [0.0] * len(centres)
            for v in values:
                counts[min(int((v - low) / width), len(centres) - 1)] += 1
            line = Line(label, centres, counts, left_out, detail=f" (steps {min(chosen)}-{max(chosen)})")
            entries.append((index, names[index], line))
        chart = _chart(f"distribution-{role}", f"{role}: turn reward", entries, names)
        charts.append(chart | {"kind": "bars", "x_label": "turn reward", "y_label": "turns"})
    if not charts:
        return None
    return {"id": "plot-reward_distribution", "section": "overview", "caption": "Reward distribution, early vs late",
            "charts": charts}


def _thin(steps: list[float], values: list[float]) -> tuple[list[float], list[float]]:
    if len(steps) <= MAX_POINTS:
        return steps, values
    stride = (len(steps) - 1) / (MAX_POINTS - 1)
    picks = sorted({round(i * stride) for i in range(MAX_POINTS)})
    return [steps[i] for i in picks], [values[i] for i in picks]


def _chart(chart_id: str, title: str, entries: list[tuple[int, str, Line]], runs: list[str]) -> dict[str, Any]:
    """One chart's page data. One run: a colour and dash per series. Several: one series per run and line,
    labelled ``run · line``; the colour follows the run where each run has one line, else the line (the dash
    then follows the run)."""
    labels = list(dict.fromkeys(line.label for _, _, line in entries))
    overlay = len(runs) > 1
    out = []
    for run_index, run, line in entries:
        index = labels.index(line.label)
        if not overlay:
            colour, dash, label = PALETTE[index % len(PALETTE)], DASHES[index % len(DASHES)], line.label
        elif len(labels) == 1:
            colour, dash, label = PALETTE[run_index % len(PALETTE)], [], run
        else:
            colour, dash = PALETTE[index % len(PALETTE)], DASHES[run_index % len(DASHES)]
            label = f"{run} · {line.label}"
        label += line.detail
        steps, values = _thin(line.steps, line.values)
        out.append({"label": label, "run": run, "line": line.label, "color": colour, "dash": dash,
                    "points": [[s, v] for s, v in zip(steps, values)], "left_out": line.left_out})
    return {"id": chart_id, "title": title, "series": out, "left_out": sum(s["left_out"] for s in out)}


def chart_groups(runs: list[RunData]) -> list[dict[str, Any]]:
    """Page data of every chart group that has something to draw, for one run or an overlay of several.

    Each group: ``id`` (the element it fills), ``section``, ``caption`` and ``charts``; each chart: ``id``,
    ``title``, ``series`` (label, run, colour, dash, ``[step, value]`` points, values left out) and ``left_out``.
    """
    names = [run.name for run in runs]
    groups = []
    for group_id, section, caption, charts_of in GROUPS:
        merged: dict[str, tuple[str, list[tuple[int, str, Line]]]] = {}
        for index, run in enumerate(runs):
            if group_id == "plot-critic" and not run.critic_groups:
                continue
            for chart_id, title, found in charts_of(run):
                merged.setdefault(chart_id, (title, []))[1].extend((index, names[index], line) for line in found)
        charts = [_chart(chart_id, title, entries, names) for chart_id, (title, entries) in merged.items() if entries]
        if charts:
            groups.append({"id": group_id, "section": section, "caption": caption, "charts": charts})
        if group_id == "plot-reward-terms":
            groups.extend(group for group in [distribution_group(runs)] if group is not None)
    return groups
