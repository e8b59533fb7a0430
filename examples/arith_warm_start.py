"""Supervised warm start for examples/arith_team*.yaml, through ``unimas warmstart``.

Writes the solver's and the verifier's (template variables, answer) pairs and fits
one tiny model (h128, 3 layers, char tokenizer) on them with
:func:`unimas.training.warm_start.warm_start`, the function behind
``unimas warmstart``, which renders each pair exactly as the role's turn in
``examples/arith_team.yaml`` does: the solver's ``"12+34="`` -> the answer, and the
verifier's ``"12+34=<proposal>>"`` -> either the proposal copied (``--verifier
copy``, a pass-through checker, the default) or the answer whatever the proposal
(``--verifier solve``, a second weak solver that sees a hint). It stops as soon as
greedy solver accuracy on held-out problems reaches ``--target`` (default 0.30), so
RL starts from a weak but non-trivial model, and writes ``OUT/team``, usable as
``init_from``::

    python examples/arith_warm_start.py --out /tmp/arith-warm     # then init_from: /tmp/arith-warm/team

The same fit from the command line, given the two pair files this script writes::

    unimas warmstart examples/arith_team.yaml --data OUT/train.jsonl --eval OUT/eval.jsonl --out OUT \\
        --set 'models.team.options={tiny: {...}}' --lr 0.001 --target 0.3

The committed examples/checkpoints/arith-warm was written by the earlier form of
this script (its own training loop); the arithmetic examples need not run this.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from unimas_workflows.arithmetic import arithmetic_tasks

from unimas.config.loading import config_from_dict, load_config
from unimas.training.warm_start import warm_start

HERE = Path(__file__).resolve().parent
MODEL = {"tiny": dict(alphabet="0123456789+=>", hidden_size=128, num_layers=3, num_heads=4, init_std=0.05)}


def noisy(answer: str, rng: random.Random) -> str:
    """A plausible wrong proposal: the answer shifted by 1..9 (never negative)."""
    value = int(answer) + rng.choice([d for d in range(-9, 10) if d])
    return str(abs(value))


def pairs(tasks: list[dict], rng: random.Random, verifier: str | None) -> list[dict]:
    """The solver's pair of each task and, unless ``verifier`` is None, one verifier pair."""
    lines = []
    for task in tasks:
        lines.append({"role": "solver", "vars": {"question": task["question"]}, "answer": task["answer"]})
        if verifier is not None:
            proposal = task["answer"] if rng.random() < 0.5 else noisy(task["answer"], rng)
            lines.append({"role": "verifier", "vars": {"question": task["question"], "proposal": proposal},
                          "answer": proposal if verifier == "copy" else task["answer"]})
    return lines


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the pair files and OUT/team")
    parser.add_argument("--target", type=float, default=0.30)
    parser.add_argument("--max-steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verifier", choices=["copy", "solve"], default="copy")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    train = write(args.out / "train.jsonl", pairs(arithmetic_tasks("train", args.seed, size=5000), rng, args.verifier))
    held_out = write(args.out / "eval.jsonl", pairs(arithmetic_tasks("eval", args.seed, size=200), rng, None))
    tree = load_config(HERE / "arith_team.yaml").model_dump(mode="json", by_alias=True)
    tree["models"]["team"]["options"] = MODEL  # a fresh model instead of the committed warm start
    warm_start(config_from_dict(tree, "examples/arith_team.yaml"), train, args.out, steps=args.max_steps,
               batch_size=32, lr=1e-3, seed=args.seed, eval_data=held_out, target=args.target, eval_every=50)


if __name__ == "__main__":
    main()
