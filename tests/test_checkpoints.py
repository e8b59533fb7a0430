"""Damaged checkpoints and changed settings on resume: every case ends in a clear message, never a traceback.

One short run (checkpoints at steps 2 and 4) is copied per test and damaged
in one way; the resume either falls back to the previous checkpoint with a
notice naming the file, applies a changed setting with a notice, or refuses
with exit 2 naming the setting and both values.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.config.loading import load_config
from unimas.output import checkpoints

SETTINGS = ["trainer.steps=4", "trainer.save_every=2", "trainer.tasks_per_step=4", "trainer.eval_every=2",
            "trainer.stop_at_accuracy=null", "logging.report=false", "logging.console=false"]
CONFIG = str(EXAMPLES / "quickstart.yaml")


def sets(*extra: str) -> list[str]:
    return sum((["--set", item] for item in (*SETTINGS, *extra)), [])


def train(run: Path, capsys, *extra: str, resume: bool = True) -> tuple[int, str]:
    """Exit code and everything printed, for ``unimas train`` on ``run``."""
    code = main(["train", CONFIG, "--run-dir", str(run), *(["--resume"] if resume else []), *sets(*extra)])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert "Traceback" not in output
    return code, output


def steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


class Payload:
    """Unpickling this would create ``path``: the file must never appear."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("base") / "run"
    assert main(["train", CONFIG, "--run-dir", str(run), *sets()]) == 0
    return run


@pytest.fixture
def run(base, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(base, copy)
    return copy


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


@pytest.mark.parametrize(("damage", "named", "cause"), [
    (lambda d: (d / "shared/optimizer.pt").write_bytes((d / "shared/optimizer.pt").read_bytes()[:1000]),
     "shared/optimizer.pt", "truncated"),
    (lambda d: (d / "shared/rng.pt").unlink(), "shared/rng.pt", "missing"),
    (lambda d: (d / "manifest.json").write_text("{not json"), "manifest.json", "not a valid manifest"),
    (lambda d: (d / "manifest.json").unlink(), "manifest.json", "cannot be verified"),
    (lambda d: (d / "shared/extra.pt").write_bytes(b"x"), "shared/extra.pt", "not listed"),
    (lambda d: flip_last_byte(d / "shared/model/model.safetensors"), "shared/model/model.safetensors",
     "content changed"),
])
def test_damaged_latest_checkpoint_falls_back_to_the_previous(run, capsys, damage, named, cause):
    damage(ckpt(run, 4))
    code, output = train(run, capsys, "trainer.steps=6")
    assert code == 0
    assert f"skipping checkpoint step_000004: {ckpt(run, 4) / named}" in output and cause in output
    assert "resuming from" in output and "(step 2)" in output
    assert steps(run) == [0, 1, 2, 3, 4, 5, 6]  # steps 3 and 4 redone, logged once
    assert (run / "checkpoints" / "damaged-step_000004").is_dir()
    assert checkpoints.verify(ckpt(run, 4)).step == 4 and checkpoints.verify(ckpt(run, 6)).step == 6


def test_pickle_payload_is_refused_even_when_the_manifest_vouches_for_it(run, capsys, tmp_path):
    marker = tmp_path / "unpickled"
    torch.save({"state": Payload(marker)}, ckpt(run, 4) / "shared" / "optimizer.pt")
    config = load_config(CONFIG, SETTINGS)
    checkpoints.write_manifest(ckpt(run, 4), 4, config)  # a manifest that matches the payload
    code, output = train(run, capsys)
    assert code == 0 and not marker.exists()
    assert f"{ckpt(run, 4) / 'shared' / 'optimizer.pt'}: refused: holds pickled objects" in output
    assert "(step 2)" in output and steps(run) == [0, 1, 2, 3, 4]


def test_eval_refuses_a_pickle_payload_naming_the_file(run, capsys, tmp_path):
    marker = tmp_path / "unpickled"
    target = ckpt(run, 4) / "shared" / "optimizer.pt"
    target.write_bytes(pickle.dumps(Payload(marker), protocol=2))
    (ckpt(run, 4) / "manifest.json").unlink()  # unverifiable: eval loads it with a notice, and must still refuse
    code = main(["eval", CONFIG, "--checkpoint", str(ckpt(run, 4)), "--run-dir", str(tmp_path / "eval"), *sets()])
    output = "".join(capsys.readouterr())
    assert code == 2 and not marker.exists() and "Traceback" not in output
    assert "cannot be verified" in output and f"{target}: refused: holds pickled objects" in output


def test_eval_on_a_truncated_checkpoint_exits_2_naming_the_file(run, capsys, tmp_path):
    weights = ckpt(run, 4) / "shared" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    code = main(["eval", CONFIG, "--checkpoint", str(ckpt(run, 4)), "--run-dir", str(tmp_path / "eval"), *sets()])
    output = "".join(capsys.readouterr())
    assert code == 2 and "Traceback" not in output
    assert f"error: {weights}: truncated or changed" in output


def test_changed_learning_rate_is_announced_and_used(run, capsys):
    code, output = train(run, capsys, "trainer.steps=6", "models.shared.optim.lr=0.0005")
    assert code == 0
    assert "models.shared.optim.lr 0.001 -> 0.0005" in output and "trainer.steps 4 -> 6" in output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["group/shared/lr"] for r in records[1:]] == [0.001] * 4 + [0.0005] * 2
    assert "lr: 0.0005" in (run / "config.yaml").read_text()


@pytest.mark.parametrize(("change", "message"), [
    ("trainer.seed=1", "trainer.seed 0 -> 1"),
    ("models.shared.options.tiny.hidden_size=32", "models.shared.options.tiny.hidden_size 64 -> 32"),
    ("algorithm.group_size=4", "algorithm.group_size 8 -> 4"),
])
def test_changed_frozen_setting_refuses_naming_both_values(run, capsys, change, message):
    before = (run / "config.yaml").read_text()
    code, output = train(run, capsys, change, "trainer.steps=6")
    assert code == 2 and message in output and "cannot resume with a changed setting" in output
    assert (run / "config.yaml").read_text() == before and steps(run) == [0, 1, 2, 3, 4]


def test_keep_checkpoints_keeps_the_newest_complete_ones(run, capsys):
    code, _ = train(run, capsys, "trainer.steps=8", "trainer.keep_checkpoints=2")
    assert code == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000006", "step_000008"]


def test_killed_before_the_first_checkpoint_restarts_cleanly(run, capsys, base):
    """Only the step-0 record and a partial checkpoint exist: --resume starts over, logging each step once."""
    metrics = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(metrics[0] + "\n" + metrics[1][:40])  # torn second line
    shutil.rmtree(ckpt(run, 4))
    (ckpt(run, 2) / "COMPLETE").unlink()
    code, output = train(run, capsys)
    assert code == 0 and "deleting" in output and "starting over from step 0" in output
    assert steps(run) == [0, 1, 2, 3, 4]
    assert (run / "metrics.jsonl").read_text().count('"step":0,') == 1
    for name in ("step_000002", "step_000004"):  # the same weights as the uninterrupted run
        ours, theirs = (load_file(ckpt(r, int(name[5:])) / "shared/model/model.safetensors") for r in (run, base))
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_metrics_logged_after_the_checkpoint_are_not_duplicated(run, capsys):
    (run / "checkpoints" / "step_000004").rename(run / "checkpoints" / "gone")  # the kill came before step 4's save
    code, output = train(run, capsys, "trainer.steps=5")
    assert code == 0 and "(step 2)" in output
    assert steps(run) == [0, 1, 2, 3, 4, 5]
    train_steps = [json.loads(line)["step"] for line in (run / "trajectories/train.jsonl").open()]
    assert train_steps == sorted(train_steps) and train_steps.count(3) == 4  # sample_trajectories per step


def test_every_checkpoint_damaged_starts_over(run, capsys):
    for step in (2, 4):
        (ckpt(run, step) / "shared" / "rng.pt").unlink()
    code, output = train(run, capsys)
    assert code == 0 and output.count("skipping checkpoint") == 2 and "starting over from step 0" in output
    assert steps(run) == [0, 1, 2, 3, 4]


# -- state files: each is checked against its schema inside the checkpoint load ------------------------------

def vouch(directory: Path, step: int) -> None:
    """Re-write the manifest so it matches the damaged files: the file's own check must catch the damage."""
    checkpoints.write_manifest(directory, step, load_config(CONFIG, SETTINGS))


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def save_rng(path: Path, **changes) -> None:
    state = torch.load(path, weights_only=True)
    state.update(changes)
    torch.save(state, path)


@pytest.mark.parametrize(("name", "damage", "cause"), [
    ("trainer_state.json", lambda p: p.write_text(p.read_text()[:20]), "cannot load this file: JSONDecodeError"),
    ("trainer_state.json", lambda p: p.write_bytes(b"\x00\xff garbage"), "cannot load this file"),
    ("trainer_state.json", lambda p: p.write_text("[4]"), "does not match the expected contents"),
    ("trainer_state.json", lambda p: edit_json(p, lambda d: d.pop("step")), "step: Field required"),
    ("trainer_state.json", lambda p: edit_json(p, lambda d: d.update(step="4")), "step: Input should be a valid"),
    ("trainer_state.json", lambda p: edit_json(p, lambda d: d.update(failed_steps_in_a_row=-1)),
     "failed_steps_in_a_row: Input should be greater than or equal to 0"),
    ("trainer_state.json", lambda p: edit_json(p, lambda d: d.update(step=2)), "records step 2, but it sits in "
     "the checkpoint of step 4"),
    ("trainer_state.json", lambda p: edit_json(p, lambda d: d.update(weight_versions={"ghost": 4})),
     "group(s) ghost, which this run does not have"),
    ("shared/rng.pt", lambda p: save_rng(p, generator=torch.zeros(4)), "generator: Value error, must be a 1-D uint8"),
    ("shared/rng.pt", lambda p: save_rng(p, weight_version=-1), "weight_version: Input should be greater than"),
    ("shared/rng.pt", lambda p: save_rng(p, weight_version=1.5), "weight_version: Input should be a valid integer"),
    ("shared/rng.pt", lambda p: torch.save(torch.zeros(3), p), "does not match the expected contents"),
])
def test_a_bad_state_file_makes_its_checkpoint_fall_back(run, capsys, name, damage, cause):
    damage(ckpt(run, 4) / name)
    vouch(ckpt(run, 4), 4)
    code, output = train(run, capsys)
    assert code == 0
    assert f"skipping checkpoint step_000004: {ckpt(run, 4) / name}" in output and cause in output, output
    assert "(step 2)" in output and steps(run) == [0, 1, 2, 3, 4]
    assert (run / "checkpoints" / "damaged-step_000004").is_dir()


def test_a_manifest_of_another_step_falls_back(run, capsys):
    vouch(ckpt(run, 4), 2)  # intact files, but the manifest claims step 2
    code, output = train(run, capsys)
    assert code == 0 and f"{ckpt(run, 4) / 'manifest.json'}: says step 2" in output and "(step 2)" in output


# -- pickle payloads in every torch-group file, through train --resume, eval and serve --------------------------

def plant_dict(path: Path, marker: Path) -> None:
    torch.save({"state": Payload(marker)}, path)


def plant_bin(path: Path, marker: Path, instead: bool) -> None:
    """A ``pytorch_model.bin`` holding the payload, next to the model's safetensors or instead of them."""
    torch.save({"model.embed_tokens.weight": Payload(marker)}, path.parent / "pytorch_model.bin")
    if instead:
        path.unlink()


PLANTED = {  # file kind -> (file holding the payload, relative to the checkpoint; how it is planted; the file
    # the manifest check names when the manifest does not vouch for it)
    "optimizer": ("shared/optimizer.pt", plant_dict, "shared/optimizer.pt"),
    "scheduler": ("shared/scheduler.pt", plant_dict, "shared/scheduler.pt"),
    "rng": ("shared/rng.pt", plant_dict, "shared/rng.pt"),
    "bin next to safetensors": ("shared/model/pytorch_model.bin",
                                lambda p, m: plant_bin(p.parent / "model.safetensors", m, instead=False),
                                "shared/model/pytorch_model.bin"),
    "bin instead of safetensors": ("shared/model/pytorch_model.bin",
                                   lambda p, m: plant_bin(p.parent / "model.safetensors", m, instead=True),
                                   "shared/model/model.safetensors"),  # missing, listed in the manifest
}


def serve_checkpoint(directory: Path, capsys, monkeypatch) -> tuple[int, str]:
    """``unimas serve --checkpoint``: exit code and output; a server that would start only records that it would."""
    import uvicorn

    started = []

    async def no_server(self, *args, **kwargs):
        started.append(self.config.port)

    monkeypatch.setattr(uvicorn.Server, "serve", no_server)
    code = main(["serve", CONFIG, "--checkpoint", str(directory), "--host", "127.0.0.1", *sets()])
    output = "".join(capsys.readouterr())
    assert not started, "the server started on a checkpoint holding a pickle payload"
    return code, output


@pytest.mark.slow
@pytest.mark.parametrize("vouched", [False, True], ids=["unlisted", "vouched"])
@pytest.mark.parametrize("command", ["resume", "eval", "serve"])
@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_pickle_payload_in_any_group_file_never_runs(run, capsys, monkeypatch, tmp_path, kind, command, vouched):
    marker = tmp_path / "unpickled"
    name, plant, unlisted = PLANTED[kind]
    plant(ckpt(run, 4) / name, marker)
    if vouched:
        vouch(ckpt(run, 4), 4)
    target = ckpt(run, 4) / (name if vouched else unlisted)
    if command == "resume":
        code, output = train(run, capsys)
        assert code == 0 and f"skipping checkpoint step_000004: {target}" in output and "(step 2)" in output
    elif command == "eval":
        code = main(["eval", CONFIG, "--checkpoint", str(ckpt(run, 4)), "--run-dir", str(tmp_path / "eval"), *sets()])
        output = "".join(capsys.readouterr())
        assert code == 2
    else:
        code, output = serve_checkpoint(ckpt(run, 4), capsys, monkeypatch)
        assert code == 2
    assert not marker.exists() and "Traceback" not in output
    assert f"{target}: " in output, output
    if vouched:
        assert "refused" in output


# -- nothing outside the run directory is written or deleted ----------------------------------------------------

def contents(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def move_outside(path: Path, outside: Path) -> dict[str, bytes]:
    """Move ``path`` to ``outside`` and leave a symlink to it in its place; what ``outside`` holds now."""
    shutil.move(path, outside)
    path.symlink_to(outside, target_is_directory=True)
    return contents(outside)


@pytest.mark.parametrize(("linked", "extra", "prepare"), [
    ("checkpoints", (), None),
    ("checkpoints/step_000002", ("trainer.steps=6", "trainer.keep_checkpoints=1"), None),  # pruned
    ("checkpoints/step_000004", (), lambda d: (d / "shared/rng.pt").unlink()),  # damaged: moved aside
    ("checkpoints/step_000004", (), lambda d: (d / "COMPLETE").unlink()),  # partial: deleted
])
def test_a_symlink_out_of_the_run_is_refused_and_its_target_untouched(run, capsys, tmp_path, linked, extra,
                                                                      prepare):
    outside = tmp_path / "elsewhere"
    if prepare is not None:
        prepare(run / linked)
    before = move_outside(run / linked, outside)
    code, output = train(run, capsys, *extra)
    assert code == 2 and "outside the run directory" in output and f"{run / linked}" in output, output
    assert contents(outside) == before
