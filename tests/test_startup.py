"""``import unimas`` and the quick commands stay cheap: they do not load torch, transformers, verl or ray.

A plugin module's first line is ``import unimas``, and ``unimas plugins``
imports every installed plugin, so a heavy import anywhere on these paths
costs every user seconds. Each check runs in a fresh interpreter (this test
process has torch loaded already) and reads ``sys.modules`` afterwards: a
behaviour check, not a timing one (benchmarks/startup.py has the times).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import unimas
from tests.conftest import REPO
from unimas.config.plugin_params import params_spec
from unimas.contract.registry import Deferred, Entry, build_registry
from unimas.errors import UserError

HEAVY = ("torch", "transformers", "verl", "ray", "peft", "matplotlib")

_REPORT = "import json, sys; print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))"


def loaded_after(code: str, cache: Path | None = None) -> set[str]:
    """Top-level packages in ``sys.modules`` after ``code`` runs in a fresh interpreter (``cache``: its
    ``UNIMAS_CACHE_DIR``)."""
    env = {**os.environ, "UNIMAS_CACHE_DIR": str(cache)} if cache is not None else None
    proc = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads(proc.stdout.splitlines()[-1]))


def quiet_cli(*argv: str) -> str:
    """The CLI run in-process with its output swallowed (``--help`` exits through SystemExit)."""
    return ("import contextlib, io\nfrom unimas.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        assert main({list(argv)!r}) == 0\n    except SystemExit as exc:\n"
            "        assert exc.code == 0\n")


@pytest.mark.parametrize("code", [
    "import unimas",
    "import unimas; unimas.hookimpl; unimas.UserError; unimas.Workflow",
    "from unimas.contract.registry import build_registry; assert build_registry().names('backends')",
    quiet_cli("--help"),
    quiet_cli("plugins"),
    quiet_cli("plugins", "--verbose"),
], ids=["import", "eager-names", "discovery", "help", "plugins", "plugins-verbose"])
def test_start_up_paths_import_nothing_heavy(code, warm_cache):
    """With verl's algorithm list cached (``unimas plugins`` lists grpo, gae, vanilla ... from it)."""
    heavy = loaded_after(code, warm_cache) & set(HEAVY)
    assert heavy == set(), f"loaded {sorted(heavy)}"


@pytest.mark.slow
def test_the_check_would_see_a_heavy_import():
    """The probe itself works: importing the torch backend's group does load torch. (``unimas.train`` no
    longer does: the trainer's modules import torch only through the groups they build.)"""
    assert "torch" in loaded_after("import unimas.groups.torch.group")


def test_lazy_names_are_the_defining_modules_objects():
    from unimas.controller.context import EpisodeContext
    from unimas.groups.base import ModelGroup
    from unimas.trajectory import GraphTrajectory

    assert (unimas.EpisodeContext, unimas.ModelGroup, unimas.GraphTrajectory) == (EpisodeContext, ModelGroup,
                                                                                  GraphTrajectory)
    assert set(unimas.__all__) <= set(dir(unimas))
    with pytest.raises(AttributeError, match="no attribute 'GraphTrajectroy'"):
        unimas.GraphTrajectroy  # noqa: B018 - the attribute access is the test


def test_registry_imports_a_backend_when_it_is_asked_for():
    from unimas.groups.torch import TorchBackend

    registry = build_registry()
    assert isinstance(registry.entries["backends"]["torch"].obj, Deferred)  # discovery did not import it
    assert registry.get("backends", "torch") is TorchBackend
    assert registry.entries["backends"]["torch"].obj is TorchBackend  # imported once


@pytest.mark.parametrize("alphabet", ["SL:abcdefgh01234567", "aab ba\n\t:", "xyz<>"])
def test_a_tiny_models_vocabulary_without_a_tokenizer_is_its_tokenizers(alphabet):
    """What ``unimas validate`` reads off the options equals what the char tokenizer itself lists."""
    from unimas.groups.hf import source
    from unimas.groups.torch.backend import TorchBackend
    from unimas.groups.torch.options import TorchOptions

    options = TorchOptions(tiny={"alphabet": alphabet})
    assert TorchBackend.vocabulary(options) == source.vocabulary(options)
    assert TorchBackend.has_chat_template(options) is False


VALIDATE_PROBE = ("import sys; from unimas.cli import main; code = main(['validate', sys.argv[1]]); "
                  "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'verl', 'ray') if m in sys.modules)); "
                  "sys.exit(code)")


def validate_in_a_fresh_interpreter(config: Path, cache: Path) -> str:
    """The output of ``unimas validate config``, then the heavy packages it left in ``sys.modules``."""
    done = subprocess.run([sys.executable, "-c", VALIDATE_PROBE, str(config)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "UNIMAS_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> Path:
    """A cache dir holding the verl catalog: the first validate on a machine imports verl once to write it
    (unimas/algorithms/verl_catalog.py; tests/test_verl_catalog.py checks that step). Shared by the checks below,
    so each of them starts one fresh interpreter, not two."""
    cache = tmp_path_factory.mktemp("cache")
    validate_in_a_fresh_interpreter(REPO / "examples" / "quickstart.yaml", cache)
    return cache


@pytest.mark.slow
def test_validate_of_a_tiny_config_imports_neither_torch_nor_transformers(warm_cache):
    out = validate_in_a_fresh_interpreter(REPO / "examples" / "quickstart.yaml", warm_cache)
    assert "HEAVY []" in out, out[-500:]


@pytest.mark.slow
def test_validate_of_a_model_dir_config_imports_neither_torch_nor_transformers(tmp_path, chat_model, warm_cache):
    """The chat template comes from the dir's tokenizer files (unimas/groups/hf/tokenizer_files.py)."""
    text = (REPO / "examples" / "quickstart_chat.yaml").read_text()
    assert "{path: models/tiny-chat}" in text
    config = tmp_path / "chat.yaml"
    config.write_text(text.replace("{path: models/tiny-chat}", "{path: " + json.dumps(str(chat_model)) + "}"))
    out = validate_in_a_fresh_interpreter(config, warm_cache)
    assert "HEAVY []" in out and "speaker -> shared (chat template" in out, out[-1500:]


def test_a_backend_that_cannot_be_imported_is_a_user_error_naming_it():
    registry = build_registry()
    registry.entries["backends"]["broken"] = Entry("broken", "backends", Deferred("no_such_package.backend", "Group"),
                                                   "my-plugin")
    with pytest.raises(UserError) as caught:
        registry.get("backends", "broken", where="models.policy.backend")
    assert caught.value.where == "models.policy.backend"
    assert "no_such_package.backend.Group" in str(caught.value) and "my-plugin" in str(caught.value)


def test_parameter_types_are_read_only_for_the_parameters_that_count(tmp_path, monkeypatch):
    """verl's inputs may be annotated with types imported under TYPE_CHECKING; a bad parameter type still fails."""
    (tmp_path / "typed_estimator.py").write_text(
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import torch\n\n"
        "def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, *, scale: float = 1.0)"
        " -> tuple[torch.Tensor, torch.Tensor]:\n    return token_level_rewards, response_mask\n\n"
        "def broken(token_level_rewards, *, scale: Missing = 1.0):\n    return token_level_rewards\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import typed_estimator

    spec = params_spec(typed_estimator.estimator, "typed", keyword_only=True)
    assert list(spec.model.model_fields) == ["scale"] and spec.model.model_fields["scale"].annotation is float
    with pytest.raises(UserError, match="cannot read the parameter types of 'broken'.*Missing") as caught:
        params_spec(typed_estimator.broken, "broken", keyword_only=True)
    assert caught.value.where.endswith("typed_estimator.py:9")
