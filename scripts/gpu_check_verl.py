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
Tier B (two vLLM hybrid groups on one GPU) is ``scripts/gpu_check_vllm.py``; it
needs the ``unimas[gpu]`` stack.

    python scripts/gpu_check_verl.py            # tier A on a GPU
    python scripts/gpu_check_verl.py --tiny     # the same checks, tiny shape, CPU

Tier A needs no Ray: verl's in-process engine only imports it, so where Ray is
not installed (or with ``--ray-stand-in``) an inert stand-in module answers
those imports; any real use of it would fail loudly, not silently.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import tempfile
import time
import types
from pathlib import Path


class _Inert:
    """Whatever verl's module-level Ray code asks for: decorators return their target, the rest is inert."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Inert()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _RayStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import ray`` and ``import ray.*`` with inert modules."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "ray" or fullname.startswith("ray."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__, module.__version__ = [], "0+unimas-stand-in"
        module.__getattr__ = _Inert().__getattr__
        return module

    def exec_module(self, module):
        if module.__name__ == "ray":
            module.remote = lambda *args, **kwargs: args[0] if args else (lambda target: target)
            module.is_initialized = lambda: False
            module.ObjectRef = type("ObjectRef", (), {})


def _use_ray_stand_in() -> bool:
    wanted = "--ray-stand-in" in sys.argv[1:] or importlib.util.find_spec("ray") is None
    if wanted:
        sys.meta_path.insert(0, _RayStandIn())
    return wanted


RAY_STAND_IN = _use_ray_stand_in()  # before verl (or unimas) imports Ray

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config  # noqa: E402

from unimas.algorithms import losses  # noqa: E402
from unimas.config.schema import AlgorithmConfig, ModelGroupConfig, OptimConfig  # noqa: E402
from unimas.contract.registry import build_registry  # noqa: E402
from unimas.groups.base import GroupSpec, TrainTurn  # noqa: E402
from unimas.groups.hf.chars import build_char_tokenizer  # noqa: E402
from unimas.groups.verl.group import VerlModelGroup  # noqa: E402
from unimas.groups.verl.options import VerlOptions  # noqa: E402

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
    loss = losses.resolve_policy_loss(algorithm.loss, build_registry())
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
    """The turns' response log-probs under a softmax over the tokenizer's ids only: both shapes have output rows
    past the char tokenizer, which a verl group bans (``unimas.groups.verl.vocabulary``)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device)
    size = len(AutoTokenizer.from_pretrained(model_dir))
    out = []
    with torch.no_grad():
        for turn in turns:
            ids = torch.tensor([turn.prompt_ids + turn.response_ids], device=device)
            logits = model(input_ids=ids).logits[0, len(turn.prompt_ids) - 1:-1, :size].float()
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
    parser.add_argument("--rows", type=int, default=8, help="turns per update")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    parser.add_argument("--ray-stand-in", action="store_true", help="answer verl's Ray imports with an inert "
                        "stand-in even where Ray is installed (automatic where it is not)")
    args = parser.parse_args()
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
    report["ray"] = getattr(sys.modules.get("ray"), "__version__", None)  # the stand-in says so in its version
    keys = ("logprob_vs_hf_ok", "export_matches_hf_state_dict", "update_direction_ok", "other_group_unchanged",
            "load_ok")
    report["ok"] = all(group[key] for group in report["groups"].values() for key in keys)
    return emit(report, args.out)


def emit(report: dict, out: Path | None) -> int:
    """Print the report as JSON (and write it to ``out``); the exit code says whether every check passed."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        out.write_text(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
