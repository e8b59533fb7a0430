"""Supervised warm start: fit each role's model group on (template variables, answer) pairs before RL.

RL from a model that never produces the roles' formats has nothing to
reinforce; a short supervised fit fixes that. Each pair is rendered exactly as
the role renders its turn during training — its ``template`` over the pair's
variables, its ``system`` message, the group's chat template when the role uses
one — through the same code (:func:`unimas.controller.conversation.conversation`
and the group's own prompt rendering), so the ids fitted are the ids RL later
samples after. Each group that one of the pairs' roles maps to is fitted on
its roles' pairs (a LoRA role's pairs train its adapter) and written to
``OUT/<group>``, a checkpoint ``models.<group>.options.init_from`` takes.

The data file is JSON Lines, one pair a line::

    {"role": "solver", "vars": {"question": "12+34="}, "answer": "46"}

It is read as hostile input: a line that is not such an object, a role the
config does not declare (or one that is not trainable), a variable the role's
template needs but the line lacks, each stops before any model loads, with the
file and line named (``unimas warmstart`` exits 2). Only torch groups can be
warm-started (``train_supervised``). A role with ``memory`` is fitted on its
first turn's prompt (no earlier turns).

CLI: ``unimas warmstart CONFIG --data FILE.jsonl --out DIR`` (docs/credit.md,
"Warm start"); Python: :func:`warm_start`.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from unimas.config.schema import ExperimentConfig, RoleConfig
from unimas.errors import UserError
from unimas.safe_load import open_regular
from unimas.workflow.templates import render, template_fields

MAX_DATA_BYTES = 256 << 20
"""Largest pair file read (all of it is held in memory); a bigger one is refused, not read to the end."""

PAIR_KEYS = frozenset({"role", "vars", "answer"})


@dataclass(frozen=True)
class Pair:
    """One supervised example: what ``role``'s template is filled with, and the answer it should give."""

    role: str
    vars: Mapping[str, Any]
    answer: str
    where: str = ""
    """``FILE:LINE`` it came from, for messages."""


@dataclass
class WarmStartResult:
    """What :func:`warm_start` wrote and measured, per model group."""

    checkpoints: dict[str, Path] = field(default_factory=dict)
    """Group -> the directory ``init_from`` takes."""
    steps: dict[str, int] = field(default_factory=dict)
    loss: dict[str, float] = field(default_factory=dict)
    """Group -> its last step's token-mean cross-entropy."""
    accuracy: dict[str, float] = field(default_factory=dict)
    """Group -> its last greedy exact-match accuracy on the eval pairs (groups with eval pairs only)."""


def read_pairs(path: str | Path, config: ExperimentConfig) -> list[Pair]:
    """The pairs of a JSON Lines file, each checked against the config's roles; a :class:`UserError` naming
    the file and line for the first bad one."""
    path = Path(path)
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_DATA_BYTES + 1)
    except UserError:
        raise
    except OSError as exc:
        raise UserError(f"cannot read the warm-start data: {exc.strerror or exc}", where=str(path)) from None
    if len(data) > MAX_DATA_BYTES:
        raise UserError(f"larger than {MAX_DATA_BYTES >> 20} MiB; split it", where=str(path))
    text = data.decode("utf-8", errors="replace")
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            pairs.append(_pair(line, config, f"{path}:{number}"))
    if not pairs:
        raise UserError("no pairs (one JSON object a line: {\"role\": ..., \"vars\": {...}, \"answer\": ...})",
                        where=str(path))
    return pairs


def _pair(line: str, config: ExperimentConfig, where: str) -> Pair:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply or a too-long number"
        raise UserError(f"not JSON: {reason}", where=where) from None
    if not isinstance(record, dict):
        raise UserError(f"a pair is a JSON object, got {type(record).__name__}", where=where)
    if unknown := sorted(set(record) - PAIR_KEYS):
        raise UserError(f"unknown key {unknown[0]!r}; a pair has role, vars and answer", where=where)
    role, variables, answer = record.get("role"), record.get("vars", {}), record.get("answer")
    if not isinstance(role, str) or role not in config.roles:
        known = ", ".join(sorted(config.roles))
        raise UserError(f"role {str(role)[:60]!r} is not a role of the config (roles: {known})", where=where)
    spec = config.roles[role]
    if not spec.trainable:
        raise UserError(f"role '{role}' is not trainable (frozen role or group): nothing to warm-start", where=where)
    if spec.template is None:
        raise UserError(f"role '{role}' has no template to render the pair with", where=where)
    if not isinstance(answer, str) or not answer:
        raise UserError("'answer' must be a non-empty string", where=where)
    if not isinstance(variables, dict):
        raise UserError(f"'vars' must be an object of template variables, got {type(variables).__name__}",
                        where=where)
    for name, value in variables.items():
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise UserError(f"variable {name[:60]!r} must be a string or a number", where=where)
    missing = [name for name in template_fields(spec.template) if name not in variables]
    if missing:
        raise UserError(f"the template of role '{role}' needs {{{missing[0]}}}, which 'vars' lacks", where=where)
    return Pair(role=role, vars=variables, answer=answer, where=where)


def _request(spec: RoleConfig, role: str, pair: Pair, greedy: bool = False):
    """The request a turn of ``role`` sends for this pair: the same fields ``ctx.act`` fills."""
    from unimas.controller.conversation import conversation
    from unimas.groups.base import GenRequest

    messages, _, _ = conversation(role, spec, render(spec.template or "", pair.vars), ())
    generation = spec.eval_generation if greedy and spec.eval_generation else spec.generation
    return GenRequest(prompt="".join(m["content"] for m in messages), generation=generation, adapter=spec.adapter,
                      greedy=greedy, messages=messages, use_chat_template=spec.chat != "off",
                      allow_truncation=spec.truncation == "left")


def rendered_examples(group: Any, config: ExperimentConfig, pairs: Sequence[Pair]) -> list[Any]:
    """``SupervisedExample``s of ``pairs`` for a torch group, each prompt as the role's turn renders it.

    The group fits plain prompt text; a chat prompt's rendered text is checked to tokenise back to exactly
    the ids the turn samples after, so a template whose text does not round-trip is refused, not trained
    on ids RL never sees.
    """
    from unimas.groups.torch import SupervisedExample

    policy = group.policy  # the group's weights and tokenizer: its prompt rendering is the one turns go through
    examples = []
    for pair in pairs:
        spec = config.roles[pair.role]
        reserve = len(policy.tokenizer(pair.answer, add_special_tokens=False)["input_ids"]) + 1
        prompt = policy.render_prompts([_request(spec, pair.role, pair)], reserve)[0]
        if prompt.error:
            raise UserError(f"the prompt of role '{pair.role}' cannot be rendered: {prompt.error}", where=pair.where)
        text = prompt.text or _request(spec, pair.role, pair).prompt
        if policy.fit_prompts([text], reserve)[0] != prompt.ids:
            raise UserError(f"the rendered prompt of role '{pair.role}' does not tokenise back to the ids a turn "
                            "samples after; warm start cannot fit it exactly", where=pair.where)
        examples.append(SupervisedExample(prompt=text, response=pair.answer, adapter=spec.adapter))
    return examples


def greedy_accuracy(group: Any, config: ExperimentConfig, pairs: Sequence[Pair]) -> float:
    """The share of pairs whose greedy answer (the role's eval generation settings) is the answer, stripped."""
    if not pairs:
        return 0.0
    results = group.generate([_request(config.roles[p.role], p.role, p, greedy=True) for p in pairs])
    return sum(r.text.strip() == p.answer.strip() for r, p in zip(results, pairs)) / len(pairs)


def warm_start(config: ExperimentConfig | str | Path, data: str | Path | Sequence[Pair], out: str | Path, *,
               steps: int = 500, batch_size: int = 32, lr: Optional[float] = None, seed: int = 0,
               eval_data: str | Path | Sequence[Pair] | None = None, target: Optional[float] = None,
               eval_every: int = 50, log: Callable[[str], None] = print) -> WarmStartResult:
    """Fit every model group that ``data``'s roles map to, then write ``OUT/<group>`` for ``init_from``.

    Each of ``steps`` steps is one AdamW step of a group on ``batch_size`` of its pairs drawn at random
    (seeded by ``seed``), with the group's ``optim`` (``lr`` replaces its rate). With ``eval_data``, every
    ``eval_every`` steps the group's greedy exact-match accuracy on its eval pairs is logged, and with
    ``target`` the group stops once it reaches it — so RL can start from a weak but non-trivial model.
    """
    import torch

    from unimas.config.loading import load_config
    from unimas.runtime.build import build_group
    from unimas.training.experiment import Experiment

    if steps < 1 or batch_size < 1 or eval_every < 1:
        raise UserError("steps, batch size and eval interval must be at least 1", where="warm start")
    if target is not None and not 0 <= target <= 1:
        raise UserError(f"target accuracy must be in [0, 1], got {target}", where="--target")
    if lr is not None and not lr > 0:
        raise UserError(f"the learning rate must be > 0, got {lr}", where="--lr")
    if not isinstance(config, ExperimentConfig):
        config = load_config(config)
    pairs = read_pairs(data, config) if isinstance(data, (str, Path)) else list(data)
    held_out = (read_pairs(eval_data, config) if isinstance(eval_data, (str, Path))
                else list(eval_data or []))
    groups = sorted({config.roles[p.role].model for p in pairs})
    for name in groups:
        if config.models[name].backend != "torch":
            raise UserError(f"warm start fits torch groups; model group '{name}' uses backend "
                            f"'{config.models[name].backend}'", where=f"models.{name}.backend")
    if lr is not None:
        config = config.model_copy(deep=True)
        for name in groups:
            config.models[name].optim.lr = lr
    experiment = Experiment.resolve(config)  # plugins found; `unimas warmstart` validates the whole config first
    torch.set_num_threads(config.trainer.torch_threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    result = WarmStartResult()
    out = Path(out)
    for name in groups:
        result_dir = _fit_group(experiment.config, experiment.registry, name, pairs, held_out, out, steps=steps,
                                batch_size=batch_size, rng=rng, target=target, eval_every=eval_every, log=log,
                                result=result, build_group=build_group)
        result.checkpoints[name] = result_dir
    return result


def _fit_group(config: ExperimentConfig, registry: Any, name: str, pairs: Sequence[Pair], held_out: Sequence[Pair],
               out: Path, *, steps: int, batch_size: int, rng: random.Random, target: Optional[float],
               eval_every: int, log: Callable[[str], None], result: WarmStartResult, build_group: Any) -> Path:
    own = [p for p in pairs if config.roles[p.role].model == name]
    checks = [p for p in held_out if config.roles[p.role].model == name]
    group = build_group(config, registry, name)
    if not hasattr(group, "train_supervised"):
        raise UserError(f"model group '{name}' cannot be trained supervised", where=f"models.{name}")
    try:
        examples = rendered_examples(group, config, own)  # every pair rendered (and checked) before any step
        started = time.perf_counter()
        step, loss = 0, float("nan")
        for step in range(1, steps + 1):
            loss = group.train_supervised([examples[rng.randrange(len(examples))] for _ in range(batch_size)])
            if checks and (step % eval_every == 0 or step == steps):
                accuracy = result.accuracy[name] = greedy_accuracy(group, config, checks)
                log(f"{name}: step {step}: loss {loss:.3f}, greedy accuracy {accuracy:.3f} "
                    f"({time.perf_counter() - started:.0f} s)")
                if target is not None and accuracy >= target:
                    break
            elif step % eval_every == 0:
                log(f"{name}: step {step}: loss {loss:.3f} ({time.perf_counter() - started:.0f} s)")
        directory = out / name
        group.save_weights(directory)  # what init_from reads
    finally:
        group.close()
    result.steps[name], result.loss[name] = step, loss
    log(f"{name}: wrote {directory} after {step} steps; start RL from it with "
        f"--set models.{name}.options={{init_from: {directory}}}")
    return directory
