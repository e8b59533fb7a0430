"""scripts/test.sh installs the Debian packages the sandbox and report tests need, or names the tests that skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "system_packages.sh"
TOOLS = ("bash", "tr", "grep", "cat")
"""What the script runs besides the probed packages, apt-get, id and sudo."""


def fake_bin(tmp_path: Path, uid: int) -> Path:
    """A PATH with no chromium, bwrap or ldconfig; ``apt-get`` records its arguments, ``id -u`` says ``uid``."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in TOOLS:
        (folder / tool).symlink_to(shutil.which(tool))
    scripts = {"apt-get": f'echo "$@" >> {tmp_path}/apt-get.log', "id": f"echo {uid}", "sudo": "exit 1"}
    for name, body in scripts.items():
        (folder / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def run(tmp_path: Path, uid: int) -> subprocess.CompletedProcess:
    env = {"PATH": str(fake_bin(tmp_path, uid)), "HOME": str(tmp_path)}
    return subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(os.name != "posix" or shutil.which("bash") is None, reason="a POSIX shell script")
def test_missing_packages_are_installed_with_apt_get_as_root(tmp_path):
    result = run(tmp_path, uid=0)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "apt-get.log").read_text().splitlines() == [
        "update -qq", "install -y -qq chromium bubblewrap libseccomp2"]
    assert "installing chromium bubblewrap libseccomp2 with apt-get" in result.stdout


@pytest.mark.skipif(os.name != "posix" or shutil.which("bash") is None, reason="a POSIX shell script")
def test_without_root_the_tests_that_will_skip_are_named(tmp_path):
    result = run(tmp_path, uid=1000)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "apt-get.log").exists()
    out = result.stdout
    assert "no chromium (apt-get install chromium): the report screenshot tests (tests/test_report*.py) will skip" \
        in out
    assert "no bwrap (apt-get install bubblewrap): the sandbox tests (tests/test_sandbox.py" in out
    assert "no libseccomp.so.2 (apt-get install libseccomp2)" in out


def test_ci_runs_the_readme_test_command():
    root = SCRIPT.parents[1]
    assert "bash scripts/test.sh" in (root / "README.md").read_text()
    commands = [line for line in (root / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert commands[-1] == "bash scripts/test.sh"
    assert "bash scripts/system_packages.sh" in (root / "scripts" / "test.sh").read_text()
