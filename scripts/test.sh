#!/usr/bin/env bash
# Install unimas with its test extra into .venv (CPU torch first) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q torch==2.13.0            # CPU build; a bare `torch` requirement can pull a multi-GB CUDA build
pip install -q -e ".[test,bench]"
python -m pytest -q "$@"
