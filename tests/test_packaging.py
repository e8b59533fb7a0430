"""pyproject.toml lists every folder that ships, so setuptools builds the wheel without a warning.

A folder under a package that holds files (modules or package data such as ``unimas/report/vendor``) is
importable as a namespace package; one missing from ``[tool.setuptools] packages`` makes setuptools warn
"Package ... is absent from the `packages` configuration" and, in a later setuptools, drop its files.
"""

from __future__ import annotations

import tomllib

from tests.conftest import REPO

SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def shipped_folders() -> dict[str, str]:
    """Dotted package name -> its folder (repo-relative), for every folder with files under each package root."""
    found = {}
    for package, folder in SETUPTOOLS["package-dir"].items():
        root = REPO / folder
        for path in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
            if "__pycache__" in path.parts or not any(child.is_file() for child in path.iterdir()):
                continue
            relative = path.relative_to(root).parts
            found[".".join((package, *relative))] = str(path.relative_to(REPO))
    return found


def test_every_folder_that_ships_is_a_listed_package():
    missing = {name: folder for name, folder in shipped_folders().items() if name not in SETUPTOOLS["packages"]}
    assert missing == {}, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_every_listed_package_exists():
    assert sorted(set(SETUPTOOLS["packages"]) - set(shipped_folders())) == []


def test_the_report_vendor_files_are_package_data():
    assert SETUPTOOLS["package-data"].get("unimas.report.vendor") == ["*"]
