"""A verl group's checkpoint is never unpickled: a planted pickle in any of its files runs no code.

One short run of two verl groups (``speaker_model`` full-weight, ``listener_model``
a LoRA adapter), checkpoints at steps 1 and 2, is copied per case. A pickle
payload (its ``__reduce__`` creates a marker file) replaces one file of the
step-2 checkpoint: the manifest vouching for it (re-written), stale (the file
no longer matches it) or deleted. Then ``unimas train --resume`` falls back to
step 1 with a notice naming the file, and ``unimas eval`` / ``unimas serve
--checkpoint`` exit 2 naming it; the marker never appears and nothing prints
a traceback.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.config.loading import load_config
from unimas.output import checkpoints

RANK_FILES = ("verl_actor/model_rank_0_of_1.safetensors", "verl_actor/optimizer_rank_0_of_1.pt",
              "verl_actor/scheduler_rank_0_of_1.json", "verl_actor/rng_rank_0_of_1.pt")
GROUP_FILES = ("unimas_group.json", "rollout_rng.pt")
KINDS = {
    "weights": "speaker_model/verl_actor/model_rank_0_of_1.safetensors",
    "optimiser": "speaker_model/verl_actor/optimizer_rank_0_of_1.pt",
    "scheduler": "speaker_model/verl_actor/scheduler_rank_0_of_1.json",
    "engine_rng": "speaker_model/verl_actor/rng_rank_0_of_1.pt",
    "rollout_rng": "speaker_model/rollout_rng.pt",
    "group_state": "speaker_model/unimas_group.json",
    "adapter": "listener_model/verl_actor/model_rank_0_of_1.safetensors",
    "adapter_optimiser": "listener_model/verl_actor/optimizer_rank_0_of_1.pt",
}
"""Every file a resume, eval or serve reads from a verl group (the ``huggingface/`` export is read by init_from)."""
MANIFESTS = ("vouched", "stale", "none")


class Payload:
    """Unpickling this creates ``path``: the file must never appear."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished two-step run (checkpoints at steps 1 and 2) and its config file."""
    root = tmp_path_factory.mktemp("verl_safety")
    tree = yaml.safe_load((EXAMPLES / "quickstart_verl.yaml").read_text())
    tree["models"]["listener_model"]["lora"] = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    tree["roles"]["listener"]["adapter"] = "listener"
    tree["trainer"].update(steps=2, save_every=1, tasks_per_step=4, eval_every=0, eval_size=4, stop_at_accuracy=None)
    tree["algorithm"]["group_size"] = 4
    tree["logging"] = {"report": False, "console": False}
    (root / "config.yaml").write_text(yaml.safe_dump(tree))
    assert main(["train", str(root / "config.yaml"), "--run-dir", str(root / "run")]) == 0
    return root


@pytest.fixture
def copy(base, tmp_path) -> Path:
    shutil.copytree(base, tmp_path / "copy")
    return tmp_path / "copy"


def newest(root: Path) -> Path:
    return root / "run" / "checkpoints" / "step_000002"


def vouch(root: Path) -> None:
    """Re-write the newest checkpoint's manifest so that it lists its files as they are now."""
    checkpoints.write_manifest(newest(root), 2, load_config(root / "config.yaml"))


def plant(root: Path, name: str, manifest: str) -> tuple[Path, Path]:
    """Replace the newest checkpoint's file ``name`` with the payload; (the file, the marker it would create)."""
    checkpoint, marker = newest(root), root / "unpickled"
    target = checkpoint / name
    torch.save(Payload(marker), target)
    if manifest == "vouched":
        vouch(root)
    elif manifest == "none":
        (checkpoint / checkpoints.MANIFEST).unlink()
    return target, marker


def run(capsys, *command: str) -> tuple[int, str]:
    code = main(list(command))
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert "Traceback" not in output
    return code, output


@pytest.fixture
def no_server(monkeypatch):
    """``unimas serve`` returns instead of serving, should a checkpoint wrongly load."""
    import uvicorn

    async def serve(self, sockets=None):
        return None

    monkeypatch.setattr(uvicorn.Server, "serve", serve)


def test_the_payload_runs_code_when_unpickled(tmp_path):
    pickle.loads(pickle.dumps(Payload(tmp_path / "unpickled")))
    assert (tmp_path / "unpickled").exists()


@pytest.mark.slow
def test_every_file_a_verl_group_loads_is_a_planted_kind(base):
    """A new file in the layout must join KINDS (the LoRA group's schedule, RNG and state are the speaker's kinds)."""
    for group in ("speaker_model", "listener_model"):
        directory = newest(base) / group
        held = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
        assert {name for name in held if not name.startswith("verl_actor/huggingface/")} == {*RANK_FILES,
                                                                                            *GROUP_FILES}
    assert {f"speaker_model/{name}" for name in (*RANK_FILES, *GROUP_FILES)} <= set(KINDS.values())


@pytest.mark.slow
def test_untouched_checkpoints_load(copy, capsys, no_server):
    config = str(copy / "config.yaml")
    code, output = run(capsys, "eval", config, "--checkpoint", str(newest(copy)), "--run-dir", str(copy / "eval"))
    assert code == 0 and "step: 2" in output
    code, output = run(capsys, "train", config, "--run-dir", str(copy / "run"), "--resume", "--set",
                       "trainer.steps=1")
    assert code == 0 and f"resuming from {newest(copy)} (step 2)" in output
    assert run(capsys, "serve", config, "--checkpoint", str(newest(copy)))[0] == 0


@pytest.mark.parametrize("manifest", MANIFESTS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_train_resume_falls_back_past_a_planted_pickle(copy, capsys, kind, manifest):
    target, marker = plant(copy, KINDS[kind], manifest)
    code, output = run(capsys, "train", str(copy / "config.yaml"), "--run-dir", str(copy / "run"), "--resume",
                       "--set", "trainer.steps=1")
    assert code == 0 and not marker.exists()
    named = newest(copy) / checkpoints.MANIFEST if manifest == "none" else target
    assert "skipping checkpoint step_000002" in output and str(named) in output
    assert "resuming from" in output and "step_000001 (step 1)" in output


@pytest.mark.parametrize("manifest", MANIFESTS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_eval_refuses_a_planted_pickle(copy, capsys, kind, manifest):
    target, marker = plant(copy, KINDS[kind], manifest)
    code, output = run(capsys, "eval", str(copy / "config.yaml"), "--checkpoint", str(newest(copy)), "--run-dir",
                       str(copy / "eval"))
    assert code == 2 and not marker.exists() and str(target) in output


@pytest.mark.parametrize("manifest", MANIFESTS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_serve_refuses_a_planted_pickle(copy, capsys, no_server, kind, manifest):
    target, marker = plant(copy, KINDS[kind], manifest)
    code, output = run(capsys, "serve", str(copy / "config.yaml"), "--checkpoint", str(newest(copy)))
    assert code == 2 and not marker.exists() and str(target) in output


@pytest.mark.parametrize("change, field", [({"weight_version": -1}, "weight_version"),
                                           ({"world_size": 0}, "world_size"),
                                           ({"weight_version": "2"}, "weight_version"),
                                           ({"backend": "torch"}, "backend"),
                                           ({"ranks": 1}, "ranks")])
def test_a_group_state_of_the_wrong_shape_is_refused_naming_file_and_field(copy, capsys, change, field):
    path = newest(copy) / "speaker_model" / "unimas_group.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    vouch(copy)
    code, output = run(capsys, "eval", str(copy / "config.yaml"), "--checkpoint", str(newest(copy)), "--run-dir",
                       str(copy / "eval"))
    assert code == 2 and f"{path}: does not match the expected contents: {field}" in output


def _plain_but_wrong(path: Path) -> None:
    """Contents that load safely but are not what the configured group holds."""
    from safetensors.torch import load_file, save_file

    if path.name.startswith("model_"):
        weights = load_file(path)
        name = next(iter(weights))
        save_file({**weights, name: torch.zeros(3)}, path)
    elif path.name.startswith("optimizer_"):
        saved = torch.load(path, weights_only=True)
        saved["param_groups"][0]["lr"] = "fast"
        torch.save(saved, path)
    elif path.name.startswith("scheduler_"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "last_epoch": "late"}))
    else:
        torch.save({**torch.load(path, weights_only=True), "torch": torch.zeros(3, dtype=torch.uint8)}, path)


@pytest.mark.parametrize("kind", ["weights", "optimiser", "scheduler", "engine_rng"])
def test_safe_but_wrong_contents_are_refused_naming_the_file(copy, capsys, kind):
    path = newest(copy) / KINDS[kind]
    _plain_but_wrong(path)
    vouch(copy)
    code, output = run(capsys, "eval", str(copy / "config.yaml"), "--checkpoint", str(newest(copy)), "--run-dir",
                       str(copy / "eval"))
    assert code == 2 and f"error: {path}: " in output
