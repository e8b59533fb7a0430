"""Checkpoint manifests: what a complete checkpoint holds, and what a resume may change.

``manifest.json`` is written into a checkpoint just before ``COMPLETE``: every
file with its size and sha256, the step, a hash of the resolved config, and
the config split in two (flattened to dotted keys):

* **frozen** — a different value would make the checkpoint mean something
  else or not load, so a resume that changes one is refused (exit 2):
  ``models.<g>.backend``, ``.options`` (architecture, tokenizer, weights
  source; except ``init_from``, whose initial weights the checkpoint
  replaces), ``.lora`` (adapter shapes), ``.trainable`` (whether optimiser
  state exists) and ``.critic.path`` (the value model's backbone: the saved
  critic was trained on it, so another one mid-run is a different critic, or
  one its weights do not fit); ``roles.<r>.model`` and ``.adapter`` (which weights act for
  a role); ``trainer.seed`` (task sampling and RNG streams continue from it);
  ``algorithm.estimator``, ``.grouping`` and ``.group_size`` (what the
  advantages, and so the optimiser moments, were built on).
* **mutable** — everything else (optimiser and schedule, steps, evaluation,
  rewards, generation, runtime...): a resume applies the new value and
  prints a notice naming the setting and both values.

A checkpoint without a manifest (written before manifests existed, or
damaged) cannot be verified: a resume skips it; ``unimas eval`` loads it
with a notice, since its loads never unpickle and only read.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from unimas.config.schema import ExperimentConfig
from unimas.errors import UserError
from unimas.output.rundir import COMPLETE, RunDir

MANIFEST = "manifest.json"
ABSENT = "(not set)"


class CheckpointDamaged(UserError):
    """A checkpoint file is missing, truncated, changed or unreadable; names the file."""

    def __init__(self, path: Path, reason: str):
        self.path = Path(path)
        super().__init__(reason, where=str(path))


@dataclass(frozen=True)
class Manifest:
    step: int
    config_sha256: str
    frozen: dict[str, Any]
    mutable: dict[str, Any]


def notice(text: str) -> None:
    """A line the user should see, apart from the metrics display."""
    print(f"notice: {text}", file=sys.stderr, flush=True)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def is_frozen(key: str) -> bool:
    """Whether a dotted config key must keep its checkpointed value on resume (see the module docstring)."""
    parts = key.split(".")
    if parts[0] == "models" and len(parts) >= 3:
        return parts[2] in ("backend", "trainable", "lora") or (parts[2] == "options" and parts[3:4] != ["init_from"]) \
            or parts[2:4] == ["critic", "path"]
    if parts[0] == "roles" and len(parts) >= 3:
        return parts[2] in ("model", "adapter")
    return key in ("trainer.seed", "algorithm.estimator", "algorithm.grouping", "algorithm.group_size")


def settings(config: ExperimentConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(frozen, mutable) settings of ``config`` as dotted key -> JSON value."""
    flat = _flatten(config.model_dump(mode="json", by_alias=True))
    frozen = {k: v for k, v in flat.items() if is_frozen(k)}
    return frozen, {k: v for k, v in flat.items() if k not in frozen}


def config_sha256(config: ExperimentConfig) -> str:
    tree = config.model_dump(mode="json", by_alias=True)
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _payload_files(directory: Path) -> list[Path]:
    """Every file of the checkpoint except the manifest itself and the COMPLETE marker."""
    skip = {directory / MANIFEST, directory / f".{MANIFEST}.tmp", directory / COMPLETE}
    return sorted(p for p in directory.rglob("*") if p.is_file() and p not in skip)


def write_manifest(directory: Path, step: int, config: ExperimentConfig) -> None:
    """Describe every file now in ``directory``; written atomically (temp file, then rename)."""
    files = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in _payload_files(directory)}
    frozen, mutable = settings(config)
    data = {"format": 1, "step": step, "config_sha256": config_sha256(config), "frozen": frozen,
            "mutable": mutable, "files": files}
    temporary = directory / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(temporary, directory / MANIFEST)


def verify(directory: Path) -> Manifest:
    """The manifest of ``directory`` after checking every file against it; :class:`CheckpointDamaged` if not."""
    path = directory / MANIFEST
    if not path.is_file():
        raise CheckpointDamaged(path, "missing: the checkpoint cannot be verified (written before manifests "
                                "existed, or damaged)")
    try:
        data = json.loads(path.read_text())
        files = {str(name): (int(entry["size"]), str(entry["sha256"])) for name, entry in data["files"].items()}
        manifest = Manifest(int(data["step"]), str(data["config_sha256"]), dict(data["frozen"]),
                            dict(data["mutable"]))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, OverflowError,
            RecursionError) as exc:  # 1e400 is infinity to int(); deep nesting exhausts the parser's stack
        raise CheckpointDamaged(path, f"not a valid manifest ({type(exc).__name__}: {exc})") from None
    for name, (size, sha) in files.items():
        file = directory / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise CheckpointDamaged(path, f"lists a file outside the checkpoint: {name}")
        if not file.is_file():
            raise CheckpointDamaged(file, "missing (listed in manifest.json)")
        if file.stat().st_size != size:
            raise CheckpointDamaged(file, f"truncated or changed: {file.stat().st_size} bytes, manifest.json "
                                    f"says {size}")
        if _sha256(file) != sha:
            raise CheckpointDamaged(file, "content changed since it was written (sha256 differs from manifest.json)")
    for file in _payload_files(directory):
        if file.relative_to(directory).as_posix() not in files:
            raise CheckpointDamaged(file, "not listed in manifest.json (added after the checkpoint was written)")
    return manifest


def _show(value: Any) -> str:
    return ABSENT if value is ABSENT else json.dumps(value)


def changes(manifest: Manifest, config: ExperimentConfig) -> tuple[list[str], list[str]]:
    """(frozen, mutable) settings that differ between the checkpoint and ``config``, as ``key old -> new``."""
    frozen, mutable = settings(config)
    found: tuple[list[str], list[str]] = ([], [])
    for kind, (old, new) in enumerate(((manifest.frozen, frozen), (manifest.mutable, mutable))):
        for key in sorted(old.keys() | new.keys()):
            before, after = old.get(key, ABSENT), new.get(key, ABSENT)
            if before != after:
                found[kind].append(f"{key} {_show(before)} -> {_show(after)}")
    return found


def check_settings(manifest: Manifest, config: ExperimentConfig, directory: Path) -> list[str]:
    """Refuse (exit 2) a resume that changes a frozen setting; the mutable changes, to announce."""
    frozen, mutable = changes(manifest, config)
    if frozen:
        raise UserError("cannot resume with a changed setting that the checkpoint fixes for the whole run: "
                        + "; ".join(frozen) + ". Put the old value back, or train into a new --run-dir",
                        where=str(directory))
    return mutable


async def resume(run_dir: RunDir, config: ExperimentConfig, load: Callable[[Path, Manifest], Awaitable[int]],
                 reset: Callable[[], Awaitable[Any]]) -> int:
    """Load the newest usable checkpoint of ``run_dir``; its step, or 0 when none is usable.

    Partial checkpoints (no ``COMPLETE``: a killed write) are deleted; damaged
    ones are skipped with a notice naming the file and moved aside to
    ``checkpoints/damaged-step_N`` so they are neither resumed nor pruned as
    newest. Logs written after the chosen step (or all logs, when starting
    over) are cut so the continued run logs each step once.
    """
    for partial in run_dir.partial_checkpoints():
        run_dir.owned(partial)  # refused before the notice: nothing outside the run is deleted
        notice(f"deleting {partial}: an unfinished checkpoint write (no {COMPLETE})")
        run_dir.delete(partial)
    for directory in reversed(run_dir.complete_checkpoints()):
        try:
            manifest = verify(directory)
        except CheckpointDamaged as damaged:
            failure: UserError = damaged
        else:
            announce = check_settings(manifest, config, directory)  # a refusal ends the run: no fallback
            try:
                step = await load(directory, manifest)
            except UserError as unreadable:  # a file the manifest vouched for did not load
                failure = unreadable
                await reset()  # nothing half-loaded may leak into the next candidate or a fresh start
            else:
                for line in announce:
                    notice(f"resume applies a changed setting: {line}")
                run_dir.truncate_logs(step)
                notice(f"resuming from {directory} (step {step})")
                return step
        aside = run_dir.move_aside(directory)
        notice(f"skipping checkpoint {directory.name}: {failure} (moved to {aside})")
    run_dir.truncate_logs(-1)
    notice(f"no usable checkpoint in {run_dir.root / 'checkpoints'}: starting over from step 0 "
           "(metrics and trajectories of the earlier attempt cleared)")
    return 0
