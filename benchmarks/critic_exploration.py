"""Does per-role exploration give a discriminating critic more often? (issue 45, docs/credit.md)

The proposer -> critic -> reviser task of ``examples/critic_team_cpu.yaml`` (one shared tiny model), each
seed warm-started by ``examples/critic_team_warm_start.py`` (a critic that says y or n at random), then
trained under four settings:

* ``team``: the team reward only (final answer right); no per-role entropy;
* ``team+explore``: the same with ``roles.verifier.entropy_coef`` (only the critic's tokens get the bonus);
* ``per_role``: per-role credit (the critic's verdict right, the reviser's fix or break) as in the example;
  no per-role entropy;
* ``per_role+explore``: the example config as written.

The critic's **balanced accuracy** is the mean of its accept rate on right proposals and its reject rate on
wrong ones (an unreadable verdict rejects, as in the workflow), over every check of the greedy evaluation
at the end (100 held-out problems); 0.5 for a critic that ignores the proposal. A run counts as
*discriminating* when it is at least ``--threshold`` (0.7). ``role/verifier/entropy`` at the last step shows
whether the critic still explores.

    python benchmarks/critic_exploration.py --out /tmp/critic              # 3 seeds x 4 settings
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "critic_team_cpu.yaml"
TEAM_REWARDS = [{"name": "math_correct", "level": "trajectory", "weight": 1.0},
                {"name": "math_correct", "level": "trajectory", "weight": 0.0, "params": {"field": "proposal"}}]
SETTINGS: dict[str, dict[str, Any]] = {
    "team": {"rewards": TEAM_REWARDS, "roles": {"verifier": {"entropy_coef": None}}},
    "team+explore": {"rewards": TEAM_REWARDS},
    "per_role": {"roles": {"verifier": {"entropy_coef": None}}},
    "per_role+explore": {},
}


def balanced_accuracy(eval_file: Path, accept: str = "y") -> tuple[float, int, int]:
    """(balanced accuracy, right proposals checked, wrong ones) of the critic at the last evaluation."""
    records = [json.loads(line) for line in eval_file.read_text().splitlines() if line.strip()]
    last = max(r.get("step") or 0 for r in records)
    hits = {True: [], False: []}
    for record in records:
        if (record.get("step") or 0) != last:
            continue
        for check in (record.get("outcome") or {}).get("checks") or []:
            right = str(check.get("proposal")) == record["task"]["answer"]
            accepted = check.get("verdict") == accept
            hits[right].append(accepted == right)
    rates = [statistics.fmean(hits[k]) for k in (True, False) if hits[k]]
    return (statistics.fmean(rates) if len(rates) == 2 else 0.5), len(hits[True]), len(hits[False])


def run(setting: str, seed: int, out: Path, steps: int, critic_entropy: float | None = None) -> dict[str, Any]:
    import unimas

    warm = out / f"warm-{seed}"
    if not (warm / "team" / "model").is_dir():
        subprocess.run([sys.executable, str(REPO / "examples" / "critic_team_warm_start.py"), "--out", str(warm),
                        "--seed", str(seed)], check=True)
    explored = critic_entropy is not None and setting.endswith("+explore")
    run_dir = out / (f"{setting}{critic_entropy:g}-{seed}" if explored else f"{setting}-{seed}")
    from unimas.config.loading import config_from_dict, load_config

    tree = load_config(CONFIG).model_dump(mode="json", by_alias=True)
    tree["models"]["team"]["options"] = {"init_from": str(warm / "team")}  # instead of the tiny spec
    overrides = json.loads(json.dumps(SETTINGS[setting]))  # a copy: train() merges into it
    if explored:  # another strength of the critic's bonus
        overrides.setdefault("roles", {})["verifier"] = {"entropy_coef": critic_entropy}
    overrides["trainer"] = {"seed": seed, "steps": steps, "eval_every": max(steps // 3, 1)}
    overrides["logging"] = {"console": False, "report": False}
    started = time.perf_counter()
    history = unimas.train(config_from_dict(tree, str(CONFIG)), run_dir=run_dir, **overrides)
    score, right, wrong = balanced_accuracy(run_dir / "trajectories" / "eval.jsonl")
    first, _, _ = _first_eval(run_dir / "trajectories" / "eval.jsonl")
    last = [r for r in history if "role/verifier/entropy" in r][-1]
    return {"setting": setting, "seed": seed, "balanced_accuracy": score, "at_start": first,
            "right_checked": right, "wrong_checked": wrong, "team_accuracy": history[-1].get("eval/accuracy"),
            "critic_entropy": last["role/verifier/entropy"], "seconds": time.perf_counter() - started}


def _first_eval(eval_file: Path) -> tuple[float, int, int]:
    """The balanced accuracy of the step-0 evaluation (the warm start's critic)."""
    lines = [line for line in eval_file.read_text().splitlines()
             if line.strip() and (json.loads(line).get("step") or 0) == 0]
    first = eval_file.with_suffix(".step0.jsonl")
    first.write_text("\n".join(lines) + "\n")
    return balanced_accuracy(first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--threshold", type=float, default=0.7)
    parser.add_argument("--critic-entropy", type=float, help="roles.verifier.entropy_coef of the +explore settings "
                        "(default: the example config's)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        for setting in args.settings:
            result = run(setting, seed, args.out, args.steps, args.critic_entropy)
            results.append(result)
            print("RESULT " + json.dumps(result), flush=True)
    print("\n| setting | discriminating critic (balanced acc >= %.1f) | balanced accuracy per seed (start -> end) "
          "| critic entropy at the end | final team accuracy |" % args.threshold)
    print("|---|---|---|---|---|")
    for setting in args.settings:
        rows = [r for r in results if r["setting"] == setting]
        hits = sum(r["balanced_accuracy"] >= args.threshold for r in rows)
        per_seed = ", ".join(f"{r['at_start']:.2f} -> {r['balanced_accuracy']:.2f}" for r in rows)
        entropy = ", ".join(f"{r['critic_entropy']:.3f}" for r in rows)
        team = statistics.fmean(r["team_accuracy"] for r in rows)
        print(f"| {setting} | {hits} of {len(rows)} | {per_seed} | {entropy} | {team:.3f} |")


if __name__ == "__main__":
    main()
