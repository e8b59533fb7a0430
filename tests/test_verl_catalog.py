"""verl's algorithm registries known without importing verl (unimas/algorithms/verl_catalog.py).

The catalog must describe exactly what the installed verl registers, call verl's own functions, survive a
damaged or foreign cache file, and keep ``unimas validate`` free of ``import verl``.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import EXAMPLES, REPO
from unimas.algorithms import verl_catalog
from unimas.algorithms.estimators import estimators
from unimas.algorithms.losses import policy_losses
from unimas.contract.registry import build_registry


@pytest.fixture
def fresh_catalog(tmp_path, monkeypatch):
    """An empty cache dir of this test's own, and no catalog loaded in this process yet."""
    monkeypatch.setenv("UNIMAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(verl_catalog, "_loaded", None)
    return verl_catalog.cache_path(verl_catalog._install_key())


def shape(fn) -> list[tuple[str, str, bool]]:
    return [(p.name, p.kind.name, p.default is not p.empty) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("section", sorted(verl_catalog.REGISTRIES))
def test_the_catalog_is_verls_registry_by_name_and_signature(fresh_catalog, section):
    from verl.trainer.ppo import core_algos

    registry = getattr(core_algos, verl_catalog.REGISTRIES[section])
    catalog = verl_catalog.functions(section)
    assert list(catalog) == list(registry)
    for name, fn in registry.items():
        assert shape(catalog[name]) == shape(fn), name
    assert fresh_catalog.is_file()  # written for the next process


def test_a_catalog_entry_calls_verls_own_function(fresh_catalog):
    from verl.trainer.ppo import core_algos

    scores = torch.tensor([[1.0], [0.0], [0.5], [2.0]])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    through_catalog = estimators(build_registry([]))["grpo"](scores, index)
    direct, _ = core_algos.compute_grpo_outcome_advantage(scores, torch.ones_like(scores), index)
    assert torch.equal(through_catalog, direct)
    assert policy_losses(build_registry([]))["vanilla"].resolve() is core_algos.POLICY_LOSS_REGISTRY["vanilla"]


@pytest.mark.parametrize("damage", [
    lambda path: path.write_text("{not json"),
    lambda path: path.write_text(json.dumps({"install": "x", "estimators": {"gae": [{"name": 1}]},
                                             "policy_losses": {}})),
    lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "install": "verl 0.0.1 elsewhere"})),
    lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "estimators": {}, "extra": 1})),
], ids=["garbage", "wrong-types", "another-install", "unknown-field"])
def test_a_damaged_or_foreign_cache_is_rebuilt(fresh_catalog, monkeypatch, damage):
    verl_catalog.functions("estimators")
    damage(fresh_catalog)
    monkeypatch.setattr(verl_catalog, "_loaded", None)
    catalog = verl_catalog.functions("estimators")
    assert "gae" in catalog and "grpo" in catalog
    rebuilt = verl_catalog.Catalog.model_validate_json(fresh_catalog.read_text())
    assert rebuilt.install == verl_catalog._install_key() and "gae" in rebuilt.estimators


def test_an_unwritable_cache_dir_only_costs_the_import(fresh_catalog, tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("UNIMAS_CACHE_DIR", str(blocker / "cache"))
    assert "gae" in verl_catalog.functions("estimators")


@pytest.mark.slow
def test_validate_with_a_warm_cache_never_imports_verl(tmp_path):
    probe = ("import sys; from unimas.cli import main; code = main(['validate', sys.argv[1]]); "
             "print('IMPORTED', sorted(m for m in ('verl', 'tensordict', 'ray') if m in sys.modules)); "
             "sys.exit(code)")
    env = {"UNIMAS_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", probe, str(EXAMPLES / "quickstart.yaml")], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], runs[-1].stderr[-2000:]
    assert "'verl'" in runs[0].stdout  # the first run imports verl once and writes the cache
    assert "IMPORTED []" in runs[1].stdout, runs[1].stdout


def test_two_environments_alternating_each_keep_their_own_cache(fresh_catalog, monkeypatch):
    """Issue 45.4: a CPU venv and a GPU venv share one cache dir; each validate after the first reads its file.

    Two environments are simulated by two fingerprints (interpreter path, verl version); the count is of
    recomputations (each one is an ``import verl`` in a real process), not of seconds.
    """
    real_version, described = verl_catalog.metadata.version, []

    def describe(install):
        described.append(install)
        return real_describe(install)

    real_describe = verl_catalog._describe
    monkeypatch.setattr(verl_catalog, "_describe", describe)
    environments = {"cpu": ("/envs/cpu/bin/python", "0.9.1"), "gpu": ("/envs/gpu/bin/python", "0.9.1+gpu")}
    for name in ["cpu", "gpu", "cpu", "gpu", "cpu"]:  # each `unimas validate` is a fresh process
        interpreter, version = environments[name]
        monkeypatch.setattr(sys, "executable", interpreter)
        monkeypatch.setattr(verl_catalog, "metadata", type("Metadata", (), {
            "version": staticmethod(lambda dist, v=version: v if dist == "verl" else real_version(dist))}))
        monkeypatch.setattr(verl_catalog, "_loaded", None)
        assert "grpo" in verl_catalog.functions("estimators")
    assert len(described) == 2, described  # once per environment, never again
    assert len({verl_catalog.cache_path(install) for install in described}) == 2
