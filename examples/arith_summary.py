"""Solver accuracy, team accuracy and the verifier's fix / break / copy rates of an arithmetic run.

    python examples/arith_summary.py RUN_DIR [RUN_DIR ...]

Reads the greedy evaluation episodes in RUN_DIR/trajectories/eval.jsonl and
prints one markdown row per evaluation step (first and last) per run.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from unimas.trajectory import read_jsonl


def rates(episodes) -> dict[str, float]:
    solver = team = wrong = fixed = right = broken = copied = 0
    for ep in episodes:
        answer = ep.task["answer"]
        proposal, final = ep.outcome.get("proposal"), ep.outcome.get("answer")
        solver += proposal == answer
        team += final == answer
        copied += final == proposal
        if proposal == answer:
            right += 1
            broken += final != answer
        else:
            wrong += 1
            fixed += final == answer
    n = len(episodes)
    return {"solver": solver / n, "team": team / n, "fix": fixed / max(wrong, 1),
            "break": broken / max(right, 1), "copy": copied / n}


def main(run_dirs: list[str]) -> None:
    print("| run | step | solver acc | team acc | fix rate (wrong→right) | break rate (right→wrong) | copy rate |")
    print("|---|---|---|---|---|---|---|")
    for run_dir in run_dirs:
        by_step = defaultdict(list)
        for ep in read_jsonl(Path(run_dir) / "trajectories" / "eval.jsonl"):
            by_step[ep.step or 0].append(ep)
        steps = sorted(by_step)
        for step in dict.fromkeys([steps[0], steps[-1]]):
            r = rates(by_step[step])
            print(f"| {Path(run_dir).name} | {step} | {r['solver']:.3f} | {r['team']:.3f} | {r['fix']:.3f} | "
                  f"{r['break']:.3f} | {r['copy']:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
