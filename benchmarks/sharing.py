"""Sharing schemes: peak memory and step time, `python benchmarks/sharing.py`.

The same 3-role ``bench_relay`` workflow (speaker -> relay -> listener, 64
episodes per step, ≤4 tokens per turn, KL to a reference on) under

* ``shared``   — one model group, all three roles on it (full sharing);
* ``separate`` — one model group per role (full separation);
* ``lora``     — one frozen base, one LoRA adapter per role (r 8 on q/k/v/o);

against two single-role controls on one model:

* ``one_role`` — ONE role doing the same work (``bench_chain``: the role
  acts three times per episode with exactly the relay's prompts, so turns,
  tokens and batch shapes are the same). This is "one role alone" for the
  ratios and targets: the difference to it is what the mapping costs.
* ``first_role`` — the speaker alone (``bench_echo``, one turn per episode,
  a third of the work): shown for scale, not used in ratios.

Each (scheme, model size, repetition) runs in a fresh subprocess, so peak
RSS is that configuration's alone. Every worker imports the same modules
(torch, transformers, peft, unimas, verl) before measuring its baseline, so
baselines are comparable. Definitions:

* peak (raw) — ``ru_maxrss`` of the worker process;
* net — peak minus the worker's RSS after all imports, before any model is
  built: the memory the scheme itself costs (weights, optimiser state,
  gradients, reference copies, activations, trajectories, allocator slack);
* ratio — net of a scheme / net of ``one_role`` of the same size (median
  over repetitions of per-repetition ratios).

Repetitions rotate the order of the schemes so that machine load hits all
alike.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    Phases,
    build_unimas,
    collector_as_in_training,
    emit_result,
    machine_line,
    markdown_table,
    median,
    peak_rss_mb,
    quiet_environment,
    rss_mb,
    run_parent,
    run_worker,
    setup_torch,
    warm_verl,
)

SCRIPT = Path(__file__).resolve()
LETTERS = "abcdefgh"
ALPHABET = "SRL:" + LETTERS
SCHEMES = ("one_role", "first_role", "shared", "separate", "lora")
# name -> (hidden, layers, tasks per step or None for --tasks). "wide" has 4x fewer episodes so that weights,
# gradients, optimiser state and reference copies (not activations) dominate memory, as in real LLM training.
SIZES = {"tiny": (64, 2, None), "small": (256, 4, None), "wide": (512, 4, 2)}
TARGETS = {"shared": 1.1, "lora": 1.2}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: for the test suite")
    p.add_argument("--sizes", nargs="+", default=["tiny", "small", "wide"], choices=sorted(SIZES))
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--steps", type=int, default=4, help="measured steps per worker (after 2 warm-up)")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--kl", type=float, default=0.04)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    # worker-only
    p.add_argument("--worker", choices=SCHEMES + ("all",), help=argparse.SUPPRESS)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes, args.reps, args.steps, args.tasks, args.group, args.new_tokens = ["tiny"], 1, 1, 2, 2, 2
    return args


def scheme_config(scheme: str, size: str, args: argparse.Namespace) -> dict:
    hidden, layers, tasks = SIZES[size]
    tiny = {"architecture": "qwen2", "alphabet": ALPHABET, "hidden_size": hidden, "num_layers": layers,
            "num_heads": 4, "init_std": 0.1, "tie_embeddings": False, "max_positions": 64}
    templates = {"speaker": "S:{target}", "relay": "R:{message}", "listener": "L:{message}"}
    gen = {"max_new_tokens": args.new_tokens, "temperature": 1.0, "require_eos": False}
    roles = {r: {"template": t, "generation": gen} for r, t in templates.items()}
    workflow = {"name": "bench_relay"}
    if scheme == "one_role":
        models = {"solo_model": {"options": {"tiny": tiny}}}
        roles = {"solo": {"template": "{tag}:{message}", "generation": gen, "model": "solo_model"}}
        workflow = {"name": "bench_chain", "params": {"role": "solo"}}
    elif scheme == "first_role":
        models = {"speaker_model": {"options": {"tiny": tiny}}}
        roles = {"speaker": dict(roles["speaker"], model="speaker_model")}
        workflow = {"name": "bench_echo", "params": {"role": "speaker"}}
    elif scheme == "shared":
        models = {"shared": {"options": {"tiny": tiny}}}
        for spec in roles.values():
            spec["model"] = "shared"
    elif scheme == "separate":
        models = {f"{r}_model": {"options": {"tiny": tiny}} for r in roles}
        for r, spec in roles.items():
            spec["model"] = f"{r}_model"
    else:
        models = {"base": {"options": {"tiny": tiny}, "lora": {"r": 8, "alpha": 16}}}
        for r, spec in roles.items():
            spec.update(model="base", adapter=r)
    return {
        "name": f"bench-sharing-{scheme}",
        "plugins": ["benchmarks.bench_workflows"],
        "models": models,
        "roles": roles,
        "workflow": workflow,
        "data": {"name": "bench_letters", "params": {"letters": LETTERS}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"group_size": args.group, "kl_coef": args.kl, "entropy_coef": 0.0},
        "trainer": {"seed": 0, "tasks_per_step": tasks or args.tasks, "torch_threads": args.threads},
        "logging": {"console": False, "report": False},
    }


def worker(args: argparse.Namespace, scheme: str) -> dict:
    quiet_environment(args.threads)
    import peft  # noqa: F401  (every scheme imports the same modules before the baseline)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    setup_torch(args.threads)
    from unimas.training.trainer import Trainer  # noqa: F401

    warm_verl()
    rss_imports = rss_mb()
    phases = Phases()
    step_s = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer, transport = build_unimas(scheme_config(scheme, args.size, args), Path(tmp) / "run", phases)
        rss_built = rss_mb()
        params = {g: transport.groups[g].num_parameters() for g in sorted(transport.groups)}

        async def loop() -> None:
            for step in range(2 + args.steps):
                started = time.perf_counter()
                await trainer.train_step(step)
                if step >= 2:
                    step_s.append(time.perf_counter() - started)

        with collector_as_in_training():
            asyncio.run(loop())
    return {"scheme": scheme, "size": args.size, "rss_imports_mb": rss_imports, "rss_built_mb": rss_built,
            "peak_rss_mb": peak_rss_mb(), "median_step_s": median(step_s), "step_s": step_s, "params": params}


def run_all(args: argparse.Namespace) -> list[dict]:
    results = []
    if args.smoke:
        # Seconds, not minutes: every scheme in ONE worker process (its memory numbers are then meaningless;
        # the smoke run only proves that the script, the worker protocol and every scheme's config work).
        payload = run_worker(SCRIPT, ["--worker", "all", "--size", "tiny", "--steps", str(args.steps),
                                      "--tasks", str(args.tasks), "--group", str(args.group),
                                      "--new-tokens", str(args.new_tokens), "--kl", str(args.kl),
                                      "--threads", str(args.threads)])
        return [dict(r, rep=0) for r in payload["results"]]
    for rep in range(args.reps):
        for size in args.sizes:
            order = SCHEMES[rep % len(SCHEMES):] + SCHEMES[:rep % len(SCHEMES)]
            for scheme in order:
                result = run_worker(SCRIPT, ["--worker", scheme, "--size", size, "--steps", str(args.steps),
                                             "--tasks", str(args.tasks), "--group", str(args.group),
                                             "--new-tokens", str(args.new_tokens), "--kl", str(args.kl),
                                             "--threads", str(args.threads)])
                result["rep"] = rep
                net = result["peak_rss_mb"] - result["rss_imports_mb"]
                print(f"  rep {rep} {size:5s} {scheme:8s}: net peak {net:.1f} MB, "
                      f"{1000 * result['median_step_s']:.0f} ms/step", file=sys.stderr, flush=True)
                results.append(result)
    return results


def report(args: argparse.Namespace, results: list[dict]) -> str:
    episodes = args.tasks * args.group
    lines = ["### Sharing schemes — 3-role relay vs one role alone",
             "",
             f"{episodes} episodes per step (unless the size says otherwise), ≤{args.new_tokens} new tokens per "
             f"turn, KL {args.kl:g} (reference on: a copy per full model group, the adapters-off base for LoRA), "
             f"{args.reps} repetition(s) × {args.steps} measured steps per worker, each configuration in a fresh "
             "process. "
             f"{machine_line(args.threads)}.",
             "",
             "net = peak RSS − RSS after imports (same imports in every worker); ratio = net / net of one_role "
             "(one role doing the same turns with the same prompts on one model) of the same size, median over "
             "repetitions of per-repetition ratios. Step time: median step, same ratio. first_role = the speaker "
             "alone (a third of the work), for scale.",
             ""]
    headers = ["size", "scheme", "params (total / trainable)", "peak RSS MB (raw)", "net MB", "net ratio vs one role",
               "target", "met", "step ms", "step ratio vs one role"]
    rows = []
    for size in args.sizes:
        hidden, layers, tasks = SIZES[size]
        base = {r["rep"]: r for r in results if r["size"] == size and r["scheme"] == "one_role"}
        for scheme in SCHEMES:
            runs = [r for r in results if r["size"] == size and r["scheme"] == scheme]
            if not runs:
                continue
            net = lambda r: r["peak_rss_mb"] - r["rss_imports_mb"]  # noqa: E731
            ratio = median(net(r) / net(base[r["rep"]]) for r in runs if r["rep"] in base)
            step_ratio = median(r["median_step_s"] / base[r["rep"]]["median_step_s"] for r in runs if r["rep"] in base)
            total = sum(p.get("total", 0) for p in runs[0]["params"].values())
            trainable = sum(p.get("trainable", 0) for p in runs[0]["params"].values())
            target = TARGETS.get(scheme)
            label = f"{size} (h{hidden} L{layers}, {(tasks or args.tasks) * args.group} ep.)"
            rows.append([label, scheme, f"{total:,} / {trainable:,}",
                         median(r["peak_rss_mb"] for r in runs), median(net(r) for r in runs), ratio,
                         f"≤ {target}×" if target else "–",
                         ("yes" if ratio <= target else "no") if target else "–",
                         1000 * median(r["median_step_s"] for r in runs), step_ratio])
    lines.append(markdown_table(headers, rows))
    if args.smoke:
        lines += ["", "(smoke run: all schemes shared one worker process, so its memory numbers mean nothing)"]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker == "all":
        emit_result({"results": [worker(args, scheme) for scheme in SCHEMES]})
        return 0
    if args.worker:
        emit_result(worker(args, args.worker))
        return 0
    return run_parent(args, run_all, report)


if __name__ == "__main__":
    sys.exit(main())
