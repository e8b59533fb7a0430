"""Supervised warm start for the workflow-matrix examples (examples/wf_*_cpu.yaml, docs/results.md).

Why: RL from a random tiny model on these tasks spends its whole CPU budget
finding the format. As ``examples/arith_warm_start.py`` does for the
solver -> verifier team, this trains ONE tiny character model (the
``ALPHABET`` below, h96, 2 layers) on every role's prompt format of one
workflow at once, with imperfect partner outputs in the prompts (a proposal
that is right half the time, votes that are right half the time, a corrupted
plan half the time), and stops as soon as the *monitored* greedy accuracy on
held-out prompts reaches ``--target``. The monitored prompt is the role whose
skill bounds the team (generator's first proposal; a solver's vote; the
orchestrator's combine; the planner's plan), so RL starts well above chance
and well below the ceiling. Every mapping of the matrix starts from this one
checkpoint: ``separate`` copies it per role, ``lora`` puts an adapter per role
on it, ``shared`` trains it for all roles.

    python examples/workflow_warm_start.py --workflow voting   # writes examples/checkpoints/wf-voting-warm

The checkpoints are committed, so the examples need not run this.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Callable

import torch
from unimas_workflows.plan_path import MOVES, plan_path_tasks, walk
from unimas_workflows.shapes import arithmetic_sums, rotations, verdict_for

from unimas.config.schema import AlgorithmConfig, GenerationConfig, ModelGroupConfig, OptimConfig
from unimas.groups.base import GenRequest, GroupSpec
from unimas.groups.torch import SupervisedExample, TorchModelGroup, TorchOptions

HERE = Path(__file__).resolve().parent
ALPHABET = "0123456789+=<>|?,.#SGUDLR" + "abcdefghijklmnopqrstuvwxyz" + ": \n"
"""Digits and the tasks' symbols, plus lowercase letters, ': ' and newline so a centralized critic's context
lines (``<role>: <text>\\n``) are spellable by the same tokenizer."""
MODEL = dict(architecture="qwen2", alphabet=ALPHABET, hidden_size=96, num_layers=2, num_heads=4, init_std=0.05,
             tie_embeddings=False)

Pair = tuple[str, str]


def noisy(answer: int, rng: random.Random) -> int:
    """A plausible wrong number: the answer shifted by 1..9, never negative."""
    return abs(answer + rng.choice([d for d in range(-9, 10) if d]))


def maybe_right(answer: int, rng: random.Random) -> int:
    return answer if rng.random() < 0.5 else noisy(answer, rng)


def evaluator_optimizer_pairs(task: dict, rng: random.Random) -> list[Pair]:
    q, answer = task["question"], int(task["answer"])
    proposal = maybe_right(answer, rng)
    wrong = noisy(answer, rng)
    return [(q, str(answer)),
            (f"{q}{wrong}{verdict_for(str(wrong), str(answer))}", str(answer)),
            (f"{q}{proposal}?", verdict_for(str(proposal), str(answer)))]


def voting_pairs(task: dict, rng: random.Random) -> list[Pair]:
    answer = int(task["answer"])
    view = rng.choice(rotations(task["terms"], 3))
    votes = ",".join(str(maybe_right(answer, rng)) for _ in range(3))
    return [(view, str(answer)), (f"{task['question']}{votes}>", str(answer))]


def orchestrator_workers_pairs(task: dict, rng: random.Random) -> list[Pair]:
    a, b, c, d = task["terms"]
    left, right = maybe_right(a + b, rng), maybe_right(c + d, rng)
    q = task["question"]
    return [(f"{q}|", f"{a}+{b}|{c}+{d}"), (f"{a}+{b}=", str(a + b)), (f"{c}+{d}=", str(c + d)),
            (f"{q}{left}+{right}=", str(left + right))]


def corrupted(path: str, rng: random.Random) -> str:
    """A plan that is right half the time; otherwise one move replaced, dropped or added."""
    if rng.random() < 0.5:
        return path
    moves, k = list(path), rng.randrange(len(path))
    kind = rng.randrange(3)
    if kind == 0:
        moves[k] = rng.choice([m for m in MOVES if m != moves[k]])
    elif kind == 1 and len(moves) > 1:
        del moves[k]
    else:
        moves.insert(k, rng.choice(list(MOVES)))
    return "".join(moves)


def plan_path_pairs(task: dict, rng: random.Random) -> list[Pair]:
    plan = corrupted(task["answer"], rng)
    check = walk(task["grid"], plan, task["size"])
    return [(f"{task['grid']}>", task["answer"]),
            (f"{task['grid']}>{plan}?{check}>", plan if check == "ok" else task["answer"])]


def arithmetic_monitor(tasks: list[dict]) -> list[Pair]:
    return [(t["question"], t["answer"]) for t in tasks]


def orchestrator_monitor(tasks: list[dict]) -> list[Pair]:
    """The combine step on the true partial sums: the one arithmetic the orchestrator itself must do."""
    return [(f"{t['question']}{sum(t['terms'][:2])}+{sum(t['terms'][2:])}=", t["answer"]) for t in tasks]


def planner_monitor(tasks: list[dict]) -> list[Pair]:
    return [(f"{t['grid']}>", t["answer"]) for t in tasks]


WORKFLOWS: dict[str, tuple[Callable[..., list[dict]], dict, Callable, Callable, int]] = {
    # name: dataset, its params, training pairs per task, monitored (prompt, answer) pairs, max_new_tokens
    "evaluator_optimizer": (arithmetic_sums, {"terms": 2, "max_operand": 50}, evaluator_optimizer_pairs,
                            arithmetic_monitor, 4),
    "voting": (arithmetic_sums, {"terms": 3, "max_operand": 20}, voting_pairs, arithmetic_monitor, 4),
    "orchestrator_workers": (arithmetic_sums, {"terms": 4, "max_operand": 25}, orchestrator_workers_pairs,
                             orchestrator_monitor, 4),
    "plan_path": (plan_path_tasks, {}, plan_path_pairs, planner_monitor, 8),
}


def monitored_accuracy(group: TorchModelGroup, pairs: list[Pair], max_new_tokens: int, solved) -> float:
    generation = GenerationConfig(max_new_tokens=max_new_tokens)
    results = group.generate([GenRequest(prompt=p, generation=generation, greedy=True) for p, _ in pairs])
    return sum(solved(r.text.strip(), p, a) for r, (p, a) in zip(results, pairs)) / len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflow", choices=list(WORKFLOWS), required=True)
    parser.add_argument("--out", type=Path, default=None, help="default: examples/checkpoints/wf-<workflow>-warm")
    parser.add_argument("--target", type=float, default=0.30)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    dataset, params, pairs_of, monitor, max_new_tokens = WORKFLOWS[args.workflow]
    out = args.out or HERE / "checkpoints" / f"wf-{args.workflow.replace('_', '-')}-warm"
    config = ModelGroupConfig(options={"tiny": MODEL}, optim=OptimConfig(lr=2e-3))
    # Seeded with --seed itself so the committed checkpoint is reproducible; algorithm settings are unused here.
    spec = GroupSpec(name="team", config=config, options=TorchOptions.model_validate(config.options), adapters=[],
                     seed=args.seed, algorithm=AlgorithmConfig())
    group = TorchModelGroup.build(spec)
    train = dataset("train", args.seed, **params)
    held_out = monitor(dataset("eval", args.seed, **params)[:200])
    if args.workflow == "plan_path":  # any path that reaches the goal is right, not only the shortest
        grids = {f"{t['grid']}>": t for t in dataset("eval", args.seed, **params)[:200]}
        solved = lambda text, prompt, answer: walk(grids[prompt]["grid"], text) == "ok"  # noqa: E731
    else:
        solved = lambda text, prompt, answer: text == answer  # noqa: E731
    started = time.perf_counter()
    for step in range(1, args.max_steps + 1):
        examples = [SupervisedExample(prompt=p, response=r)
                    for task in rng.sample(train, 24) for p, r in pairs_of(task, rng)]
        loss = group.train_supervised(examples)
        if step % 25 == 0:
            accuracy = monitored_accuracy(group, held_out, max_new_tokens, solved)
            print(f"step {step}: loss {loss:.3f} monitored greedy accuracy {accuracy:.3f} "
                  f"({time.perf_counter() - started:.0f}s)", flush=True)
            if accuracy >= args.target:
                break
    group.save_weights(out)  # what init_from reads; the committed copy stays small
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
