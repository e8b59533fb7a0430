"""Rows that share a prompt compute it once: `python benchmarks/shared_prompts.py`.

A GRPO step holds every first-turn prompt ``--group`` times. The torch
backend prefills each distinct prompt once when sampling, and forwards it
once for the update's log-probs (policy, KL reference, recomputed old
log-probs), copying its key/value cache to the rows that share it
(``unimas/groups/hf/shared_prompts.py``). This script times these
forwards with the sharing on and off (off: every row is its own prompt),
on one tiny Qwen2 model group, for several prompt lengths:

* sampling — ``sampling.sample_tokens`` for ``--tasks`` × ``--group`` rows,
  ``--new-tokens`` tokens each (EOS never ends a row early);
* reference log-probs — the group's ``response_logprobs`` under
  ``inference_mode`` on the same rows with ``--new-tokens`` response tokens;
* policy forward + backward — the same log-probs and entropies with
  gradients, and the backward pass of a loss over them (the update's
  forward and backward, without the optimiser step).

CPU time of this process (one torch thread), the median of ``--repeats``
interleaved pairs (on, off, off, on, ...), and the ratio on / off of each
pair (median). With sharing off the values and gradients are the same up
to float rounding: ``tests/test_shared_prompts.py`` checks that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_line, markdown_table, median, quiet_environment, setup_torch  # noqa: E402

ALPHABET = "abcdefghijklmnopqrstuvwxyz ."
PARTS = {"sampling": "sampling", "reference": "reference log-probs", "policy": "policy forward + backward"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: for the test suite")
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=[8, 64, 256], help="prompt tokens")
    p.add_argument("--tasks", type=int, default=8, help="distinct prompts per batch")
    p.add_argument("--group", type=int, default=8, help="rows per prompt (GRPO group size)")
    p.add_argument("--new-tokens", type=int, default=16, help="sampled / scored tokens per row")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10, help="interleaved on/off pairs per measurement")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="also write the raw rows here")
    args = p.parse_args(argv)
    if args.smoke:
        args.prompt_lengths, args.tasks, args.group, args.new_tokens, args.repeats = [8, 32], 2, 4, 4, 2
    return args


def build_group(args: argparse.Namespace, longest: int):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from unimas.config.schema import AlgorithmConfig, ModelGroupConfig
    from unimas.groups.base import GroupSpec
    from unimas.groups.torch import TorchModelGroup, TorchOptions

    tiny = {"alphabet": ALPHABET, "hidden_size": args.hidden, "num_layers": args.layers, "num_heads": 4,
            "max_positions": longest + args.new_tokens + 8}
    config = ModelGroupConfig(options={"tiny": tiny})
    algorithm = AlgorithmConfig()
    spec = GroupSpec(name="policy", config=config, options=TorchOptions.model_validate(config.options), adapters=[],
                     seed=0, algorithm=algorithm, policy_loss=get_policy_loss_fn(algorithm.loss))
    return TorchModelGroup.build(spec)


@contextlib.contextmanager
def sharing(enabled: bool):
    """Sharing off: every row is its own distinct prompt (what the backend did before)."""
    from unimas.groups.hf import sampling
    from unimas.groups.torch import batches

    if enabled:
        yield
        return
    saved = sampling.distinct_prompts, batches.split_forward
    sampling.distinct_prompts = lambda prompts: (list(prompts), None)
    batches.split_forward = lambda prompts: None
    try:
        yield
    finally:
        sampling.distinct_prompts, batches.split_forward = saved


def measure(args: argparse.Namespace, group, length: int) -> dict:
    import torch

    from unimas.config.schema import GenerationConfig
    from unimas.groups.base import TrainTurn
    from unimas.groups.hf import sampling

    rng = random.Random(length)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(length)) for _ in range(args.tasks)]
    prompts = [group.policy.tokenizer(text)["input_ids"] for text in texts for _ in range(args.group)]
    responses = [[rng.randrange(3, len(ALPHABET)) for _ in range(args.new_tokens)] for _ in prompts]
    turns = [TrainTurn(prompt, response, [0.0] * len(response), 1.0) for prompt, response in zip(prompts, responses)]
    generation = GenerationConfig(max_new_tokens=args.new_tokens, require_eos=False)
    eos_never = [len(group.policy.tokenizer) + 1]  # rows run the full length in both modes

    def sample() -> None:
        with torch.inference_mode():
            sampling.sample_tokens(group.policy.model, prompts, generation, False, eos_ids=eos_never, pad_id=group.policy.pad_id,
                                   logit_bias=group.policy.logit_bias, generator=group.generator)

    def reference() -> None:
        with torch.inference_mode():
            group.policy.logprobs(turns, [None] * len(turns), group.learner.batches)

    def policy() -> None:
        group.policy.model.zero_grad(set_to_none=True)
        logp, entropy, mask = group.policy.logprobs(turns, [None] * len(turns), group.learner.batches, entropy=True)
        ((logp + entropy) * mask).sum().backward()

    row = {"prompt tokens": len(prompts[0]), "rows": len(prompts)}
    for name, work in (("sampling", sample), ("reference", reference), ("policy", policy)):
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(2):  # warm-up, both ways
            for enabled in (True, False):
                with sharing(enabled):
                    work()
        for i in range(args.repeats):
            for enabled in ((True, False) if i % 2 == 0 else (False, True)):
                with sharing(enabled):
                    started = time.process_time()
                    work()
                    times[enabled].append(time.process_time() - started)
        row[name] = (median(times[True]), median(times[False]),
                     median(on / off for on, off in zip(times[True], times[False])))
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    quiet_environment(args.threads)
    setup_torch(args.threads)
    group = build_group(args, max(args.prompt_lengths))
    rows = [measure(args, group, length) for length in args.prompt_lengths]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    lines = [f"### Shared prompts — {args.tasks} prompts × group {args.group}, {args.new_tokens} tokens per row",
             "",
             f"tiny Qwen2 h{args.hidden} L{args.layers}; CPU ms of this process, median of {args.repeats} interleaved "
             f"pairs; ratio = shared / every row (median of per-pair ratios). {machine_line(args.threads)}.",
             "",
             markdown_table(["prompt tokens", "rows", *(f"{part}, {how}" for part in PARTS.values()
                                                       for how in ("shared", "every row", "ratio"))],
                            [[r["prompt tokens"], r["rows"],
                              *(cell for part in PARTS for cell in (1000 * r[part][0], 1000 * r[part][1],
                                                                     f"{r[part][2]:.2f}×"))] for r in rows])]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
