"""pyproject.toml: PEP 639 license metadata that setuptools reads without a deprecation warning."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_with_its_file():
    meta = project()["project"]
    assert meta["license"] == "Apache-2.0"
    assert meta["license-files"] and all((ROOT / name).is_file() for name in meta["license-files"])
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert not any(c.startswith("License ::") for c in meta.get("classifiers", []))  # PEP 639: the expression only
    assert "setuptools>=77" in project()["build-system"]["requires"]


def test_metadata_builds_without_a_setuptools_deprecation_warning(tmp_path):
    """Built from a copy of the project files, so the repository's egg-info is left alone."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("unimas", "plugins", "workflows"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path / "metadata"
    out.mkdir()
    code = ("import warnings; warnings.simplefilter('error');"
            f"from setuptools import build_meta; print(build_meta.prepare_metadata_for_build_wheel({str(out)!r}))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    metadata = next(out.glob("*.dist-info/METADATA")).read_text()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
