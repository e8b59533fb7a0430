"""Supervised warm start of the built test chat model for examples/math_team_learning.yaml.

The built test chat model (``python -m unimas.testing.tiny_chat``) knows no arithmetic,
so RL from it has nothing to reinforce. This script trains it briefly on
``math_synthetic`` problems, with every prompt rendered exactly as the math
team's roles render it (the chat template around the role's template, no
system message), so the prompt ids match what RL will see:

* solver   ``solve: {question}`` -> the answer;
* verifier ``check: {question} = {proposal}\\nreply ok or wrong`` -> ``ok`` when
  the proposal is right, ``wrong`` otherwise (half the proposals are right,
  half are the answer shifted by 1..3);
* refiner  ``fix: {question} = {proposal}\\nobjection: wrong`` -> the answer.

It stops as soon as greedy solver accuracy on held-out problems reaches
``--target`` (default 0.35), so RL starts from a weak but non-trivial team,
and writes a unimas checkpoint usable as ``init_from``::

    python -m unimas.testing.tiny_chat examples/models/tiny-chat
    python examples/math_team_warm_start.py --out RUN/math-warm
    unimas train examples/math_team_learning.yaml --run-dir RUN/rl \\
        --set 'models.team.options={init_from: RUN/math-warm}'

(see docs/workflows/math_team.md, "Learning on CPU").
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch
from unimas_workflows.math_team import math_synthetic

from unimas.config.schema import (
    AlgorithmConfig,
    GenerationConfig,
    ModelGroupConfig,
    OptimConfig,
)
from unimas.groups.base import GenRequest, GroupSpec
from unimas.groups.torch import SupervisedExample, TorchModelGroup, TorchOptions
from unimas.groups.torch.checkpoint import keep_weights_only

HERE = Path(__file__).resolve().parent
SOLVER = "solve: {question}"
VERIFIER = "check: {question} = {proposal}\nreply ok or wrong"
REFINER = "fix: {question} = {proposal}\nobjection: {objection}"


def user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def rendered(group: TorchModelGroup, content: str) -> str:
    """The prompt text as a role turn renders it: chat template + generation prompt, no system message."""
    return group.tokenizer.apply_chat_template(user(content), tokenize=False, add_generation_prompt=True)


def wrong(answer: str, rng: random.Random) -> str:
    return str(int(answer) + rng.choice([-3, -2, -1, 1, 2, 3]))


def batch(group: TorchModelGroup, tasks: list[dict], size: int, rng: random.Random,
          verifier: bool) -> list[SupervisedExample]:
    examples = []
    for task in rng.sample(tasks, size):
        question, answer = task["question"], task["answer"]
        examples.append(SupervisedExample(prompt=rendered(group, SOLVER.format(question=question)), response=answer))
        if verifier:
            right = rng.random() < 0.5
            proposal = answer if right else wrong(answer, rng)
            examples.append(SupervisedExample(
                prompt=rendered(group, VERIFIER.format(question=question, proposal=proposal)),
                response="ok" if right else "wrong"))
            examples.append(SupervisedExample(
                prompt=rendered(group, REFINER.format(question=question, proposal=wrong(answer, rng),
                                                      objection="wrong")),
                response=answer))
    return examples


def solver_accuracy(group: TorchModelGroup, tasks: list[dict]) -> float:
    generation = GenerationConfig(max_new_tokens=6, require_eos=False)
    requests = [GenRequest(prompt=SOLVER.format(question=t["question"]), generation=generation, greedy=True,
                           messages=user(SOLVER.format(question=t["question"]))) for t in tasks]
    results = group.generate(requests)
    return sum(r.text.strip() == t["answer"] for r, t in zip(results, tasks)) / len(tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=HERE / "models" / "tiny-chat",
                        help="the built test chat model (built there if missing)")
    parser.add_argument("--out", type=Path, required=True, help="checkpoint dir to write (use as init_from)")
    parser.add_argument("--kinds", nargs="+", default=["add"])
    parser.add_argument("--max-operand", type=int, default=9)
    parser.add_argument("--target", type=float, default=0.35)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-verifier", action="store_true", help="warm-start the solver turn only")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if not (args.model / "config.json").exists():
        from unimas.testing.tiny_chat import build_chat_model
        build_chat_model(args.model)
    rng = random.Random(args.seed)
    config = ModelGroupConfig(options={"path": str(args.model)}, optim=OptimConfig(lr=args.lr))
    spec = GroupSpec(name="team", config=config, options=TorchOptions.model_validate(config.options), adapters=[],
                     seed=args.seed, algorithm=AlgorithmConfig())
    group = TorchModelGroup.build(spec)
    train = math_synthetic("train", args.seed, size=2000, max_operand=args.max_operand, kinds=args.kinds)
    held_out = math_synthetic("eval", args.seed, size=64, max_operand=args.max_operand, kinds=args.kinds)
    started = time.perf_counter()
    print(f"step 0: solver greedy accuracy {solver_accuracy(group, held_out):.3f}", flush=True)
    for step in range(1, args.max_steps + 1):
        loss = group.train_supervised(batch(group, train, args.batch, rng, not args.no_verifier))
        if step % 25 == 0:
            accuracy = solver_accuracy(group, held_out)
            print(f"step {step}: loss {loss:.3f} solver greedy accuracy {accuracy:.3f} "
                  f"({time.perf_counter() - started:.0f}s)", flush=True)
            if accuracy >= args.target:
                break
    group.save(args.out)
    keep_weights_only(args.out)  # init_from reads weights only
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
