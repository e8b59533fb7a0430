import json
import os
import signal
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


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Measured seconds per test file (setup, call and teardown of its tests; ``UNIMAS_RECORD_FILE_SECONDS=1``)."""
SECONDS_PER_SLOW_TEST = 5.0
"""For a file the record does not know yet: what one of its slow tests is taken to cost."""


def expected_seconds(items) -> dict:
    """Each collected file's expected run time: the recorded one, else an estimate from its slow tests."""
    recorded = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    return {path: recorded.get(path.relative_to(REPO).as_posix(), SECONDS_PER_SLOW_TEST * slow[path])
            for path in {item.path for item in items}}


MULTIPROCESS_FILES = ("test_ray_runtime.py", "test_ray_multinode.py", "test_verl_workers.py",
                      "test_verl_workers_train.py", "test_verl_lora_served.py", "test_verl_gpu_check.py",
                      "test_verl_critic.py", "test_verl_server.py", "test_benchmarks_smoke.py")
"""Files whose tests start a Ray instance, verl ranks or servers: several processes busy at once each."""
MULTIPROCESS_CHAINS = 2
"""At most this many of those files run at the same time (one chain of them per xdist worker)."""


def xdist_groups(seconds: dict) -> dict:
    """File -> xdist group: each file its own, but the multi-process files in ``MULTIPROCESS_CHAINS`` chains.

    Three workers on two cores each running a Ray- or verl-rank test oversubscribe the machine (each test
    keeps 3-5 processes busy): measured, such tests then took ~3x their time alone. Chained, at most two
    run at once, and the third worker takes the single-process files. Chains are balanced by expected time.
    """
    chains = [0.0] * MULTIPROCESS_CHAINS
    groups = {}
    for path in sorted(seconds, key=lambda p: -seconds[p]):
        if path.name in MULTIPROCESS_FILES:
            chain = chains.index(min(chains))
            chains[chain] += seconds[path]
            groups[path] = f"multiprocess-{chain}"
        else:
            groups[path] = path.relative_to(REPO).as_posix()
    return groups


def pytest_collection_modifyitems(config, items):
    """The longest work runs first (a stable sort: each file's own order is kept), each file on one worker.

    Under ``pytest-xdist --dist loadgroup`` (scripts/test.sh) every test carries its file's group (see
    :func:`xdist_groups`), so a file's module fixtures are built once, and workers take the groups in this
    order: the long ones start early and the run does not end on one worker finishing a long file alone
    (longest processing time first). Lengths come from ``tests/file_seconds.json``, measured on the idle
    2-core machine; a file it does not list counts its slow tests.
    """
    seconds = expected_seconds(items)
    groups = xdist_groups(seconds)
    group_seconds = Counter()
    for path, group in groups.items():
        group_seconds[group] += seconds[path]
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.path]))
    items.sort(key=lambda item: (-group_seconds[groups[item.path]], groups[item.path]))


_spent: Counter = Counter()


def pytest_runtest_logreport(report):
    """Add up each file's seconds (the xdist controller receives every worker's reports)."""
    _spent[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session):
    """With ``UNIMAS_RECORD_FILE_SECONDS=1``, write the files' seconds of a whole run to ``tests/file_seconds.json``."""
    if os.environ.get("UNIMAS_RECORD_FILE_SECONDS") == "1" and not hasattr(session.config, "workerinput") and _spent:
        FILE_SECONDS.write_text(json.dumps({path: round(s, 1) for path, s in sorted(_spent.items())}, indent=1) + "\n")


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
    from unimas.groups.torch.chars import build_char_tokenizer
    from unimas.groups.torch.options import TinyModelConfig
    from unimas.groups.torch.tiny import build_tiny_model

    tokenizer = build_char_tokenizer(spec["alphabet"])
    build_tiny_model(TinyModelConfig(**spec), tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
