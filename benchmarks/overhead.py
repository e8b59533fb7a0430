"""Framework overhead vs the model's own compute: `python benchmarks/overhead.py`.

Workflow: ``bench_relay`` — three roles in a chain (speaker -> relay ->
listener), each turn up to ``--new-tokens`` tokens, team reward, 64 episodes
per step (8 tasks × group 8, all concurrent), KL to a reference on (so that
reference passes exist), on tiny Qwen2 models. Two mappings: the three roles
share ONE model, or each role has its own model.

One unimas training step (``Trainer.train_step`` plus writing its metrics
line, as ``Trainer.run`` does) is split from the outside:

* generation — time inside ``transport.generate`` (the model group: prompt
  tokenisation, batching, sampling loop, decoding);
* ref passes — the group's KL-reference forward inside ``update`` (rollout
  log-probs are reused as old log-probs, so there is no other log-prob pass);
* update — the rest of ``transport.update`` (policy forward, loss, backward,
  optimiser step, batching);
* everything else — the step minus the above: controller, routing, episode
  bookkeeping, rewards, credit/advantages, metrics, trajectory sampling.

The model-only floor pushes the same work through plain transformers/torch
in the same process, right after each unimas step: for every generation
batch unimas ran, the same prompt token ids (pre-padded) through a batched
KV-cache sampling loop for as many decode steps as unimas took, each
distinct prompt prefilled once as unimas does (rows sharing it decode on
copies of its cache); for every update, one forward (+ reference forward)
and backward and AdamW step on the same prompt+response token ids, the
forwards taking each distinct prompt once whenever unimas's do (the rule
``split_forward`` in ``unimas/groups/hf/shared_prompts.py``). Floor models are copies of the unimas models,
so unimas training is not disturbed. overhead = (unimas step − floor) /
unimas step, median over steps; the two mappings' steps alternate.

``--clock cpu`` times everything in the process's CPU seconds instead of wall
seconds: on a machine shared with other jobs the scheduler's pauses land on
whichever phase they interrupt and swamp millisecond differences; CPU time
counts only work (one torch thread, so the process's CPU time is its work).
Not with ``--gpu``, where device time is what counts.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    Phases,
    build_unimas,
    frames_table,
    instrument_group,
    machine_line,
    markdown_table,
    mean,
    median,
    profile_rounds,
    quiet_environment,
    setup_torch,
    unimas_owned,
    warm_verl,
)

LETTERS = "abcdefgh"
ALPHABET = "SRL:" + LETTERS


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: for the test suite")
    p.add_argument("--steps", type=int, default=20, help="measured steps per mapping (after warm-up)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--tasks", type=int, default=8, help="tasks per step; episodes = tasks × group")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--kl", type=float, default=0.04)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gpu", action="store_true",
                   help="one GPU: every group on CUDA, a ~110M-parameter model (h768 L12, 12 heads) unless sized; "
                        "~2 min with the default steps")
    p.add_argument("--mappings", nargs="+", default=["shared", "separate"], choices=["shared", "separate"])
    p.add_argument("--profile", type=int, default=20, metavar="STEPS",
                   help="then profile this many steps of the first mapping with pyinstrument (0: off)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: time every phase in this process's CPU seconds (time.process_time), not wall "
                        "seconds; on a loaded machine the scheduler's pauses then stop counting as overhead")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            p.error("--gpu: no CUDA device is available")
        if args.clock == "cpu":
            p.error("--gpu times device work: use the wall clock")
        sized = {a: getattr(args, a) for a in ("hidden", "layers", "heads")}
        if sized == {"hidden": 64, "layers": 2, "heads": 4}:  # not sized on the command line
            args.hidden, args.layers, args.heads = 768, 12, 12
    if args.smoke:
        args.steps, args.warmup, args.tasks, args.group, args.new_tokens = 2, 1, 2, 2, 2
        args.profile = min(args.profile, 2)
    if args.profile and importlib.util.find_spec("pyinstrument") is None:
        print("pyinstrument is not installed (pip install -e '.[bench]'): no profile", file=sys.stderr)
        args.profile = 0
    return args


def relay_config(mapping: str, args: argparse.Namespace, seed: int = 0) -> dict:
    tiny = {"architecture": "qwen2", "alphabet": ALPHABET, "hidden_size": args.hidden, "num_layers": args.layers,
            "num_heads": args.heads, "init_std": 0.1, "tie_embeddings": False, "max_positions": 64}
    roles = {"speaker": "S:{target}", "relay": "R:{message}", "listener": "L:{message}"}
    group = {"options": {"tiny": tiny}, "resources": {"gpus": 1 if getattr(args, "gpu", False) else 0}}
    if mapping == "shared":
        models = {"shared": group}
        owner = dict.fromkeys(roles, "shared")
    else:
        models = {f"{r}_model": group for r in roles}
        owner = {r: f"{r}_model" for r in roles}
    gen = {"max_new_tokens": args.new_tokens, "temperature": 1.0, "require_eos": False}
    return {
        "name": f"bench-overhead-{mapping}",
        "plugins": ["benchmarks.bench_workflows"],
        "models": models,
        "roles": {r: {"model": owner[r], "template": t, "generation": gen} for r, t in roles.items()},
        "workflow": {"name": "bench_relay"},
        "data": {"name": "bench_letters", "params": {"letters": LETTERS}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"group_size": args.group, "kl_coef": args.kl, "entropy_coef": 0.0},
        "trainer": {"seed": seed, "tasks_per_step": args.tasks, "torch_threads": args.threads},
        "logging": {"console": False, "report": False},
    }


# ---------------------------------------------------------------- the model-only floor


class Floor:
    """Plain transformers/torch doing exactly the model work of one recorded unimas step."""

    def __init__(self, groups: dict, kl_coef: float, lr: float = 1e-3):
        import torch

        self.kl_coef = kl_coef
        self.models = {name: copy.deepcopy(g.policy.model) for name, g in groups.items()}
        self.refs = {name: copy.deepcopy(m).eval().requires_grad_(False) for name, m in self.models.items()} \
            if kl_coef > 0 else {}
        # the multi-tensor step, as unimas's optimiser takes it (torch's CPU default loops over the tensors)
        self.optims = {name: torch.optim.AdamW(m.parameters(), lr=lr, foreach=True) for name, m in self.models.items()}
        self.pad = {name: g.policy.pad_id for name, g in groups.items()}
        self.device = next(iter(groups.values())).policy.device

    @staticmethod
    def _pack(prompts, responses, pad):
        """[left-padded prompt | right-padded response] tensors (built before timing starts)."""
        import torch

        width_p, width_r = max(map(len, prompts)), max(map(len, responses))
        ids = torch.full((len(prompts), width_p + width_r), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (p, r) in enumerate(zip(prompts, responses)):
            ids[row, width_p - len(p):width_p] = torch.tensor(p)
            ids[row, width_p:width_p + len(r)] = torch.tensor(r, dtype=torch.long)
            mask[row, width_p - len(p):width_p + len(r)] = 1
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), width_p

    def prepare(self, transport) -> list[tuple]:
        import torch

        work = []
        for group, results in transport.gen_results:
            distinct = list(dict.fromkeys(tuple(r.prompt_ids) for r in results))  # prefilled once, as unimas does
            where = {prompt: i for i, prompt in enumerate(distinct)}
            rows = torch.tensor([where[tuple(r.prompt_ids)] for r in results])
            ids, mask, pos, _ = self._pack([list(p) for p in distinct], [[]] * len(distinct), self.pad[group])
            steps = max(len(r.response_ids) for r in results)
            work.append(("generate", group, *self._to_device(ids, mask, pos, rows), steps))
        for group, turns in transport.updates:
            ids, mask, pos, width_p = self._pack([t.prompt_ids for t in turns], [t.response_ids for t in turns],
                                                 self.pad[group])
            adv = torch.tensor([t.advantage for t in turns], dtype=torch.float32)
            ids, mask, pos, adv = self._to_device(ids, mask, pos, adv)
            work.append(("update", group, ids, mask, pos, width_p, adv, self._shared_prompt_inputs(group, turns)))
        return work

    def _shared_prompt_inputs(self, group, turns) -> tuple | None:
        """When unimas's update forwards (policy and reference) take each distinct prompt once and the responses
        on copies of its cache (``split_forward``), the floor's do the same (None: one full row per turn)."""
        import torch

        from unimas.groups.hf.shared_prompts import split_forward  # the rule only; the forwards are plain torch

        plan = split_forward([t.prompt_ids for t in turns])
        if plan is None:
            return None
        distinct, rows = plan[0], torch.tensor(plan[1])
        p_ids, p_mask, p_pos, _ = self._pack(distinct, [[]] * len(distinct), self.pad[group])
        r_ids, r_mask, r_pos, _ = self._pack([[]] * len(turns), [t.response_ids for t in turns], self.pad[group])
        return self._to_device(p_ids, p_mask, p_pos, rows, r_ids, r_mask, r_pos)

    def _to_device(self, *tensors):
        return tuple(t.to(self.device) for t in tensors)

    def _synchronize(self) -> None:
        """CUDA kernels run asynchronously: a phase ends when its kernels have (unimas's end in a .tolist())."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def run(self, work: list[tuple], phases: Phases) -> None:
        for item in work:
            if item[0] == "generate":
                with phases.phase("floor_generate"):
                    self._generate(*item[1:])
                    self._synchronize()
            else:
                self._update(*item[1:], phases)

    def _generate(self, group, ids, mask, pos, rows, steps) -> None:
        import torch

        model = self.models[group]
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            cache.reorder_cache(rows)  # each row decodes on its own copy of its prompt's cache
            logits, mask, position = out.logits[rows, -1], mask[rows], pos[rows, -1:]
            for step in range(steps):
                token = torch.multinomial(logits.float().softmax(-1), 1)
                if step + 1 == steps:
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                position = position + 1
                out = model(input_ids=token, attention_mask=mask, position_ids=position,
                            past_key_values=cache, use_cache=True)
                logits, cache = out.logits[:, -1], out.past_key_values

    def _update(self, group, ids, mask, pos, width_p, adv, shared, phases: Phases) -> None:
        import torch

        model, optim = self.models[group], self.optims[group]
        response, rmask = ids[:, width_p:], mask[:, width_p:].float()
        keep = response.shape[1] + 1

        def full_logp_of(m):
            logits = m(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits[:, :-1]
            return logits.float().log_softmax(-1).gather(-1, response[..., None]).squeeze(-1)

        def shared_logp_of(m):
            p_ids, p_mask, p_pos, rows, r_ids, r_mask, r_pos = shared
            first = m(input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True, logits_to_keep=1)
            cache = first.past_key_values
            cache.reorder_cache(rows)
            rest = m(input_ids=r_ids, attention_mask=torch.cat([p_mask[rows], r_mask], dim=1),
                     position_ids=p_pos[rows, -1:] + 1 + r_pos, past_key_values=cache, use_cache=True)
            logits = torch.cat([first.logits[rows], rest.logits[:, :-1]], dim=1)
            return logits.float().log_softmax(-1).gather(-1, response[..., None]).squeeze(-1)

        logp_of = full_logp_of if shared is None else shared_logp_of

        ref = None
        if self.kl_coef > 0:
            with phases.phase("floor_ref"), torch.no_grad():
                ref = logp_of(self.refs[group])
                self._synchronize()
        with phases.phase("floor_update"):
            model.train()
            logp = logp_of(model)
            tokens = rmask.sum()
            loss = -(adv[:, None] * logp * rmask).sum() / tokens
            if ref is not None:
                delta = ref - logp
                loss = loss + self.kl_coef * ((delta.exp() - delta - 1) * rmask).sum() / tokens
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            model.eval()
            self._synchronize()


# ---------------------------------------------------------------- the benchmark


class Scheme:
    def __init__(self, mapping: str, args: argparse.Namespace, root: Path):
        self.mapping = mapping
        self.clock = time.process_time if args.clock == "cpu" else time.perf_counter
        self.phases = Phases(clock=self.clock, track_gc=True)
        self.trainer, self.transport = build_unimas(relay_config(mapping, args), root / mapping, self.phases,
                                                    record=True)
        for group in self.transport.groups.values():
            instrument_group(group, self.phases)
        self.floor = Floor(self.transport.groups, args.kl)
        from unimas.output.metrics import MetricsWriter

        self.writer = MetricsWriter(self.trainer.run_dir.metrics)
        self.step_index = 0
        self.samples: list[dict] = []

    async def step(self, measure: bool = True) -> None:
        self.transport.clear_records()
        self.phases.reset()
        started = self.clock()
        record = await self.trainer.train_step(self.step_index)
        self.writer.write(record)
        total = self.clock() - started
        self.step_index += 1
        unimas = self.phases.reset()
        work = self.floor.prepare(self.transport)
        self.floor.run(work, self.phases)
        floor = self.phases.reset()
        if not measure:
            return
        ref = unimas.get("ref_fwd", 0.0)
        sample = {
            "step_s": total,
            "generate_s": unimas.get("generate", 0.0),
            "ref_s": ref,
            "update_s": unimas.get("update", 0.0) - ref,
            "floor_generate_s": floor.get("floor_generate", 0.0),
            "floor_ref_s": floor.get("floor_ref", 0.0),
            "floor_update_s": floor.get("floor_update", 0.0),
            "gc_s": unimas.get("gc", 0.0),
            "turns": sum(len(t) for _, t in self.transport.updates),
            "gen_batches": len(self.transport.gen_results),
            "tokens": sum(len(t.response_ids) for _, turns in self.transport.updates for t in turns),
        }
        sample["other_s"] = total - sample["generate_s"] - sample["ref_s"] - sample["update_s"]
        sample["floor_s"] = sample["floor_generate_s"] + sample["floor_ref_s"] + sample["floor_update_s"]
        sample["overhead"] = (total - sample["floor_s"]) / total
        self.samples.append(sample)


def run(args: argparse.Namespace) -> dict:
    from unimas.training.trainer import settle_collector

    quiet_environment(args.threads)
    setup_torch(args.threads)
    warm_verl()
    results: dict = {"samples": {}, "profile": None}
    with tempfile.TemporaryDirectory() as tmp:
        schemes = [Scheme(m, args, Path(tmp)) for m in args.mappings]
        # As Trainer.run does before its first step: models, floor copies and modules out of full GC passes,
        # fewer young-generation passes.
        collector = settle_collector()

        async def loop() -> None:
            for _ in range(args.warmup):
                for s in schemes:
                    await s.step(measure=False)
            for i in range(args.steps):
                for s in (schemes if i % 2 == 0 else schemes[::-1]):
                    await s.step()

        asyncio.run(loop())
        results["samples"] = {s.mapping: s.samples for s in schemes}
        if args.profile:
            target = schemes[0]

            rounds = min(5, args.profile)
            per_round = max(1, args.profile // rounds)

            def profiled() -> None:
                async def steps() -> None:
                    for _ in range(per_round):
                        await target.trainer.train_step(target.step_index)
                        target.step_index += 1
                asyncio.run(steps())

            frames, text = profile_rounds(profiled, rounds=rounds, top=15, owned=unimas_owned)
            results["profile"] = {"mapping": target.mapping, "steps": args.profile, "frames": frames, "text": text}
        gc.set_threshold(*collector)
        for s in schemes:
            s.writer.close()
    return results


def gpu_line(args: argparse.Namespace) -> str:
    if not args.gpu:
        return ""
    import torch

    return f"; every group on one {torch.cuda.get_device_name()}"


def report(args: argparse.Namespace, results: dict) -> str:
    episodes = args.tasks * args.group
    lines = [f"### Framework overhead — 3-role relay, {episodes} concurrent episodes per step",
             "",
             f"{args.tasks} tasks × group {args.group}, ≤{args.new_tokens} new tokens per turn, KL {args.kl:g} "
             f"(reference passes on), tiny Qwen2 h{args.hidden} L{args.layers}; {args.steps} measured steps per "
             f"mapping after {args.warmup} warm-up, mappings alternating; {args.clock} clock. "
             f"{machine_line(args.threads)}"
             f"{gpu_line(args)}.",
             "",
             "All times are per step, median over steps (ms). Floor = the same prompts and tokens through plain "
             "transformers/torch (batched KV-cache sampling, each distinct prompt prefilled once, as unimas does; one "
             "forward/backward/AdamW step per model). "
             "overhead = (unimas step − floor) / unimas step (median of per-step values).",
             ""]
    headers = ["mapping", "turns", "tokens", "unimas step", "generation", "ref passes", "update", "everything else",
               "floor total", "floor gen", "floor ref", "floor update", "overhead", "≤ 10 %"]
    rows = []
    for mapping, samples in results["samples"].items():
        med = lambda k: median(s[k] for s in samples)  # noqa: E731
        overhead = med("overhead")
        rows.append([mapping, int(med("turns")), int(med("tokens")), 1000 * med("step_s"), 1000 * med("generate_s"),
                     1000 * med("ref_s"), 1000 * med("update_s"), 1000 * med("other_s"), 1000 * med("floor_s"),
                     1000 * med("floor_generate_s"), 1000 * med("floor_ref_s"), 1000 * med("floor_update_s"),
                     f"{100 * overhead:.0f} %", "yes" if overhead <= 0.10 else "no"])
    lines.append(markdown_table(headers, rows))
    lines += ["", "Where the overhead is, per phase (unimas − floor, ms, median of per-step differences); GC = "
                  "pauses of Python's cyclic garbage collector during the unimas step (already inside the phases; "
                  "mean, since they are rare and long):", ""]
    rows = []
    for mapping, samples in results["samples"].items():
        diff = lambda a, b: 1000 * median(s[a] - s[b] for s in samples)  # noqa: E731
        rows.append([mapping, diff("generate_s", "floor_generate_s"), diff("ref_s", "floor_ref_s"),
                     diff("update_s", "floor_update_s"), 1000 * median(s["other_s"] for s in samples),
                     1000 * mean(s["gc_s"] for s in samples), 1000 * mean(s["step_s"] for s in samples)])
    lines.append(markdown_table(["mapping", "generation", "ref passes", "update", "everything else", "GC (mean)",
                                 "unimas step (mean)"], rows))
    profile = results.get("profile")
    if profile:
        lines += ["", f"pyinstrument, {profile['steps']} steps of the '{profile['mapping']}' mapping in 5 rounds: time "
                      "attributed to the innermost unimas frame (library time lands on the unimas function that "
                      "called it), median share over rounds:", "",
                  frames_table(profile["frames"])]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps({k: v for k, v in results.items()}, indent=1, default=str))
    print(report(args, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
