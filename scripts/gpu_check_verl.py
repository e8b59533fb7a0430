"""GPU check of the verl backend, sized for one H100/H200-class GPU with no network (models are built here).

Tier A (default; engine only, no vLLM): two verl model groups, each a random-init
Qwen2 of 0.5B shape (hidden 896, 24 layers), FSDP2 with bf16 compute, in one
process. Per group it checks and reports:

* trainer log-probs vs a plain Hugging Face forward on the same tokens;
* that a GRPO-style update raises the log-probs of positive-advantage rows and
  lowers the negative ones;
* per-tensor weight export (verl's ``get_per_tensor_param``): names and shapes
  equal the Hugging Face state dict, and the rollout that loads them scores the
  trained tokens like the trainer (the weight-sync check);
* save -> update -> load restores the log-probs;
* that the other group's log-probs did not move;
* update wall time and peak GPU memory.

``--tiny`` shrinks the model so the same checks run on a CPU (CI exercises it).
Tier B (``--vllm``, two vLLM hybrid groups on one GPU) needs the ``unimas[gpu]``
stack; until the vLLM rollout is wired into the group it reports that and exits 2.

    python scripts/gpu_check_verl.py            # tier A on a GPU
    python scripts/gpu_check_verl.py --tiny     # the same checks, tiny shape, CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from unimas import algorithms
from unimas.config import AlgorithmConfig, ModelGroupConfig, OptimConfig
from unimas.groups.base import GroupSpec, TrainTurn
from unimas.groups.torch.chars import build_char_tokenizer
from unimas.groups.verl.group import VerlModelGroup
from unimas.groups.verl.options import VerlOptions
from unimas.registry import build_registry

SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=64, tie_word_embeddings=False),
}
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789:+= "


def build_model_dir(root: Path, shape: str, seed: int) -> str:
    """A random-init Qwen2 of ``shape`` with a char tokenizer, saved as a Hugging Face dir."""
    tokenizer = build_char_tokenizer(ALPHABET)
    config = Qwen2Config(max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         initializer_range=0.05, **SHAPES[shape])
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(root)
    tokenizer.save_pretrained(root)
    return str(root)


def build_group(name: str, model_dir: str, dtype: str, seed: int) -> VerlModelGroup:
    options = VerlOptions(path=model_dir, dtype=dtype, sync_tolerance=1e-5 if dtype == "float32" else 0.2)
    config = ModelGroupConfig(backend="verl", options=options.model_dump(), optim=OptimConfig(lr=1e-4),
                              resources={"gpus": 0.5 if torch.cuda.is_available() else 0})
    algorithm = AlgorithmConfig(entropy_coef=0.0)
    loss = algorithms.resolve_policy_loss(algorithm.loss, build_registry())
    spec = GroupSpec(name=name, config=config, options=options, adapters=[], seed=seed, algorithm=algorithm,
                     policy_loss=loss, total_updates=10)
    return VerlModelGroup.build(spec)


def fixed_turns(tokenizer, rows: int) -> list[TrainTurn]:
    """Deterministic prompt/response pairs; advantages alternate +1 / -1."""
    turns = []
    for i in range(rows):
        prompt = tokenizer(f"{i}+{i * 7 % 10}=", add_special_tokens=False)["input_ids"]
        response = tokenizer(f"{(i * 13) % 97} ok {i}", add_special_tokens=False)["input_ids"]
        turns.append(TrainTurn(prompt, response, [], advantage=1.0 if i % 2 == 0 else -1.0))
    return turns


def hf_logprobs(model_dir: str, turns: list[TrainTurn], dtype: torch.dtype, device: str) -> list[list[float]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device)
    out = []
    with torch.no_grad():
        for turn in turns:
            ids = torch.tensor([turn.prompt_ids + turn.response_ids], device=device)
            logits = model(input_ids=ids).logits[0, len(turn.prompt_ids) - 1:-1].float()
            target = torch.tensor(turn.response_ids, device=device)[:, None]
            out.append(logits.log_softmax(-1).gather(-1, target).squeeze(-1).tolist())
    del model
    return out


def max_abs(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row, other in zip(a, b) for x, y in zip(row, other))


def mean_abs(a: list[list[float]], b: list[list[float]]) -> float:
    pairs = [abs(x - y) for row, other in zip(a, b) for x, y in zip(row, other)]
    return sum(pairs) / len(pairs)


def check_group(group: VerlModelGroup, other: VerlModelGroup, model_dir: str, turns: list[TrainTurn],
                work: Path, bf16: bool) -> dict:
    cuda = torch.cuda.is_available()
    report: dict = {}
    before = group.trainer_logprobs(turns)
    reference = hf_logprobs(model_dir, turns, torch.float32, "cuda" if cuda else "cpu")
    report["logprob_vs_hf_mean_abs"] = mean_abs(before, reference)
    report["logprob_vs_hf_ok"] = report["logprob_vs_hf_mean_abs"] < (2e-2 if bf16 else 1e-5)

    exported, _ = group.actor.engine.get_per_tensor_param()
    names = {name: tuple(tensor.shape) for name, tensor in exported}
    hf_state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    expected = {k: tuple(v.shape) for k, v in hf_state.items() if not (k == "lm_head.weight" and k not in names)}
    report["export_matches_hf_state_dict"] = names == expected

    other_before = other.trainer_logprobs(turns[:2])
    group.save(work / group.name)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    metrics = group.update(turns)
    report["update_s"] = time.perf_counter() - start
    report["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    after = group.trainer_logprobs(turns)
    change = [sum(x) - sum(y) for x, y in zip(after, before)]
    report["update_direction_ok"] = all((c > 0) == (t.advantage > 0) for c, t in zip(change, turns))
    report["grad_norm"] = metrics["grad_norm"]
    report["sync_logprob_diff"] = group.last_sync_diff
    report["other_group_unchanged"] = other.trainer_logprobs(turns[:2]) == other_before

    group.load(work / group.name)
    report["load_restores_max_abs"] = max_abs(group.trainer_logprobs(turns), before)
    report["load_ok"] = report["load_restores_max_abs"] <= 1e-6
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model shape (runs on CPU)")
    parser.add_argument("--vllm", action="store_true", help="tier B: two vLLM hybrid groups (needs unimas[gpu])")
    parser.add_argument("--rows", type=int, default=8, help="turns per update")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    if args.vllm:
        found = importlib.util.find_spec("vllm") is not None
        print(json.dumps({"tier": "B", "vllm_installed": found, "ran": False,
                          "reason": "the vLLM rollout is not wired into the verl group yet (docs/verl.md)"}))
        return 2
    cuda = torch.cuda.is_available()
    bf16 = cuda and not args.tiny
    dtype = "bfloat16" if bf16 else "float32"
    report = {"tier": "A", "device": torch.cuda.get_device_name() if cuda else "cpu", "shape": "tiny" if args.tiny
              else "0.5b", "dtype": dtype, "groups": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="unimas-gpu-check-") as tmp:
        work = Path(tmp)
        dirs = {name: build_model_dir(work / f"{name}_hf", report["shape"], seed)
                for seed, name in enumerate(("alpha", "beta"))}
        groups = {name: build_group(name, path, dtype, seed) for seed, (name, path) in enumerate(dirs.items())}
        turns = fixed_turns(groups["alpha"].tokenizer, args.rows)
        for name, other in (("alpha", "beta"), ("beta", "alpha")):
            report["groups"][name] = check_group(groups[name], groups[other], dirs[name], turns, work, bf16)
    report["wall_s"] = time.perf_counter() - started
    keys = ("logprob_vs_hf_ok", "export_matches_hf_state_dict", "update_direction_ok", "other_group_unchanged",
            "load_ok")
    report["ok"] = all(group[key] for group in report["groups"].values() for key in keys)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
