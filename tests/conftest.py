import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    """A run stopped by SIGTERM (a CI timeout, ``timeout``, a closed terminal) ends as Ctrl-C does: pytest
    still prints its summary line (passed, failed, skipped so far). Only in the process that reports (the
    xdist controller, or a run without workers)."""
    if not hasattr(config, "workerinput"):
        signal.signal(signal.SIGTERM, _interrupt)


def pytest_collection_modifyitems(config, items):
    """Test files with the most slow tests run first (a stable sort: each file's own order is kept).

    Under ``pytest-xdist --dist loadfile`` (scripts/test.sh) workers take files in this order, so the long
    files start early and the run does not end on one worker finishing a long file alone.
    """
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])


@pytest.fixture(scope="session", autouse=True)
def _ray_stopped_at_the_end():
    """Stop a Ray instance that verl groups left running before this worker exits, not in the interpreter's
    exit handlers: one full run left an orphaned Ray worker (verl's load balancer, 550 MB) behind."""
    yield
    if "ray" in sys.modules:  # never import Ray only to find it unused
        release_leftover_ray()


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def real_run(tmp_path_factory) -> Path:
    """One short quickstart training run per test session, shared by the report and metrics-doc tests."""
    from unimas.cli import main

    run = tmp_path_factory.mktemp("quickstart-run")
    short = ["--set", "trainer.steps=3", "--set", "trainer.eval_every=1", "--set", "trainer.tasks_per_step=8"]
    assert main(["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(run), *short]) == 0
    return run


def shared_chat_model(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory, name: str = "tiny-chat",
                      **options) -> Path:
    """A tiny chat model dir built once per test run, whatever the number of pytest-xdist workers.

    Every xdist worker's temp dir is a child of the run's: the first worker that asks builds the model there
    (seconds of one core), the others wait on a lock and read the same files rather than each building its own
    copy of the same bytes (the build is seeded: tests/test_tiny_chat.py).
    """
    import fcntl

    from unimas.testing.tiny_chat import chat_model_dir

    root = tmp_path_factory.getbasetemp()
    if hasattr(config, "workerinput"):
        root = root.parent  # the run's dir, shared by its workers only (a fresh one each run)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return chat_model_dir(root / "models", name=name, **options)


@pytest.fixture(scope="session")
def chat_model(request, tmp_path_factory) -> Path:
    """A tiny Qwen2-style chat model dir (byte-level BPE, ChatML template), built once per test run."""
    return shared_chat_model(request.config, tmp_path_factory)


def save_tiny_model(path: Path, spec: dict) -> str:
    """A random-init tiny model (``spec``: TinyModelConfig fields) and its char tokenizer saved as an HF dir."""
    from unimas.groups.hf.chars import build_char_tokenizer
    from unimas.groups.hf.model_source import TinyModelConfig
    from unimas.groups.hf.tiny import build_tiny_model

    tokenizer = build_char_tokenizer(spec["alphabet"])
    build_tiny_model(TinyModelConfig(**spec), tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def release_leftover_ray() -> None:
    """Stop the Ray instance an earlier test file left running in this worker process.

    A verl group starts a local instance when none is up and keeps it, as ``ray.init`` does for any
    Python session (``unimas.groups.verl.servers.ensure_ray``); the Ray runtime tests need a process
    connected to no instance, whichever files this worker ran before them.
    """
    import ray

    if ray.is_initialized():
        ray.shutdown()
