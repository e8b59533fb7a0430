"""Supervised warm start for examples/arith_team*.yaml.

Trains one tiny model (h128, 3 layers, char tokenizer) on ``a+b=`` with two
prompt formats: the solver's ``"12+34="`` -> answer, and the verifier's
``"12+34=<proposal>>"`` -> either the proposal copied (``--verifier copy``, a
pass-through checker, the default) or the answer whatever the proposal
(``--verifier solve``, a second weak solver that sees a hint). It stops as soon as greedy solver accuracy on held-out
problems reaches ``--target`` (default 0.30), so RL starts from a weak but
non-trivial model, and writes a unimas checkpoint usable as ``init_from``.

    python examples/arith_warm_start.py            # writes examples/checkpoints/arith-warm

The result is committed, so the arithmetic examples need not run this.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch
from unimas_workflows.arithmetic import arithmetic_tasks

from unimas.config.schema import AlgorithmConfig, GenerationConfig, ModelGroupConfig, OptimConfig
from unimas.groups.base import GenRequest, GroupSpec
from unimas.groups.torch import SupervisedExample, TorchModelGroup, TorchOptions
from unimas.groups.torch.checkpoint import keep_weights_only

HERE = Path(__file__).resolve().parent


def noisy(answer: str, rng: random.Random) -> str:
    """A plausible wrong proposal: the answer shifted by 1..9 (never negative)."""
    value = int(answer) + rng.choice([d for d in range(-9, 10) if d])
    return str(abs(value))


def batch(tasks: list[dict], size: int, rng: random.Random, verifier: str) -> list[SupervisedExample]:
    examples = []
    for task in rng.sample(tasks, size):
        examples.append(SupervisedExample(prompt=task["question"], response=task["answer"]))
        proposal = task["answer"] if rng.random() < 0.5 else noisy(task["answer"], rng)
        target = proposal if verifier == "copy" else task["answer"]
        examples.append(SupervisedExample(prompt=f"{task['question']}{proposal}>", response=target))
    return examples


def solver_accuracy(group: TorchModelGroup, tasks: list[dict]) -> float:
    generation = GenerationConfig(max_new_tokens=4)
    results = group.generate([GenRequest(prompt=t["question"], generation=generation, greedy=True) for t in tasks])
    return sum(r.text.strip() == t["answer"] for r, t in zip(results, tasks)) / len(tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "checkpoints" / "arith-warm")
    parser.add_argument("--target", type=float, default=0.30)
    parser.add_argument("--max-steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verifier", choices=["copy", "solve"], default="copy")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    config = ModelGroupConfig(
        options={"tiny": dict(alphabet="0123456789+=>", hidden_size=128, num_layers=3, num_heads=4, init_std=0.05)},
        optim=OptimConfig(lr=1e-3),
    )
    # Seeded with --seed itself (not a run's per-group seed) so the committed checkpoint stays reproducible;
    # the algorithm settings are unused: this script only calls train_supervised.
    spec = GroupSpec(name="team", config=config, options=TorchOptions.model_validate(config.options), adapters=[],
                     seed=args.seed, algorithm=AlgorithmConfig())
    group = TorchModelGroup.build(spec)
    train = arithmetic_tasks("train", args.seed, size=5000)
    held_out = arithmetic_tasks("eval", args.seed, size=200)
    started = time.perf_counter()
    for step in range(1, args.max_steps + 1):
        loss = group.train_supervised(batch(train, 32, rng, args.verifier))
        if step % 50 == 0:
            accuracy = solver_accuracy(group, held_out)
            print(f"step {step}: loss {loss:.3f} solver greedy accuracy {accuracy:.3f} "
                  f"({time.perf_counter() - started:.0f}s)", flush=True)
            if accuracy >= args.target:
                break
    group.save(args.out)
    keep_weights_only(args.out)  # init_from reads weights only; keep the committed copy small
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
