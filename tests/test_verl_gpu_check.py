"""scripts/gpu_check_verl.py tier A at a tiny shape on CPU: the GPU check's own checks must pass here, so a GPU run
fails only for GPU reasons."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from tests.conftest import REPO


def test_tier_a_checks_pass_at_tiny_shape(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check_verl", REPO / "scripts" / "gpu_check_verl.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", ["gpu_check_verl.py", "--tiny", "--rows", "4", "--out", str(out)])
    assert script.main() == 0
    report = json.loads(out.read_text())
    assert report["tier"] == "A" and report["ok"] and set(report["groups"]) == {"alpha", "beta"}
    for group in report["groups"].values():
        assert group["logprob_vs_hf_mean_abs"] < 1e-5 and group["load_restores_max_abs"] == 0.0
        assert group["sync_logprob_diff"] <= 1e-5 and group["export_matches_hf_state_dict"]


def test_tier_b_says_plainly_that_it_did_not_run(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check_verl", REPO / "scripts" / "gpu_check_verl.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", ["gpu_check_verl.py", "--vllm"])
    assert script.main() == 2
    assert json.loads(capsys.readouterr().out)["ran"] is False


def test_tier_a_runs_with_verls_ray_imports_answered_by_the_stand_in(tmp_path):
    """As on a GPU machine without Ray: the script must not need a real Ray module."""
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check_verl.py"), "--tiny", "--rows", "2",
                           "--ray-stand-in", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ray"] == "0+unimas-stand-in" and report["ok"]
