"""A verl group's checkpoint on disk, in formats that load without unpickling anything.

verl's own checkpoint manager writes ``torch.save`` pickles of arbitrary
objects and reads them back with full unpickling (``weights_only`` off), so a
planted file would run code on resume, eval or serve. unimas never calls it.
The group writes ``unimas_group.json`` (backend, weight version, ranks; read
through a pydantic schema) and ``rollout_rng.pt`` (the rollout's sampling
generator); each rank of its engine (one in process, ``world_size`` on a Ray
worker group) writes and reads its own files under ``verl_actor/``:

* ``model_rank_R_of_N.safetensors`` — the rank's local shards of every model
  tensor (base and, for a LoRA group, adapter), under the module's names;
* ``optimizer_rank_R_of_N.pt`` — the optimiser state (moments and step
  counters as plain tensors, keyed by parameter name; the hyper-parameter
  groups as numbers), loaded with ``torch.load(weights_only=True)``;
* ``scheduler_rank_R_of_N.json`` — the learning-rate schedule's position;
* ``rng_rank_R_of_N.pt`` — the rank's torch, accelerator, numpy and Python
  RNG states as tensors and numbers (verl's engine draws from them);
* ``huggingface/`` (rank 0) — the full weights as a Hugging Face model dir,
  what ``options.init_from`` starts from (a LoRA group's under peft names).

A group with a critic (:mod:`.critic`) writes its value model's engine the
same way under ``verl_critic/`` (model, optimiser and schedule files; no RNG
file, the actor's holds the process's streams, and no export: a critic is
resume-only), and its update count in ``unimas_group.json``.

Shards are per rank (``torch.distributed.checkpoint.state_dict`` helpers in
their sharded mode), so a save gathers nothing but the export, and a resume
needs the same ``world_size`` (the group checks that first). Every failure
to load — missing, truncated, a pickle, other shapes or names — is a
:class:`~unimas.errors.UserError` naming the file.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictBool, StrictFloat, StrictInt
from safetensors.torch import save_file

from unimas.errors import UserError
from unimas.groups.verl.options import VERL_HF_DIR
from unimas.safe_load import load_json, load_safetensors, load_tensors, reading

ACTOR_DIR, HF_DIR = VERL_HF_DIR.parts
CRITIC_DIR = "verl_critic"
STATE_FILE, ROLLOUT_RNG_FILE = "unimas_group.json", "rollout_rng.pt"

Number = Union[StrictBool, StrictInt, StrictFloat, None]


class GroupState(BaseModel):
    """``unimas_group.json``: what the group itself needs to continue."""

    model_config = ConfigDict(extra="forbid", strict=True)

    backend: Literal["verl"]
    weight_version: int = Field(ge=0)
    world_size: int = Field(ge=1)
    critic_updates: int = Field(0, ge=0)
    """Update calls the group's critic has trained in (its warm-up count); 0 without a critic."""


def save_group_state(directory: Path, state: GroupState, rollout: torch.Generator) -> None:
    (directory / STATE_FILE).write_text(state.model_dump_json(indent=2))
    torch.save({"generator": rollout.get_state()}, directory / ROLLOUT_RNG_FILE)


def load_group_state(directory: Path) -> GroupState:
    return load_json(directory / STATE_FILE, GroupState)


def load_rollout_rng(directory: Path, rollout: torch.Generator) -> None:
    """Set the rollout's sampling generator to the saved state."""
    path = directory / ROLLOUT_RNG_FILE
    saved = load_tensors(path)
    with reading(path):
        rollout.set_state(saved["generator"])


class SchedulerState(RootModel[dict[str, Union[Number, list[Number]]]]):
    """A learning-rate scheduler's ``state_dict()`` as JSON: numbers and lists of numbers by name."""


@dataclass(frozen=True)
class RankFiles:
    """The files one rank of a group writes under ``verl_actor/``."""

    model: Path
    optimizer: Path
    scheduler: Path
    rng: Path

    @classmethod
    def of(cls, directory: Path, rank: int, ranks: int) -> "RankFiles":
        tail = f"rank_{rank}_of_{ranks}"
        return cls(directory / f"model_{tail}.safetensors", directory / f"optimizer_{tail}.pt",
                   directory / f"scheduler_{tail}.json", directory / f"rng_{tail}.pt")


def _this_rank(directory: Path) -> RankFiles:
    import torch.distributed as dist

    return RankFiles.of(directory, dist.get_rank(), dist.get_world_size())


def _local(value: Any) -> Any:
    """A tensor's own shard as a fresh CPU tensor (no storage shared with the module: safetensors refuses that)."""
    if not isinstance(value, torch.Tensor):
        return value
    value = value.to_local() if hasattr(value, "to_local") else value
    return value.detach().to("cpu", copy=True).contiguous()


def _like(template: Any, local: torch.Tensor, name: str, path: Path) -> Any:
    """``local`` (a saved shard) placed as ``template`` is: same device, and the same sharding for a DTensor."""
    from torch.distributed.tensor import DTensor

    own = template.to_local() if isinstance(template, DTensor) else template
    if local.shape != own.shape or local.dtype != own.dtype:
        raise UserError(f"'{name}' is {local.dtype} {tuple(local.shape)} here but {own.dtype} {tuple(own.shape)} "
                        "in this rank of the configured model (another model size, or another world_size?)",
                        where=str(path))
    local = local.to(own.device)
    if not isinstance(template, DTensor):
        return local
    return DTensor.from_local(local, template.device_mesh, template.placements, run_check=False,
                              shape=template.shape, stride=template.stride())


def _same_names(saved: set[str], expected: set[str], what: str, path: Path) -> None:
    if saved != expected:
        missing, unknown = sorted(expected - saved), sorted(saved - expected)
        raise UserError(f"its {what} do not match the configured model (missing: {missing[:3]}, unknown: "
                        f"{unknown[:3]})", where=str(path))


# ------------------------------------------------------------------ save


def save_engine(engine: Any, directory: Path, process_state: bool = True) -> None:
    """Write this rank's model, optimiser and schedule files and, with ``process_state``, its RNG file and
    (on rank 0) the Hugging Face export; a critic's engine saves without them.

    Every rank of the group must call it: the export gathers the full weights.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = _this_rank(directory)
    module, optimizer = engine.module, engine.optimizer
    save_file({name: _local(value) for name, value in get_model_state_dict(module).items()}, str(files.model))
    state = get_optimizer_state_dict(module, optimizer)
    torch.save({"state": {name: {key: _local(value) for key, value in values.items()}
                          for name, values in state["state"].items()},
                "param_groups": state["param_groups"]}, files.optimizer)
    files.scheduler.write_text(json.dumps(engine.lr_scheduler.state_dict(), allow_nan=False, indent=1))
    if process_state:
        torch.save(_rng_state(), files.rng)
        export_hugging_face(engine, directory / HF_DIR)


def export_hugging_face(engine: Any, target: Path) -> None:
    """The full weights, config, generation config and tokenizer as a Hugging Face dir, written by rank 0.

    Every rank must call it (it gathers the full weights): part of a checkpoint, and on its own the group's
    weights-only save (:meth:`unimas.ModelGroup.save_weights`)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM

    full = get_model_state_dict(engine.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return
    model = engine.module.get_base_model() if hasattr(engine.module, "get_base_model") else engine.module
    with torch.device("meta"):  # a shell for transformers' writer (tied weights, shards); its tensors are unused
        shell = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    shell.generation_config = model.generation_config
    shell.save_pretrained(target, state_dict=full)
    engine.model_config.get_processor().save_pretrained(target)


def _rng_state() -> dict[str, Any]:
    """The process's RNG streams as tensors and numbers (what ``torch.load(weights_only=True)`` reads back)."""
    _, keys, position, has_gauss, gauss = np.random.get_state()
    version, words, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)},
             "python": {"version": int(version), "words": torch.tensor(words, dtype=torch.int64),
                        "gauss_next": gauss_next}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


# ------------------------------------------------------------------ load


def load_engine(engine: Any, directory: Path, process_state: bool = True) -> None:
    """Restore what :func:`save_engine` wrote for this rank, in place (the optimiser keeps its parameters);
    ``process_state`` as it was saved with.

    All files are read and checked before anything is set, so a refused file leaves the engine as it was.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    files = _this_rank(Path(directory))
    model = _model_state(engine.module, files.model)
    optimizer = _optimizer_state(engine.module, engine.optimizer, files.optimizer)
    schedule = _scheduler_state(engine.lr_scheduler, files.scheduler)
    streams = _rng_streams(files.rng) if process_state else None
    with reading(files.model):
        set_model_state_dict(engine.module, model, options=StateDictOptions(strict=True))
    with reading(files.optimizer):
        set_optimizer_state_dict(engine.module, engine.optimizer, optimizer)
    with reading(files.scheduler):
        engine.lr_scheduler.load_state_dict(schedule)
    if streams is not None:
        with reading(files.rng):
            _set_rng(streams)


def _model_state(module: Any, path: Path) -> dict[str, Any]:
    """The saved shards as the module's own (sharded) state dict."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    saved = load_safetensors(path)
    current = get_model_state_dict(module)
    _same_names(set(saved), set(current), "weights", path)
    return {name: _like(current[name], saved[name], name, path) for name in current}


def _optimizer_state(module: Any, optimizer: Any, path: Path) -> dict[str, Any]:
    """The saved optimiser state with its moments sharded as their parameters are."""
    saved = load_tensors(path)
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        raise UserError("not an optimiser state (a dict of 'state' and 'param_groups')", where=str(path))
    _check_param_groups(saved["param_groups"], optimizer.param_groups, path)
    parameters = dict(module.named_parameters())
    unknown = sorted(set(saved["state"]) - set(parameters))
    if unknown:
        raise UserError(f"holds optimiser state for parameters the configured model lacks: {unknown[:3]}",
                        where=str(path))
    state = {}
    for name, values in saved["state"].items():
        if not isinstance(values, dict) or not all(isinstance(v, torch.Tensor) for v in values.values()):
            raise UserError(f"optimiser entry '{name}' is not a dict of tensors", where=str(path))
        # moments have the parameter's shard shape (and sharding); step counters are scalars
        state[name] = {key: _like(parameters[name], value, f"{name}.{key}", path) if value.dim() else value
                       for key, value in values.items()}
    return {"state": state, "param_groups": saved["param_groups"]}


def _check_param_groups(saved: list, current: list[dict], path: Path) -> None:
    """The saved hyper-parameter groups have this optimiser's entries, each of the kind it keeps, and name
    their parameters (the state-dict helpers map the names back onto this rank's parameters)."""
    if len(saved) != len(current):
        raise UserError(f"holds {len(saved)} parameter groups; the configured optimiser has {len(current)}",
                        where=str(path))
    for index, (group, own) in enumerate(zip(saved, current)):
        if not isinstance(group, dict):
            raise UserError(f"parameter group {index} is not a dict", where=str(path))
        _same_names(set(group), set(own), f"parameter group {index} entries", path)
        params = group["params"]
        if not isinstance(params, list) or not all(isinstance(name, str) for name in params):
            raise UserError(f"parameter group {index}: 'params' is not a list of parameter names", where=str(path))
        for key, value in group.items():
            if key != "params" and not _same_kind(value, own[key]):
                raise UserError(f"parameter group {index}: '{key}' is {value!r}, not a value of the kind this "
                                f"optimiser keeps ({own[key]!r})", where=str(path))


def _scheduler_state(scheduler: Any, path: Path) -> dict[str, Any]:
    """The saved schedule position, with this scheduler's entries, each of the kind it keeps."""
    saved = load_json(path, SchedulerState).root
    current = scheduler.state_dict()
    _same_names(set(saved), set(current), "entries", path)
    for name, value in saved.items():
        if not _same_kind(value, current[name]):
            raise UserError(f"'{name}' is {json.dumps(value)}, not a value of the kind this scheduler keeps "
                            f"({json.dumps(current[name])})", where=str(path))
    return saved


def _same_kind(saved: Any, current: Any) -> bool:
    """Whether ``saved`` has ``current``'s type, and for a list or tuple its length and element kinds."""
    if isinstance(current, (list, tuple)):
        return type(saved) is type(current) and len(saved) == len(current) and all(map(_same_kind, saved, current))
    return type(saved) is type(current)


def _rng_streams(path: Path) -> dict[str, Any]:
    """The saved RNG states in the forms their setters take."""
    saved = load_tensors(path)
    with reading(path):
        numpy, python = saved["numpy"], saved["python"]
        streams = {"torch": saved["torch"],
                   "numpy": ("MT19937", numpy["keys"].numpy().astype(np.uint32), int(numpy["position"]),
                             int(numpy["has_gauss"]), float(numpy["gauss"])),
                   "python": (int(python["version"]), tuple(int(word) for word in python["words"].tolist()),
                              None if python["gauss_next"] is None else float(python["gauss_next"]))}
        if "cuda" in saved:
            streams["cuda"] = saved["cuda"]
    return streams


def _set_rng(streams: dict[str, Any]) -> None:
    torch.set_rng_state(streams["torch"])
    np.random.set_state(streams["numpy"])
    random.setstate(streams["python"])
    if "cuda" in streams and torch.cuda.is_available():
        torch.cuda.set_rng_state(streams["cuda"])
