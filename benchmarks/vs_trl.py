"""unimas vs TRL's GRPOTrainer on one role, equal work: `python benchmarks/vs_trl.py`.

Task ("echo"): the prompt is ``E:<letter>`` (8 letters, the informative token
last); reward 1 when the first character of the completion is the letter.
Both frameworks load the SAME tiny Qwen2 (hidden 64, 2 layers, untied
embeddings, init std 0.1) written with ``save_pretrained`` together with its
char tokenizer, and use the same prompts, prompts per step, group size,
max new tokens, temperature 1, learning rate (constant, AdamW, grad clip 1),
clipped token-mean GRPO loss with group-std advantages, no entropy bonus,
and KL either off (no reference model) or k3/low-var-KL with a reference
copy. TRL additionally gets ``suppress_tokens=[pad, bos, unk]`` so that both
sample from the same action space (unimas bans those ids in sampling and
training alike).

Every (framework, KL setting, seed) runs in a fresh subprocess, so peak RSS
is that run's alone; runs of the two frameworks alternate (A B, then B A) so
that load from other jobs on the machine hits both alike. Per-step wall time
is the median over the steps after the first (warm-up) of the time between
consecutive step ends, i.e. everything the framework does per step.
"Quality" is computed identically for both after the last step from the
trained weights: the exact expected reward of sampling (probability of the
target letter as first token, special tokens masked) and greedy accuracy.

A third worker, ``unimas-async`` (``--async-staleness``, default 1; 0 leaves
it out), runs the same unimas config with ``algorithm.max_staleness`` set and
the policy sampling in a rollout process (``options.rollout_process``), so
that the next step's episodes are sampled while this one trains: the figure
beside the synchronous one (issue 25). Its turns may be one update old, so
it does different work per step than TRL's on-policy loop; its reward is
reported beside the others so the reader can see what that costs.
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
    RoundProfiler,
    build_unimas,
    collector_as_in_training,
    emit_result,
    ensure_importable,
    frames_table,
    instrument_group,
    machine_line,
    markdown_table,
    mean,
    median,
    peak_rss_mb,
    quiet_environment,
    rss_mb,
    run_parent,
    run_worker,
    save_tiny_model,
    setup_torch,
    trl_owned,
    unimas_owned,
    warm_verl,
)

SCRIPT = Path(__file__).resolve()
LETTERS = "abcdefgh"
ALPHABET = "E:" + LETTERS
FRAMEWORKS = ("unimas", "trl")
ASYNC = "unimas-async"
"""The unimas worker with the asynchronous pipeline and a rollout process (``--async-staleness``)."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: for the test suite")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--prompts", type=int, default=16, help="prompts (tasks) per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--kl", type=float, default=0.04, help="KL coefficient of the 'with reference' runs")
    p.add_argument("--kl-settings", choices=["both", "off", "on"], default="both")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--async-staleness", type=int, default=1,
                   help="max_staleness of the unimas-async runs (rollout process on); 0: leave them out")
    p.add_argument("--profile", action="store_true",
                   help="also run one pyinstrument-profiled worker per framework (seed 0, last KL setting)")
    p.add_argument("--json", type=Path, help="also write all raw results here")
    # worker-only
    p.add_argument("--worker", choices=[*FRAMEWORKS, ASYNC], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--beta", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--profile-run", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.seeds, args.prompts, args.group, args.new_tokens = 4, [0], 4, 4, 2
        if args.kl_settings == "both":
            args.kl_settings = "on"  # the reference-model path is the superset; keeps the smoke run to 2 workers
    return args


# ---------------------------------------------------------------- shared evaluation


def policy_quality(model, tokenizer) -> dict[str, float]:
    """Exact expected first-letter reward under T=1 sampling, and greedy accuracy, over all letters."""
    import torch

    prompts = [f"E:{c}" for c in LETTERS]
    ids = torch.tensor([tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts])
    targets = torch.tensor([tokenizer.convert_tokens_to_ids(c) for c in LETTERS])
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1].float()
    model.train(was_training)
    banned = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id} - {None, tokenizer.eos_token_id}
    logits[:, sorted(banned)] = float("-inf")
    probs = logits.softmax(-1)
    rows = torch.arange(len(LETTERS))
    return {"expected_reward": float(probs[rows, targets].mean()),
            "greedy_accuracy": float((logits.argmax(-1) == targets).float().mean())}


def summarise_steps(step_s: list[float], tokens: list[float], rewards: list[float], phases: list[dict]) -> dict:
    steady = slice(1, None) if len(step_s) > 1 else slice(None)
    keys = sorted({k for p in phases for k in p})
    return {
        "step_s": step_s,
        "median_step_s": median(step_s[steady]),
        "tokens_per_s": sum(tokens[steady]) / sum(step_s[steady]),
        "tokens_per_step": mean(tokens),
        "train_reward_last5": mean(rewards[-5:]),
        "train_rewards": rewards,
        "phase_median_s": {k: median(p.get(k, 0.0) for p in phases[steady]) for k in keys},
    }


# ---------------------------------------------------------------- workers


def profile_every(steps: int, rounds: int = 5) -> int:
    """Steps per profiling round: steps 2..N split into ``rounds`` rounds."""
    return max(1, (steps - 1) // rounds)


def worker_unimas(a: argparse.Namespace) -> dict:
    quiet_environment(a.threads)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    setup_torch(a.threads, a.seed)
    rss_common = rss_mb()
    ensure_importable()
    from unimas.output.metrics import MetricsWriter
    from unimas.training.trainer import Trainer  # noqa: F401

    warm_verl()
    rss_imports = rss_mb()
    tree = {
        "name": "bench-vs-trl",
        "plugins": ["benchmarks.bench_workflows"],
        "models": {"policy": {"backend": "torch", "options": {"path": str(a.model_dir)}, "optim": {"lr": a.lr}}},
        "roles": {"echo": {"model": "policy", "template": "E:{target}",
                           "generation": {"max_new_tokens": a.new_tokens, "temperature": 1.0, "require_eos": False}}},
        "workflow": {"name": "bench_echo"},
        "data": {"name": "bench_letters", "params": {"letters": LETTERS}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "grouping": "role", "group_size": a.group, "loss": "vanilla",
                      "loss_agg_mode": "token-mean", "kl_coef": a.beta, "kl_type": "low_var_kl",
                      "entropy_coef": 0.0},
        "trainer": {"steps": a.steps, "seed": a.seed, "tasks_per_step": a.prompts, "torch_threads": a.threads},
        "logging": {"console": False, "report": False},
    }
    if a.worker == ASYNC:
        tree["algorithm"]["max_staleness"] = a.async_staleness
        tree["models"]["policy"]["options"]["rollout_process"] = True
    phases = Phases()
    with tempfile.TemporaryDirectory() as tmp:
        trainer, transport = build_unimas(tree, Path(tmp) / "run", phases)
        group = transport.groups["policy"]
        instrument_group(group, phases)
        before = policy_quality(group.policy.model, group.policy.tokenizer)
        step_s, tokens, rewards, per_step, midway = [], [], [], [], {}
        profiler = RoundProfiler(unimas_owned)

        async def loop() -> None:
            writer = MetricsWriter(trainer.run_dir.metrics)
            phases.reset()
            last = time.perf_counter()
            for step in range(a.steps):
                if a.profile_run and step >= 1 and (step - 1) % profile_every(a.steps) == 0:
                    profiler.tick()  # rounds start after the warm-up step
                record = await trainer.train_step(step)
                writer.write(record)
                now = time.perf_counter()
                step_s.append(now - last)
                last = now
                tokens.append(record["group/policy/tokens"])
                rewards.append(record["reward/mean"])
                per_step.append(phases.reset())
                if step + 1 == a.steps // 2:  # outside the timed interval
                    midway.update(policy_quality(group.policy.model, group.policy.tokenizer))
                    last = time.perf_counter()
            writer.close()
            await trainer.pipeline.close()  # the asynchronous pipeline's rollouts sampled ahead

        with collector_as_in_training():
            asyncio.run(loop())
        profiler.finish()
        after = policy_quality(group.policy.model, group.policy.tokenizer)
        replica_mb = replica_peak_rss_mb(group.sampler.replica) if hasattr(group.sampler, "replica") else 0.0
    return {"framework": a.worker, "profile": profiler.frames() if a.profile_run else None, "seed": a.seed,
            "beta": a.beta, "quality_before": before, "quality_midway": midway, "quality": after,
            "rss_common_mb": rss_common, "rss_imports_mb": rss_imports, "peak_rss_mb": peak_rss_mb() + replica_mb,
            "replica_peak_rss_mb": replica_mb, **summarise_steps(step_s, tokens, rewards, per_step)}


def replica_peak_rss_mb(replica) -> float:
    """Peak RSS of a rollout process (``VmHWM``, Linux), MiB: added to the worker's own, so the async row's memory
    includes its second interpreter (the shared weight pages then count twice: an upper bound)."""
    for line in Path(f"/proc/{replica.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker_trl(a: argparse.Namespace) -> dict:
    quiet_environment(a.threads)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    setup_torch(a.threads, a.seed)
    rss_common = rss_mb()
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.bench_workflows import first_char

    rss_imports = rss_mb()
    tokenizer = AutoTokenizer.from_pretrained(a.model_dir, local_files_only=True, padding_side="left")
    repeat = max(1, (a.steps * a.prompts) // len(LETTERS) + 1)
    dataset = Dataset.from_list([{"prompt": f"E:{c}", "target": c} for c in LETTERS] * repeat)
    rewards, tokens, step_s, per_step, midway = [], [], [], [], {}
    profiler = RoundProfiler(trl_owned)
    phases = Phases()

    def first_letter(completions, target, completion_ids, **_):
        values = [float(first_char(c) == t) for c, t in zip(completions, target)]
        rewards.append(mean(values))
        tokens.append(float(sum(len(ids) for ids in completion_ids)))
        return values

    class StepClock(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            phases.reset()
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            now = time.perf_counter()
            step_s.append(now - self.last)
            self.last = now
            per_step.append(phases.reset())
            if state.global_step == a.steps // 2:  # outside the timed interval
                midway.update(policy_quality(model, tokenizer))
                self.last = time.perf_counter()
            if a.profile_run and state.global_step >= 1 and (state.global_step - 1) % profile_every(a.steps) == 0:
                profiler.tick()  # rounds start after the warm-up step

        def on_train_end(self, *args, **kwargs):
            profiler.finish()

    banned = sorted({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id}
                    - {None, tokenizer.eos_token_id})
    # Older TRL has no entropy bonus at all, which is the same as entropy_coef=0 here.
    optional = {"entropy_coef": 0.0} if "entropy_coef" in GRPOConfig.__dataclass_fields__ else {}
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp, seed=a.seed, data_seed=a.seed, max_steps=a.steps,
            per_device_train_batch_size=a.prompts * a.group, gradient_accumulation_steps=1,
            num_generations=a.group, max_completion_length=a.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            beta=a.beta, num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group",
            use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, model_init_kwargs={"dtype": "float32"},
            generation_kwargs={"suppress_tokens": banned}, report_to="none", save_strategy="no", logging_steps=10,
            disable_tqdm=True, dataloader_num_workers=0, log_completions=False, **optional,
        )
        trainer = GRPOTrainer(model=str(a.model_dir), reward_funcs=first_letter, args=config,
                              train_dataset=dataset, processing_class=tokenizer, callbacks=[StepClock()])
        _instrument_trl(trainer, phases)
        model = trainer.accelerator.unwrap_model(trainer.model)
        before = policy_quality(model, tokenizer)
        trainer.train()
        after = policy_quality(trainer.accelerator.unwrap_model(trainer.model), tokenizer)
    # TRL calls the reward function once per step (generation batch = training batch).
    assert len(rewards) == len(step_s) == a.steps, (len(rewards), len(step_s))
    return {"framework": "trl", "profile": profiler.frames() if a.profile_run else None, "seed": a.seed,
            "beta": a.beta, "quality_before": before, "quality_midway": midway, "quality": after,
            "rss_common_mb": rss_common, "rss_imports_mb": rss_imports, "peak_rss_mb": peak_rss_mb(),
            **summarise_steps(step_s, tokens, rewards, per_step)}


def _instrument_trl(trainer, phases: Phases) -> None:
    """Time TRL's generation and its log-prob passes (bound methods of this trainer instance only)."""
    import torch

    generate = getattr(trainer, "_generate_single_turn", None)
    if generate is not None:
        def timed_generate(*args, **kwargs):
            with phases.phase("generate"):
                return generate(*args, **kwargs)

        trainer._generate_single_turn = timed_generate
    logps = getattr(trainer, "_get_per_token_logps_and_entropies", None)
    if logps is not None:
        def timed_logps(model, *args, **kwargs):
            if model is trainer.ref_model and model is not None:
                name = "ref_fwd"
            elif torch.is_grad_enabled():
                name = "policy_fwd"
            else:
                name = "old_logp_fwd"
            with phases.phase(name):
                return logps(model, *args, **kwargs)

        trainer._get_per_token_logps_and_entropies = timed_logps


# ---------------------------------------------------------------- parent


def run_all(args: argparse.Namespace) -> list[dict]:
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        sys.exit("TRL is not installed: pip install -e '.[bench]'")
    betas = {"both": [0.0, args.kl], "off": [0.0], "on": [args.kl]}[args.kl_settings]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dirs = {seed: save_tiny_model(Path(tmp) / f"model-s{seed}", ALPHABET, hidden=args.hidden,
                                            layers=args.layers, heads=4, init_std=0.1, tie=False, seed=seed)
                      for seed in args.seeds}

        def worker(framework: str, seed: int, beta: float, *extra: str) -> dict:
            return run_worker(SCRIPT, [
                "--worker", framework, "--model-dir", str(model_dirs[seed]), "--seed", str(seed), "--beta", str(beta),
                "--steps", str(args.steps), "--prompts", str(args.prompts), "--group", str(args.group),
                "--new-tokens", str(args.new_tokens), "--lr", str(args.lr), "--threads", str(args.threads),
                "--async-staleness", str(args.async_staleness), *extra])

        frameworks = (*FRAMEWORKS, ASYNC) if args.async_staleness > 0 else FRAMEWORKS
        flip = False
        for beta in betas:
            for seed in args.seeds:
                order = frameworks[::-1] if flip else frameworks
                flip = not flip
                for framework in order:
                    result = worker(framework, seed, beta)
                    print(f"  {framework:12s} beta={beta:<5g} seed={seed}: {1000 * result['median_step_s']:.1f} "
                          f"ms/step, expected reward {result['quality_before']['expected_reward']:.3f} -> "
                          f"{result['quality']['expected_reward']:.3f}", file=sys.stderr, flush=True)
                    results.append(result)
        if args.profile:
            for framework in FRAMEWORKS:
                results.append(dict(worker(framework, args.seeds[0], betas[-1], "--profile-run"), profiled=True))
    return results


def report(args: argparse.Namespace, results: list[dict]) -> str:
    lines = ["### unimas vs TRL GRPOTrainer — one role, equal work",
             "",
             f"{args.prompts} prompts × {args.group} completions × ≤{args.new_tokens} new tokens per step, "
             f"{args.steps} steps, lr {args.lr:g}, seeds {args.seeds}; tiny Qwen2 h{args.hidden} L{args.layers} "
             f"(untied, init 0.1). {machine_line(args.threads)}.",
             "",
             "Step time: median over steps 2..N of each run, then median over seeds. Peak RSS: whole worker "
             "process (raw) and net of the RSS after `import torch, transformers` in that process. Reward: "
             "exact expected reward of T=1 sampling after the last step (mean over seeds), greedy accuracy "
             "over the 8 letters, and the logged training reward of the last 5 steps. unimas-async: "
             "`algorithm.max_staleness` and a rollout process (its peak RSS added to the worker's).",
             ""]
    headers = ["KL", "framework", "step ms (median)", "tokens/s", "gen ms", "ref fwd ms", "policy fwd ms",
               "peak RSS MB (raw)", "peak RSS MB (net)", "expected reward @0",
               f"expected reward @{args.steps // 2}", f"expected reward @{args.steps}",
               f"greedy acc @{args.steps}", "train reward (last 5)"]
    rows, ratio_rows = [], []
    for beta in sorted({r["beta"] for r in results}):
        label = "off (no ref)" if beta == 0 else f"{beta:g} (ref model)"
        by_fw = {fw: [r for r in results if r["framework"] == fw and r["beta"] == beta and not r.get("profiled")]
                 for fw in (*FRAMEWORKS, ASYNC)}
        for fw in (*FRAMEWORKS, ASYNC):
            runs = by_fw[fw]
            if not runs:
                continue
            ph = lambda k: 1000 * median(r["phase_median_s"].get(k, 0.0) for r in runs)  # noqa: E731
            rows.append([label, fw, 1000 * median(r["median_step_s"] for r in runs),
                         median(r["tokens_per_s"] for r in runs), ph("generate"), ph("ref_fwd"), ph("policy_fwd"),
                         median(r["peak_rss_mb"] for r in runs),
                         median(r["peak_rss_mb"] - r["rss_common_mb"] for r in runs),
                         mean(r["quality_before"]["expected_reward"] for r in runs),
                         mean(r["quality_midway"].get("expected_reward", float("nan")) for r in runs),
                         mean(r["quality"]["expected_reward"] for r in runs),
                         mean(r["quality"]["greedy_accuracy"] for r in runs),
                         mean(r["train_reward_last5"] for r in runs)])
        for name, fw in (("unimas", "unimas"), (f"unimas async (max_staleness {args.async_staleness})", ASYNC)):
            pairs = [(u, t) for u in by_fw[fw] for t in by_fw["trl"] if u["seed"] == t["seed"]]
            if not pairs:
                continue
            time_ratio = median(u["median_step_s"] / t["median_step_s"] for u, t in pairs)
            tok_ratio = median(u["tokens_per_s"] / t["tokens_per_s"] for u, t in pairs)
            mem_ratio = median((u["peak_rss_mb"] - u["rss_common_mb"]) / (t["peak_rss_mb"] - t["rss_common_mb"])
                               for u, t in pairs)
            reward_u = mean(u["quality"]["expected_reward"] for u, _ in pairs)
            reward_t = mean(t["quality"]["expected_reward"] for _, t in pairs)
            ratio_rows.append([label, name, time_ratio, tok_ratio, mem_ratio, f"{reward_u:.3f} vs {reward_t:.3f}",
                               "yes" if time_ratio <= 0.7 else "no",
                               "yes" if reward_u >= reward_t else "no"])
    lines.append(markdown_table(headers, rows))
    lines += ["", "Ratios unimas / TRL (median over seeds of per-seed ratios):", ""]
    lines.append(markdown_table(["KL", "unimas", "step time", "tokens/s", "peak RSS (net)", "expected reward (mean)",
                                 "time ≤ 0.7×", "reward ≥ TRL"], ratio_rows))
    seed_rows = []
    for beta in sorted({r["beta"] for r in results}):
        for seed in args.seeds:
            pair = {r["framework"]: r for r in results
                    if r["beta"] == beta and r["seed"] == seed and not r.get("profiled")}
            if "unimas" in pair and "trl" in pair:
                u, t = pair["unimas"], pair["trl"]
                seed_rows.append([f"{beta:g}", seed, 1000 * u["median_step_s"], 1000 * t["median_step_s"],
                                  u["median_step_s"] / t["median_step_s"],
                                  u["quality_midway"].get("expected_reward", float("nan")),
                                  t["quality_midway"].get("expected_reward", float("nan")),
                                  u["quality"]["expected_reward"], t["quality"]["expected_reward"]])
    if seed_rows:
        lines += ["", "Per seed (the spread between seeds is the noise level of the reward comparison):", "",
                  markdown_table(["KL", "seed", "unimas ms", "TRL ms", "ratio", f"unimas reward @{args.steps // 2}",
                                  f"TRL reward @{args.steps // 2}", f"unimas reward @{args.steps}",
                                  f"TRL reward @{args.steps}"], seed_rows)]
    for r in results:
        if r.get("profiled") and r.get("profile"):
            owner = "unimas" if r["framework"] == "unimas" else "TRL"
            lines += ["", f"pyinstrument, {r['framework']} (KL {r['beta']:g}, steps 2..{args.steps} of a separate "
                          f"profiled run, in rounds of {profile_every(args.steps)} steps): time attributed to the "
                          f"innermost {owner} frame, median share over rounds:", "",
                      frames_table(r["profile"][:12])]
    start = {}
    for r in results:
        start.setdefault(r["seed"], set()).add(round(r["quality_before"]["expected_reward"], 4))
    if any(len(values) > 1 for values in start.values()):
        lines += ["", "WARNING: the two frameworks did not start from the same weights."]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker = worker_trl if args.worker == "trl" else worker_unimas
        emit_result(worker(args))
        return 0
    return run_parent(args, run_all, report)


if __name__ == "__main__":
    sys.exit(main())
