"""A third-party plugin package, installed as a user would, is usable by name."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / "plugin_package"
    shutil.copytree(EXAMPLES / "plugin_package", source)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(source)],
        check=True,
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]))
    return env, source


def unimas(env, *args):
    return subprocess.run([sys.executable, "-m", "unimas.cli", *args], env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_plugin_names_are_listed_with_their_provider(installed_plugin):
    env, _ = installed_plugin
    result = unimas(env, "plugins")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    workflows = lines[lines.index("workflows:") + 1: lines.index("rewards:")]
    assert any("draft_and_edit" in line and "unimas-echo" in line for line in workflows)
    assert any("signalling" in line and "(unimas)" in line for line in workflows)
    for kind, name in (("estimators", "group_mean_baseline"), ("policy_losses", "reinforce")):
        section = lines[lines.index(f"{kind}:") + 1:]
        assert any(name in line and "unimas-echo" in line for line in section[:2]), kind


def test_the_plugin_imports_nothing_but_unimas(installed_plugin):
    """Written against the public surface: no deep imports of unimas internals."""
    _, source = installed_plugin
    text = (source / "src" / "unimas_echo" / "plugin.py").read_text()
    assert "import unimas\n" in text and "from unimas" not in text and "unimas." in text


@pytest.mark.slow
def test_config_uses_plugin_by_name_and_trains(installed_plugin, tmp_path):
    env, source = installed_plugin
    config = source / "config.yaml"
    assert unimas(env, "validate", str(config)).returncode == 0
    result = unimas(env, "train", str(config), "--run-dir", str(tmp_path / "run"), "--set", "logging.report=false")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]  # step-0 eval + 2 steps, with the plugin estimator and loss
    assert all(r["group/tiny/policy_loss"] != 0.0 for r in records[1:])


@pytest.mark.slow
def test_without_the_plugin_the_name_is_unknown(tmp_path):
    result = unimas(dict(os.environ), "validate", str(EXAMPLES / "plugin_package" / "config.yaml"))
    assert result.returncode == 2
    assert "unknown workflow 'draft_and_edit'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_duplicate_names_name_both_providers(installed_plugin, tmp_path):
    env, _ = installed_plugin
    (tmp_path / "clash.py").write_text(
        "import unimas\n\n@unimas.hookimpl\ndef unimas_rewards():\n    return {'same_word': lambda t, task: 0.0}\n"
    )
    env = dict(env, PYTHONPATH=os.pathsep.join([str(tmp_path), env["PYTHONPATH"]]))
    config = tmp_path / "c.yaml"
    config.write_text((EXAMPLES / "plugin_package" / "config.yaml").read_text() + "plugins: [clash]\n")
    result = unimas(env, "validate", str(config))
    assert result.returncode == 2
    assert "unimas-echo" in result.stderr and "module clash" in result.stderr
