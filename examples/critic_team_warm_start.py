"""Supervised warm start for examples/critic_team_cpu.yaml, through ``unimas warmstart``.

Writes the (role, template variables, answer) pairs of the proposer -> critic ->
reviser task and fits the config's shared model on them with
:func:`unimas.training.warm_start.warm_start` (the function behind
``unimas warmstart``), which renders every pair exactly as the role's turn does:

* proposer (``solver``)  ``12+7=``    -> the sum;
* critic (``verifier``)  ``12+7=19?`` -> ``y`` or ``n`` *at random*, half each, whatever the proposal: the
  critic learns the format and samples both verdicts, but starts with no judgement (balanced accuracy 0.5),
  which is what RL has to teach it;
* reviser (``refiner``)  ``12+7=18!`` -> the sum (a second solver that sees a proposal, right or wrong).

Proposals in the critic's and reviser's prompts are right half the time, else the sum shifted by 1..5. It
stops once the proposer's greedy accuracy on held-out problems reaches ``--target`` (default 0.4), so RL
starts from a team that is often wrong::

    python examples/critic_team_warm_start.py --out RUN/warm     # writes RUN/warm/team and RUN/warm/*.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from unimas_workflows.arithmetic import arithmetic_tasks

from unimas.training.warm_start import warm_start

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "critic_team_cpu.yaml"


def wrong(answer: str, rng: random.Random) -> str:
    """A plausible wrong proposal: the sum shifted by 1..5, never negative."""
    return str(abs(int(answer) + rng.choice([-5, -4, -3, -2, -1, 1, 2, 3, 4, 5])))


def pairs(tasks: list[dict], rng: random.Random, solver_only: bool = False) -> list[dict]:
    lines = []
    for task in tasks:
        question, answer = task["question"], task["answer"]
        lines.append({"role": "solver", "vars": {"question": question}, "answer": answer})
        if solver_only:
            continue
        proposal = answer if rng.random() < 0.5 else wrong(answer, rng)
        lines.append({"role": "verifier", "vars": {"question": question, "proposal": proposal},
                      "answer": rng.choice("yn")})
        proposal = answer if rng.random() < 0.5 else wrong(answer, rng)
        lines.append({"role": "refiner", "vars": {"question": question, "proposal": proposal}, "answer": answer})
    return lines


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the pairs and OUT/team")
    parser.add_argument("--target", type=float, default=0.4)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    train = write(args.out / "train.jsonl", pairs(arithmetic_tasks("train", args.seed, 30, 3000), rng))
    held_out = write(args.out / "eval.jsonl", pairs(arithmetic_tasks("eval", args.seed, 30, 100), rng, True))
    # the same as: unimas warmstart examples/critic_team_cpu.yaml --data train.jsonl --eval eval.jsonl ...
    warm_start(CONFIG, train, args.out, steps=args.steps, batch_size=48, lr=2e-3, seed=args.seed,
               eval_data=held_out, target=args.target, eval_every=50)


if __name__ == "__main__":
    main()
