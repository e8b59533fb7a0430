#!/usr/bin/env bash
# The test command (README; .ci/run calls exactly this): the system packages some tests need (installed when
# missing and apt-get can, else the tests that will skip are named), unimas with its test extra in .venv (CPU
# torch first), then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system_packages.sh
python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q torch==2.13.0            # CPU build; a bare `torch` requirement can pull a multi-GB CUDA build
pip install -q -e ".[test,bench]"
python -m pytest -q "$@"
