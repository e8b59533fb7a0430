"""Weights-only saves across backends: a verl learner's snapshots played by a torch group, and back.

``ModelGroup.save_weights`` writes one format (a plain Hugging Face ``model/``) whichever backend wrote it,
so snapshot pools are no longer torch-only. What a broken implementation gets wrong: the player would score
tokens as its own initial weights (not the learner's updated ones), a save would carry resume state (an
optimiser, RNG files), or a weights-only directory would be taken for a checkpoint to resume from.
"""

from __future__ import annotations

import pytest

from unimas.config.loading import config_from_dict
from unimas.contract.registry import build_registry
from unimas.errors import UserError
from unimas.groups.base import TrainTurn
from unimas.runtime.build import build_group

TINY = {"architecture": "qwen2", "alphabet": "SL:abcdefgh", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
        "max_positions": 32}
TURNS = [TrainTurn([4, 6, 7], [8, 9, 10], [], 1.0), TrainTurn([5, 6], [11, 1], [], -1.0)]


def experiment(learner: dict, player: dict) -> dict:
    return {
        "name": "verl_snapshots",
        "models": {"learner": learner, "player": player},
        "roles": {"speaker": {"model": "learner", "template": "S:{target}"},
                  "listener": {"model": "player", "template": "L:{message}"}},
        "workflow": {"name": "signalling"}, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "group_size": 4}, "trainer": {"steps": 2, "seed": 3},
    }


VERL = {"backend": "verl", "options": {"tiny": TINY}, "optim": {"lr": 0.01}}
TORCH = {"backend": "torch", "options": {"tiny": TINY}, "optim": {"lr": 0.01}}


def gap(x: list[float], y: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(x, y))


@pytest.fixture(scope="module")
def verl_learner(tmp_path_factory):
    """A verl group updated once, its weights-only save, and its scores after the update."""
    tree = experiment(VERL, {**TORCH, "trainable": False})
    learner = build_group(config_from_dict(tree), build_registry(), "learner")
    before = learner.score(TURNS)
    learner.update(TURNS)
    saved = tmp_path_factory.mktemp("verl_snapshot") / "step_000001"
    learner.save_weights(saved)
    yield tree, saved, before, learner.score(TURNS)
    learner.close()


def test_a_verl_save_is_weights_only_in_the_neutral_format(verl_learner):
    _, saved, _, _ = verl_learner
    assert sorted(p.name for p in saved.iterdir()) == ["model"]
    files = {p.name for p in (saved / "model").iterdir()}
    assert "config.json" in files and any(name.endswith(".safetensors") for name in files)
    assert not any(name.endswith((".pt", ".bin", ".pkl")) for name in files)


def test_a_torch_group_plays_a_verl_learners_snapshot(verl_learner):
    tree, saved, before, after = verl_learner
    assert gap(before, after) > 1e-3  # the update moved the learner, so playing the initial weights would show
    player = build_group(config_from_dict(tree), build_registry(), "player")
    initial, version = player.score(TURNS), player.weight_version
    player.load_weights(saved)
    started = tree | {"models": {**tree["models"], "player": {**TORCH, "trainable": False,
                                                              "options": {"init_from": str(saved)}}}}
    expected = build_group(config_from_dict(started), build_registry(), "player").score(TURNS)
    assert gap(player.score(TURNS), expected) < 1e-5  # playing a snapshot is starting from it
    assert gap(initial, expected) > 1e-3
    assert player.weight_version == version  # a frozen player's version is its own


def test_a_weights_only_directory_is_not_resumed(verl_learner, tmp_path):
    tree, saved, _, _ = verl_learner
    player = build_group(config_from_dict(tree), build_registry(), "player")
    with pytest.raises(UserError, match="rng.pt.*init_from"):
        player.load(saved)


def test_a_frozen_verl_group_plays_a_torch_learners_snapshot(tmp_path):
    tree = experiment(TORCH, {**VERL, "trainable": False})
    learner = build_group(config_from_dict(tree), build_registry(), "learner")
    learner.update(TURNS)
    learner.save_weights(tmp_path / "snapshot")
    snapshot = {**VERL, "options": {"init_from": str(tmp_path / "snapshot")}}
    started = tree | {"models": {**tree["models"], "learner": snapshot}}
    reference = build_group(config_from_dict(started), build_registry(), "learner")
    player = build_group(config_from_dict(tree), build_registry(), "player")
    try:
        prompts, responses = [t.prompt_ids for t in TURNS], [t.response_ids for t in TURNS]

        def played() -> list[float]:
            rows = player.rollout.logprobs(prompts, responses, [1.0] * len(TURNS))
            return [sum(row[: len(t.response_ids)]) for row, t in zip(rows, TURNS)]

        initial = played()
        player.load_weights(tmp_path / "snapshot")
        expected = reference.score(TURNS)  # a verl group started from the snapshot
        assert gap(played(), expected) < 1e-4
        assert gap(initial, expected) > 1e-3
    finally:
        player.close()
        reference.close()


def _debate_args(chat_model, *extra: str) -> list[str]:
    from tests.test_snapshots import _args

    return _args(chat_model, "models.policy.backend=verl", *extra)


def test_a_verl_learner_feeds_a_torch_snapshot_pool_in_a_run(chat_model, tmp_path):
    from safetensors.torch import load_file

    from tests.test_snapshots import CONFIG, _same, _snapshot_metrics, _weights
    from unimas.cli import main

    run = tmp_path / "run"
    assert main(["train", CONFIG, "--run-dir", str(run), *_debate_args(chat_model, "trainer.steps=2")]) == 0
    assert [m["snapshot/opponent/pool_size"] for m in _snapshot_metrics(run)] == [1.0, 2.0]
    snapshots = run / "snapshots" / "opponent"
    assert sorted(p.name for p in (snapshots / "step_000002").iterdir()) == ["model"]  # weights only
    final = run / "checkpoints" / "step_000002"
    exported = {k: v for f in sorted((final / "policy" / "verl_actor" / "huggingface").glob("*.safetensors"))
                for k, v in load_file(f).items()}
    assert _same(_weights(snapshots / "step_000002"), exported)  # the learner's weights at step 2
    assert not _same(_weights(snapshots / "step_000000"), exported)  # it learned since
    played = int(_snapshot_metrics(run)[-1]["snapshot/opponent/playing_step"])
    assert _same(_weights(final / "opponent"), _weights(snapshots / f"step_{played:06d}"))


def test_snapshot_pools_across_backends_are_checked(chat_model, capsys):
    from tests.test_snapshots import CONFIG
    from unimas.cli import main

    assert main(["validate", CONFIG, *_debate_args(chat_model)]) == 0
    capsys.readouterr()
    other_model = ["--set", "models.opponent.options.path=elsewhere"]
    assert main(["validate", CONFIG, *_debate_args(chat_model), *other_model]) == 2
    assert "models.opponent.options: a snapshot group must load the same model" in capsys.readouterr().err
    served = ["models.opponent.backend=verl", "models.opponent.options.workers=ray"]
    assert main(["validate", CONFIG, *_debate_args(chat_model, *served)]) == 2
    assert "models.opponent.options.rollout: a verl snapshot group plays saved weights" in capsys.readouterr().err
