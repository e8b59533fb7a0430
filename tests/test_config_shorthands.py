"""One flag freezes a group's roles, ``models.<g>.path`` is the model directory, and a missing model dir says
how to get it: the build command of the test model, a download only for a hub name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.config.loading import load_config, missing_model_hint


def write(tmp_path: Path, mutate, base: Path = EXAMPLES / "quickstart.yaml") -> Path:
    tree = yaml.safe_load(base.read_text())
    mutate(tree)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def frozen_listener_group(tree: dict) -> None:
    """A second, frozen copy of the shared group that the listener acts with."""
    tree["models"]["judge"] = {**tree["models"]["shared"], "trainable": False}
    tree["roles"]["listener"]["model"] = "judge"


def test_a_frozen_group_freezes_its_roles(tmp_path, capsys):
    config_path = write(tmp_path, frozen_listener_group)
    assert main(["validate", str(config_path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "listener -> judge (frozen," in out and "speaker -> shared (plain" in out
    config = load_config(config_path)
    assert config.roles["listener"].trainable is False and config.roles["speaker"].trainable is True


def test_a_trainable_role_on_a_frozen_group_names_both_fields(tmp_path, capsys):
    def conflict(tree):
        frozen_listener_group(tree)
        tree["roles"]["listener"]["trainable"] = True
    code = main(["validate", str(write(tmp_path, conflict))])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "roles.listener.trainable: true conflicts with models.judge.trainable: false" in err


def test_group_path_is_the_model_directory(tmp_path, chat_model, capsys):
    def shorthand_path(tree):
        del tree["models"]["shared"]["options"]
        tree["models"]["shared"]["path"] = str(chat_model)
    shorthand = write(tmp_path, shorthand_path, base=EXAMPLES / "quickstart_chat.yaml")
    assert main(["validate", str(shorthand)]) == 0, capsys.readouterr().err
    assert f"path {chat_model}" in capsys.readouterr().out
    assert load_config(shorthand).models["shared"].options == {"path": str(chat_model)}


def test_group_path_and_options_path_together_are_refused(tmp_path, capsys):
    both = write(tmp_path, lambda t: t["models"]["shared"].update(path="models/other"),
                 base=EXAMPLES / "quickstart_chat.yaml")
    code = main(["validate", str(both)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "models.shared" in err and "'path' and 'options.path' both name the model directory" in err


@pytest.mark.parametrize("path, needle, absent", [
    ("models/tiny-chat", "`python -m unimas.testing.tiny_chat ", "hf download"),
    ("models/tiny-chat-tools", "--tool-calls --max-positions 4096`", "hf download"),
    ("Qwen/Qwen2.5-0.5B-Instruct", "`hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR`", "tiny_chat"),
    ("models/Qwen2.5-0.5B-Instruct", "no config.json", "hf download"),
    ("no/such/model", "no config.json", "hf download"),
], ids=["test-model", "tool-test-model", "hub-id", "local-models-dir", "nested-path"])
def test_a_missing_model_dir_says_how_to_get_it(tmp_path, capsys, path, needle, absent):
    config = write(tmp_path, lambda t: t["models"]["shared"].update(options={"path": path}),
                   base=EXAMPLES / "quickstart_chat.yaml")
    code = main(["validate", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "models.shared.options.path" in err and needle in err and absent not in err


def test_the_build_command_names_the_directory_next_to_the_config(tmp_path, monkeypatch):
    """The suggested command, run from the current directory, builds the dir where the config looks for it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").mkdir()
    hint = missing_model_hint(str(tmp_path / "examples" / "models" / "tiny-chat"))
    assert hint.endswith("`python -m unimas.testing.tiny_chat examples/models/tiny-chat`")
    assert "hf download" in missing_model_hint("org/name") and missing_model_hint("./org/name") == ""


TEST_MODEL_EXAMPLES = sorted(path for path in [*EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("gateway/*.yaml")]
                             if "models/tiny-chat" in path.read_text())


@pytest.mark.parametrize("example", TEST_MODEL_EXAMPLES, ids=[p.name for p in TEST_MODEL_EXAMPLES])
def test_every_example_on_the_test_model_names_its_build_command(example, tmp_path, capsys):
    """Copied where no model is built yet, an example fails with the command that builds its test model."""
    copy = tmp_path / example.parent.relative_to(EXAMPLES) / example.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(example.read_text())
    code = main(["validate", str(copy)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "build it once, offline: `python -m unimas.testing.tiny_chat " in err and "hf download" not in err
