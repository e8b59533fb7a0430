"""Supervised warm start of the built test chat model for examples/math_team_learning.yaml, through
``unimas warmstart``.

The built test chat model (``python -m unimas.testing.tiny_chat``) knows no arithmetic,
so RL from it has nothing to reinforce. This script writes (template variables, answer)
pairs on ``math_synthetic`` problems and fits the model on them with
:func:`unimas.training.warm_start.warm_start` (the function behind ``unimas warmstart``),
which renders every pair exactly as the math team's roles in
``examples/math_team_learning.yaml`` render their turns (the chat template around the
role's template, no system message), so the prompt ids match what RL will see:

* solver   ``solve: {question}`` -> the answer;
* verifier ``check: {question} = {proposal}\\nreply ok or wrong`` -> ``ok`` when
  the proposal is right, ``wrong`` otherwise (half the proposals are right,
  half are the answer shifted by 1..3);
* refiner  ``fix: {question} = {proposal}\\nobjection: wrong`` -> the answer.

It stops as soon as greedy solver accuracy on held-out problems reaches
``--target`` (default 0.35), so RL starts from a weak but non-trivial team,
and writes ``OUT/team``, a checkpoint usable as ``init_from``::

    python -m unimas.testing.tiny_chat examples/models/tiny-chat
    python examples/math_team_warm_start.py --out RUN/math-warm
    unimas train examples/math_team_learning.yaml --run-dir RUN/rl \\
        --set 'models.team.options={init_from: RUN/math-warm/team}'

(see docs/workflows/math_team.md, "Learning on CPU").
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from unimas_workflows.math_team import math_synthetic

from unimas.config.loading import config_from_dict, load_config
from unimas.training.warm_start import warm_start

HERE = Path(__file__).resolve().parent


def wrong(answer: str, rng: random.Random) -> str:
    return str(int(answer) + rng.choice([-3, -2, -1, 1, 2, 3]))


def pairs(tasks: list[dict], rng: random.Random, verifier: bool) -> list[dict]:
    """The solver's pair of each task and, with ``verifier``, one verifier and one refiner pair."""
    lines = []
    for task in tasks:
        question, answer = task["question"], task["answer"]
        lines.append({"role": "solver", "vars": {"question": question}, "answer": answer})
        if verifier:
            right = rng.random() < 0.5
            lines.append({"role": "verifier", "vars": {"question": question,
                                                       "proposal": answer if right else wrong(answer, rng)},
                          "answer": "ok" if right else "wrong"})
            lines.append({"role": "refiner", "vars": {"question": question, "proposal": wrong(answer, rng),
                                                      "objection": "wrong"}, "answer": answer})
    return lines


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=HERE / "models" / "tiny-chat",
                        help="the built test chat model (built there if missing)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the pair files and OUT/team")
    parser.add_argument("--kinds", nargs="+", default=["add"])
    parser.add_argument("--max-operand", type=int, default=9)
    parser.add_argument("--target", type=float, default=0.35)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-verifier", action="store_true", help="warm-start the solver turn only")
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        from unimas.testing.tiny_chat import build_chat_model
        build_chat_model(args.model)
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    problems = dict(max_operand=args.max_operand, kinds=args.kinds)
    train = write(args.out / "train.jsonl",
                  pairs(math_synthetic("train", args.seed, size=2000, **problems), rng, not args.no_verifier))
    held_out = write(args.out / "eval.jsonl", pairs(math_synthetic("eval", args.seed, size=64, **problems), rng, False))
    tree = load_config(HERE / "math_team_learning.yaml").model_dump(mode="json", by_alias=True)
    tree["models"]["team"]["options"] = {"path": str(args.model)}
    warm_start(config_from_dict(tree, "examples/math_team_learning.yaml"), train, args.out, steps=args.max_steps,
               batch_size=args.batch, lr=args.lr, seed=args.seed, eval_data=held_out, target=args.target,
               eval_every=25)


if __name__ == "__main__":
    main()
