"""Tables, curves and the docs/results.md section of the workflow matrix, rebuilt from its result files.

    python benchmarks/workflow_report.py                 # print the table
    python benchmarks/workflow_report.py --docs          # also rewrite docs/results.md (between the matrix
                                                         # markers only) and docs/images/matrix_<workflow>.png

Every number here is computed from the JSON files that
``benchmarks/workflow_matrix.py`` writes (one per workflow, mapping, credit
and seed); nothing is typed in by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, markdown_table  # noqa: E402

COLLAPSE_MARGIN = 0.15
"""A run collapsed when its last two evaluations are both more than this (absolute accuracy) below its peak."""
DEFAULT_RESULTS = REPO / "benchmarks" / "results" / "workflow_matrix"
ORDER = {"mapping": ("shared", "separate", "lora"), "credit": ("team", "per_role", "ppo_cc")}
WORKFLOW_ORDER = ("evaluator_optimizer", "voting", "orchestrator_workers", "plan_path")
LONG_RESULTS = REPO / "benchmarks" / "results" / "workflow_matrix_long"
LONG_COMMAND = ("python benchmarks/workflow_matrix.py --budget-scale 3 --credits team per_role --mappings shared "
                "separate --workflows voting plan_path --seeds 0 1 2 3 --out benchmarks/results/workflow_matrix_long")
"""The longer-horizon slice (3x the tokens, for the cliff, peak and per-role claims): what the machine's time
allowed after the full matrix."""


def load_runs(folder: Path) -> list[dict]:
    """Every finished run's record (``*.json``; half-written ``.part`` files are ignored)."""
    return [json.loads(path.read_text()) for path in sorted(Path(folder).glob("*.json"))]


def complete_seeds(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """(runs of the seeds every cell has, runs of seeds still in progress): a matrix resumed with more seeds
    is reported on equal footing, every cell with the same seeds, until the extra seed is finished everywhere."""
    cell_names = {(r["workflow"], r["mapping"], r["credit"]) for r in runs}
    seeds = {r["seed"] for r in runs}
    full = {seed for seed in seeds
            if {(r["workflow"], r["mapping"], r["credit"]) for r in runs if r["seed"] == seed} == cell_names}
    if not full:  # a matrix still at its first seed: report what there is
        return runs, []
    return [r for r in runs if r["seed"] in full], [r for r in runs if r["seed"] not in full]


def peak(run: dict) -> tuple[float, int]:
    """Highest evaluated accuracy and the first step that reached it."""
    best = max(point["accuracy"] for point in run["curve"])
    return best, next(point["step"] for point in run["curve"] if point["accuracy"] == best)


def collapsed(run: dict, margin: float = COLLAPSE_MARGIN) -> bool:
    """Fell more than ``margin`` below its peak and stayed there (its last two evaluations)."""
    best = peak(run)[0]
    tail = run["curve"][-2:]
    return len(run["curve"]) >= 3 and all(point["accuracy"] < best - margin for point in tail)


def mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def cells(runs: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """Runs grouped by (workflow, mapping, credit), in the matrix's order, seeds sorted."""
    grouped: dict[tuple[str, str, str], list[dict]] = {}
    for run in runs:
        grouped.setdefault((run["workflow"], run["mapping"], run["credit"]), []).append(run)

    def key(cell: tuple[str, str, str]) -> tuple:
        workflow, mapping, credit = cell
        rank = WORKFLOW_ORDER.index(workflow) if workflow in WORKFLOW_ORDER else len(WORKFLOW_ORDER)
        return (rank, workflow, ORDER["mapping"].index(mapping), ORDER["credit"].index(credit))

    return {cell: sorted(grouped[cell], key=lambda r: r["seed"]) for cell in sorted(grouped, key=key)}


def final_roles(runs: list[dict]) -> str:
    """Each role's own checked score at the final evaluation, mean over seeds (``role: value``)."""
    roles = sorted({role for run in runs for role in run["curve"][-1]["role_scores"]})
    return ", ".join(f"{role} {statistics.fmean(r['curve'][-1]['role_scores'].get(role, 0.0) for r in runs):.2f}"
                     for role in roles)


def train_roles(runs: list[dict]) -> str:
    """Each role's training reward (``role/<r>/reward_mean``) at the last step, mean over seeds."""
    roles = sorted({role for run in runs for role in run["train_role_reward"]})
    return ", ".join(f"{role} {statistics.fmean(r['train_role_reward'].get(role, 0.0) for r in runs):.2f}"
                     for role in roles)


def table(runs: list[dict]) -> str:
    """One row per workflow x mapping x credit, mean ± std over its seeds."""
    rows = []
    for (workflow, mapping, credit), group in cells(runs).items():
        peaks = [peak(r) for r in group]
        rows.append([workflow, mapping, credit, str(len(group)),
                     mean_std([r["curve"][0]["accuracy"] for r in group]),
                     mean_std([p for p, _ in peaks]), mean_std([r["curve"][-1]["accuracy"] for r in group]),
                     f"{statistics.fmean(s for _, s in peaks):.1f}",
                     f"{sum(collapsed(r) for r in group)}/{len(group)}",
                     final_roles(group), train_roles(group),
                     f"{statistics.fmean(r['steps'] for r in group):.0f}",
                     f"{statistics.fmean(r['tokens'] for r in group):.0f}",
                     f"{statistics.fmean(r['wall_s'] for r in group):.0f}"])
    return markdown_table(["workflow", "mapping", "credit", "seeds", "step-0 acc", "peak acc", "final acc",
                           "steps to peak", "collapses", "final role scores (greedy eval)",
                           "final role reward (training)", "steps", "sampled tokens", "wall s / run"], rows)


def headline(runs: list[dict]) -> str:
    """Per workflow: the start, the best and worst cell at the end, and how many cells gained on every seed."""
    rows = []
    for workflow in WORKFLOW_ORDER:
        grouped = {cell: group for cell, group in cells(runs).items() if cell[0] == workflow}
        if not grouped:
            continue
        mean_final = {cell: statistics.fmean(final(r) for r in group) for cell, group in grouped.items()}
        top, bottom = max(mean_final, key=mean_final.get), min(mean_final, key=mean_final.get)
        gained = sum(all(final(r) > r["curve"][0]["accuracy"] for r in group) for group in grouped.values())
        starts = [r["curve"][0]["accuracy"] for r in next(iter(grouped.values()))]  # one start per seed
        rows.append([workflow, mean_std(starts),
                     f"{top[1]} / {top[2]}: {mean_std([final(r) for r in grouped[top]])}",
                     f"{bottom[1]} / {bottom[2]}: {mean_std([final(r) for r in grouped[bottom]])}",
                     f"{gained}/{len(grouped)}"])
    return markdown_table(["workflow", "step-0 acc", "best cell at the end (mapping / credit: final acc)",
                           "worst cell at the end", "cells above step 0 on every seed"], rows)


def paired(runs_a: list[dict], runs_b: list[dict], measure) -> list[float]:
    """Per seed present in both, measure(b) - measure(a): the same seed draws the same tasks in both cells."""
    by_seed = {r["seed"]: r for r in runs_a}
    return [measure(r) - measure(by_seed[r["seed"]]) for r in runs_b if r["seed"] in by_seed]


def verdict(differences: list[float]) -> str:
    """``holds`` / ``does not hold`` / ``undecided`` for a claim that the difference is positive.

    Decided only when the mean paired difference is more than two standard
    errors from zero (with 3 seeds per cell and 3 cells, 9 pairs).
    """
    if len(differences) < 2:
        return "undecided"
    mean, error = statistics.fmean(differences), statistics.stdev(differences) / len(differences) ** 0.5
    if mean > 2 * error and mean > 0:
        return "holds"
    if mean < -2 * error and mean < 0:
        return "does not hold"
    return "undecided"


def describe(differences: list[float]) -> str:
    if not differences:
        return "no pairs"
    if len(differences) == 1:
        return f"{differences[0]:+.3f} (1 pair)"
    return (f"{statistics.fmean(differences):+.3f} ± {statistics.stdev(differences):.3f} "
            f"(mean ± std of {len(differences)} paired differences)")


def final(run: dict) -> float:
    return run["curve"][-1]["accuracy"]


def best(run: dict) -> float:
    return peak(run)[0]


def over_cells(grouped: dict, fixed: str, a: str, b: str, measure, workflows=None) -> list[float]:
    """Paired differences b - a of one factor (``fixed`` = 'mapping' or 'credit' varies), over the other factor."""
    out: list[float] = []
    for (workflow, mapping, credit), runs in grouped.items():
        if workflows and workflow not in workflows:
            continue
        here = mapping if fixed == "mapping" else credit
        if here != a:
            continue
        other = (workflow, b, credit) if fixed == "mapping" else (workflow, mapping, b)
        if other in grouped:
            out += paired(runs, grouped[other], measure)
    return out


def capture_gap(run: dict) -> float:
    """How much more the dominant role's own score moved than the other role's (final - step 0)."""
    dominant = max(run["role_tokens"], key=run["role_tokens"].get)
    start, end = run["curve"][0]["role_scores"], run["curve"][-1]["role_scores"]
    others = [role for role in end if role != dominant]
    if not others or dominant not in end:
        return 0.0
    change = {role: end[role] - start.get(role, 0.0) for role in end}
    return change[dominant] - statistics.fmean(change[r] for r in others)


def claims(runs: list[dict]) -> list[tuple[str, str, str]]:
    """(claim, verdict, evidence) for each published finding, computed from the runs."""
    grouped = cells(runs)
    rows = []
    diffs = over_cells(grouped, "mapping", "shared", "separate", best)
    rows.append(("Isolated policies (one model per role) reach higher peaks than a shared one", verdict(diffs),
                 f"peak accuracy, separate − shared, paired by workflow, credit and seed: {describe(diffs)}"))
    shared = [r for (w, m, c), rs in grouped.items() if m == "shared" for r in rs]
    separate = [r for (w, m, c), rs in grouped.items() if m == "separate" for r in rs]
    n_shared, n_sep = sum(map(collapsed, shared)), sum(map(collapsed, separate))
    if n_sep == n_shared == 0:
        cliff = "undecided (no run collapsed)"
    else:
        cliff = "holds" if n_sep >= n_shared + 3 else "does not hold" if n_sep <= n_shared else "undecided"
    rows.append(("Isolated policies fall off a terminal accuracy cliff more often", cliff,
                 f"collapses (last two evaluations > {COLLAPSE_MARGIN} below the run's peak): separate "
                 f"{n_sep}/{len(separate)}, shared {n_shared}/{len(shared)}; holds at 3 or more collapses more "
                 "among isolated runs, does not hold when they collapse no more often than shared ones"))
    diffs = over_cells(grouped, "mapping", "separate", "shared", capture_gap)
    rows.append(("A shared policy is captured by the dominant role (the role with the most sampled tokens gains, "
                 "the others lose)", verdict(diffs),
                 "(dominant role's score change − other roles' change), shared − separate, paired: "
                 f"{describe(diffs)}"))
    for workflow in WORKFLOW_ORDER:
        diffs = over_cells(grouped, "credit", "team", "per_role", final, (workflow,))
        if not diffs:
            continue
        peaks = over_cells(grouped, "credit", "team", "per_role", best, (workflow,))
        rows.append((f"Per-role (AT-GRPO-style) credit beats a team reward: `{workflow}`", verdict(diffs),
                     f"final accuracy, per_role − team, paired by mapping and seed: {describe(diffs)}; "
                     f"peak: {describe(peaks)}"))
    return rows


T_95 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}
"""Two-sided 95 % Student t quantiles by degrees of freedom (pairs - 1)."""


def beyond_noise(runs: list[dict], limit: int = 10) -> tuple[list[list[str]], int]:
    """Pairs of cells differing in one factor whose final accuracies differ beyond seed noise, largest first,
    and how many comparisons were made (so the reader can weigh chance passes).

    Beyond noise: a paired t-test over seeds at the two-sided 5 % level (|mean| > t * std / sqrt(n)) and a
    mean difference of at least 0.05 accuracy.
    """
    grouped = cells(runs)
    found, compared = [], 0
    for factor, levels in ORDER.items():
        for i, a in enumerate(levels):
            for b in levels[i + 1:]:
                for (workflow, mapping, credit), runs_a in grouped.items():
                    if (mapping if factor == "mapping" else credit) != a:
                        continue
                    other = (workflow, b, credit) if factor == "mapping" else (workflow, mapping, b)
                    if other not in grouped:
                        continue
                    diffs = paired(runs_a, grouped[other], final)
                    if len(diffs) - 1 not in T_95:
                        continue
                    compared += 1
                    mean, spread = statistics.fmean(diffs), statistics.stdev(diffs)
                    if abs(mean) >= 0.05 and abs(mean) > T_95[len(diffs) - 1] * spread / len(diffs) ** 0.5:
                        fixed = f"credit {credit}" if factor == "mapping" else f"mapping {mapping}"
                        found.append((abs(mean), [workflow, fixed, f"{factor}: {a} → {b}",
                                                  ", ".join(f"{d:+.3f}" for d in diffs), f"{mean:+.3f}",
                                                  f"{spread:.3f}"]))
    found.sort(key=lambda item: -item[0])
    return [row for _, row in found[:limit]], compared


COLOUR = {"team": "tab:blue", "per_role": "tab:orange", "ppo_cc": "tab:green"}


def plot(runs: list[dict], workflow: str, path: Path) -> None:
    """Greedy accuracy vs sampled tokens: a panel per mapping, a line per credit (mean over seeds, shaded
    min-max over seeds); curves are interpolated onto a common token grid, as eval points differ by seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for axis, mapping in zip(axes, ORDER["mapping"]):
        for (name, cell_mapping, credit), group in cells(runs).items():
            if name != workflow or cell_mapping != mapping:
                continue
            end = min(r["curve"][-1]["tokens"] for r in group)
            grid = np.linspace(0, end, 25)
            curves = np.array([np.interp(grid, [p["tokens"] for p in r["curve"]],
                                         [p["accuracy"] for p in r["curve"]]) for r in group])
            axis.plot(grid, curves.mean(axis=0), color=COLOUR[credit], label=f"{credit} (n={len(group)})")
            axis.fill_between(grid, curves.min(axis=0), curves.max(axis=0), color=COLOUR[credit], alpha=0.15)
        axis.set_title(f"{mapping}", fontsize=10)
        axis.set_xlabel("sampled response tokens")
        if axis.lines:
            axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("greedy eval accuracy")
    figure.suptitle(f"{workflow}: accuracy vs sampled tokens per mapping (panel) and credit (colour)", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"


def section(runs: list[dict], images: dict[str, str], long_runs: list[dict] = ()) -> str:
    """The generated markdown between the markers of docs/results.md."""
    seeds = sorted({r["seed"] for r in runs})
    grouped = cells(runs)
    complete = sum(len(v) >= 3 for v in grouped.values())
    budgets = {}
    for run in runs:
        budgets[run["workflow"]] = run["budget"]
    lines = [
        "## Workflow × mapping × credit matrix (CPU scale)",
        "",
        "Generated by `python benchmarks/workflow_report.py --docs` from the result files in",
        "`benchmarks/results/workflow_matrix/` (one JSON per run, written by `python benchmarks/workflow_matrix.py`,",
        "which skips finished runs, so it resumes). "
        f"{len(runs)} runs: {len(grouped)} cells, {complete} of them with 3 seeds (seeds {seeds}).",
        "",
        "**Workflows** (`docs/workflows.md`): `evaluator_optimizer` (generator → evaluator `=`/`<`/`>` →",
        "revise, ≤ 2 rounds, on `a+b=`, operands < 50), `voting` (3 solvers on rotations of `a+b+c=`, operands",
        "< 20, → aggregator role), `orchestrator_workers` (split `a+b+c+d=`, operands < 25, → 2 worker turns →",
        "combine), `plan_path` (planner → `grid_walk` tool → executor/checker, 4×4 grids with 4 walls).",
        "**Models**: tiny character models (qwen2 architecture, hidden 96, 2 layers, about 0.3 M parameters),",
        "warm-started once per workflow by supervised training on every role's prompt format until the",
        "monitored role's greedy accuracy reached 0.30 (`examples/workflow_warm_start.py`); every mapping starts",
        "from that one checkpoint. **Mappings**: `shared` (one group), `separate` (a copy per role), `lora`",
        "(frozen base, a rank-8 adapter per role on every linear layer, learning rate 5× the full-weight 1e-4).",
        "**Credit**: `team` (GRPO on the team reward, grouped per role), `per_role` (AT-GRPO-style: team reward",
        "plus each role's own checked score, `role_score`, grouped per role and turn), `ppo_cc` (PPO/GAE on the",
        "team reward with one centralized critic reading the episode so far, 2 critic warm-up updates).",
        "**Budget**: 8 tasks × 4 samples per step until the workflow's sampled-token budget — the same for every",
        "cell of a workflow: " + ", ".join(f"`{w}` {b}" for w, b in budgets.items()) + " response tokens, about 16",
        "updates — with a greedy evaluation on 64 held-out tasks at step 0, every 4 steps and at the end.",
        f"**Collapse**: the last two evaluations both more than {COLLAPSE_MARGIN} below the run's own peak.",
        "**Role scores**: each role's own exactly checked contribution (a generator's proposals right, an",
        "evaluator's verdicts right, a solver's votes right, a worker's partial sums right, the orchestrator's",
        "split valid (0.5) and combine right (0.5), the planner's plan valid, the executor's final path valid,",
        "the aggregator's answer right), at the final greedy evaluation; the training column is",
        "`role/<role>/reward_mean` at the last step (under `team` and `ppo_cc` that is the team reward).",
        "",
        "### Headline", "",
        headline(runs), "",
        "### All cells (mean ± std over seeds)", "",
        table(runs),
        "",
    ]
    for workflow, image in images.items():
        lines += [f"![{workflow}: accuracy vs sampled tokens]({image})", ""]
    lines += ["### The published findings at this scale", "",
              "Verdict rule: *holds* / *does not hold* when the mean paired difference is more than two standard",
              "errors from zero in the claimed / opposite direction, *undecided* otherwise.", ""]
    lines.append(markdown_table(["claim", "at this scale", "evidence"], [list(row) for row in claims(runs)]))
    noise, compared = beyond_noise(runs)
    lines += ["", "### Cells where the mapping or the credit changes the outcome beyond seed noise", "",
              "Pairs of cells that differ in one factor (the other held fixed), final accuracy paired by seed;",
              "listed when a paired t-test over the seeds rejects no difference at the two-sided 5 % level and",
              f"the mean difference is at least 0.05. {compared} such comparisons were made, so about "
              f"{0.05 * compared:.0f} would pass by chance alone if nothing differed: read single rows with care.",
              ""]
    lines.append(markdown_table(["workflow", "held fixed", "change", "paired differences (final acc, by seed)",
                                 "mean", "std"], noise) if noise else "None at this budget.")
    if long_runs:
        scale = statistics.fmean(r["tokens"] for r in long_runs) / statistics.fmean(
            r["tokens"] for r in runs if (r["workflow"], r["mapping"], r["credit"]) in
            {(x["workflow"], x["mapping"], x["credit"]) for x in long_runs})
        updates = statistics.fmean(r["steps"] for r in long_runs)
        lines += ["", f"### Longer runs: {scale:.1f}× the tokens", "",
                  f"A slice of the matrix at {scale:.1f}× the sampled tokens (about {updates:.0f} updates), to give the",
                  f"peak, cliff and per-role claims a longer horizon: `{LONG_COMMAND}`.", "",
                  table(long_runs), ""]
        lines.append(markdown_table(["claim", "at this scale", "evidence"],
                                    [list(row) for row in claims(long_runs)]))
    return "\n".join(lines) + "\n"


def write_docs(runs: list[dict], results_md: Path, images_dir: Path, notes: str = "",
               long_runs: list[dict] = ()) -> None:
    """Rewrite only the text between the matrix markers (creating the file with just them if it is missing)."""
    images_dir.mkdir(parents=True, exist_ok=True)
    images = {}
    for workflow in WORKFLOW_ORDER:
        if any(r["workflow"] == workflow for r in runs):
            path = images_dir / f"matrix_{workflow}.png"
            plot(runs, workflow, path)
            images[workflow] = f"images/{path.name}"
    body = section(runs, images, long_runs) + notes
    text = results_md.read_text() if results_md.exists() else f"# Results\n\n{START}\n{END}\n"
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise SystemExit(f"{results_md}: the markers {START} ... {END} are missing or out of order")
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    results_md.write_text(f"{before}{START}\n{body}{END}{after}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--docs", action="store_true",
                        help="rewrite the matrix section of docs/results.md and docs/images/matrix_*.png")
    parser.add_argument("--notes", type=Path, default=REPO / "benchmarks" / "results" / "workflow_matrix_notes.md",
                        help="hand-written commentary appended to the generated section (if the file exists)")
    args = parser.parse_args()
    runs, pending = complete_seeds(load_runs(args.results))
    if pending:
        print(f"({len(pending)} runs of seeds not yet finished in every cell are left out)")
    print(table(runs))
    if args.docs:
        notes = args.notes.read_text() if args.notes.exists() else ""
        long_runs = complete_seeds(load_runs(LONG_RESULTS))[0] if LONG_RESULTS.exists() else []
        write_docs(runs, REPO / "docs" / "results.md", REPO / "docs" / "images", notes, long_runs)
        print("wrote docs/results.md (matrix section) and docs/images/matrix_*.png")


if __name__ == "__main__":
    main()
