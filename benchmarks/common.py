"""Shared helpers for the benchmarks: timing proxies, RSS, subprocess workers, tables, profiles.

Every benchmark follows the same rules:

* **Ratios within one invocation.** The compared systems run in the same
  invocation of the script, their repetitions interleaved (A B B A ...), and
  the table reports medians and the median of per-repetition ratios. The
  machine is shared, so absolute seconds drift; ratios of neighbours do not.
* **Memory in a fresh process.** A configuration whose memory is reported
  runs in its own subprocess (``python benchmarks/<name>.py --worker ...``),
  which prints one ``RESULT {json}`` line. Peak RSS is ``ru_maxrss`` of that
  process; "net" numbers subtract the RSS measured inside the same process at
  a stated point (always named in the table).
* **No edits to unimas.** Phases are timed from the outside: a proxy around
  the transport (what the trainer calls) and wrappers on one model group's
  bound methods (see :func:`instrument_group`).
* **Steps run as ``unimas train`` runs them.** A benchmark that calls
  ``Trainer.train_step`` itself wraps its steps in :func:`collector_as_in_training`.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = Path(__file__).resolve().parent
RESULT_PREFIX = "RESULT "


def ensure_importable() -> None:
    """Make ``import benchmarks.*`` work when a script is run as ``python benchmarks/x.py``."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def quiet_environment(threads: int) -> None:
    """Call before importing torch: fixes thread counts and silences progress bars/warnings."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("DISABLE_TQDM", "1")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


def setup_torch(threads: int, seed: int = 0) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)


# ------------------------------------------------------------------ memory


def rss_mb() -> float:
    """Current resident set size of this process, MiB."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------ timing


class Phases:
    """Named wall-clock accumulators, reset per step.

    With ``track_gc`` the cyclic garbage collector's pauses are added up
    under "gc" (they also count in whatever phase they interrupted): a
    framework that allocates many objects per step pays for them here.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, track_gc: bool = False):
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self._gc_started = 0.0
        if track_gc:
            import gc

            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = self.clock()
        else:
            self.seconds["gc"] += self.clock() - self._gc_started

    @contextlib.contextmanager
    def phase(self, name: str):
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[name] += self.clock() - start

    def reset(self) -> dict[str, float]:
        out = dict(self.seconds)
        self.seconds.clear()
        return out


class TimingTransport:
    """Wraps a unimas transport; times ``generate`` and ``update`` and records what went through.

    The trainer and router only call ``generate`` / ``update`` (and ``save`` /
    ``load``), so timing these two from the outside splits a step into
    generation, update and "everything else" without touching unimas code.
    With the in-process transport both calls run synchronously inside the
    coroutine, so the measured time is exactly the model group's time.
    """

    def __init__(self, inner, phases: Phases, record: bool = False):
        self.inner = inner
        self.phases = phases
        self.record = record
        self.gen_batches: list[tuple[str, list]] = []  # (group, requests)
        self.gen_results: list[tuple[str, list]] = []
        self.updates: list[tuple[str, list]] = []  # (group, turns)

    async def generate(self, group, requests):
        with self.phases.phase("generate"):
            results = await self.inner.generate(group, requests)
        if self.record:
            self.gen_batches.append((group, list(requests)))
            self.gen_results.append((group, list(results)))
        return results

    async def update(self, group, turns):
        with self.phases.phase("update"):
            stats = await self.inner.update(group, turns)
        if self.record:
            self.updates.append((group, list(turns)))
        return stats

    def clear_records(self) -> None:
        self.gen_batches.clear()
        self.gen_results.clear()
        self.updates.clear()

    def __getattr__(self, name):  # save, load, groups, shutdown, ...
        return getattr(self.inner, name)


def instrument_group(group, phases: Phases) -> None:
    """Time a TorchModelGroup's policy forward and reference forward inside ``update``.

    Wraps two bound methods of the group's policy on the instance (the class is untouched):
    ``logprobs`` while autograd is on is the policy forward of an update
    ("policy_fwd"); ``reference_logprobs`` is the KL reference forward
    ("ref_fwd", including the lazy copy of the reference on first use).
    What remains of ``update`` is loss, backward and optimiser step.
    """
    import torch

    policy = group.policy
    logprobs = policy.logprobs
    reference = policy.reference_logprobs

    def timed_logprobs(*args, **kwargs):
        if not torch.is_grad_enabled():
            return logprobs(*args, **kwargs)
        with phases.phase("policy_fwd"):
            return logprobs(*args, **kwargs)

    def timed_reference(*args, **kwargs):
        with phases.phase("ref_fwd"):
            return reference(*args, **kwargs)

    policy.logprobs = timed_logprobs
    policy.reference_logprobs = timed_reference


# ------------------------------------------------------------------ models


def save_tiny_model(directory: Path, alphabet: str, hidden: int = 64, layers: int = 2, heads: int = 4,
                    init_std: float = 0.1, tie: bool = False, seed: int = 0, max_positions: int = 64) -> Path:
    """A random-init Qwen2 + char tokenizer written with ``save_pretrained`` (what both TRL and unimas load)."""
    from unimas.groups.hf.chars import build_char_tokenizer
    from unimas.groups.hf.model_source import TinyModelConfig
    from unimas.groups.hf.tiny import build_tiny_model

    spec = TinyModelConfig(architecture="qwen2", alphabet=alphabet, hidden_size=hidden, num_layers=layers,
                           num_heads=heads, init_std=init_std, tie_embeddings=tie, max_positions=max_positions)
    tokenizer = build_char_tokenizer(alphabet)
    model = build_tiny_model(spec, tokenizer, seed)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_unimas(tree: dict, run_root: Path, phases: Phases, record: bool = False):
    """(trainer, timing transport) for a config dict; plugin modules in ``tree['plugins']`` must be importable."""
    ensure_importable()
    from unimas.config.loading import config_from_dict
    from unimas.output.rundir import RunDir
    from unimas.runtime.transport import start_transport
    from unimas.training.experiment import Experiment
    from unimas.training.trainer import Trainer

    config = config_from_dict(tree, "<benchmark>")
    experiment = Experiment.resolve(config)
    transport = TimingTransport(start_transport(config, experiment.registry), phases, record=record)
    trainer = Trainer(experiment, RunDir(Path(run_root)).create(), transport)
    return trainer, transport


@contextlib.contextmanager
def collector_as_in_training():
    """Python's garbage collector set as ``Trainer.run`` sets it for its steps (``settle_collector``), then put back.

    Without it, a benchmark that calls ``train_step`` itself times the default collector, which ``unimas train``
    never runs with: its full passes over the models' objects cost milliseconds a step.
    """
    import gc

    from unimas.training.trainer import settle_collector

    previous = settle_collector()
    try:
        yield
    finally:
        gc.set_threshold(*previous)


def warm_verl() -> None:
    """Import verl's core_algos now (unimas imports it lazily on the first update: ~4 s, ~150 MB)."""
    from verl.trainer.ppo import core_algos  # noqa: F401


# ------------------------------------------------------------------ workers


def run_parent(args: Any, run_all: Callable[[Any], Any], report: Callable[[Any, Any], str]) -> int:
    """Parent side of a worker-based benchmark: run every worker, optionally save JSON, print the table."""
    quiet_environment(args.threads)
    setup_torch(args.threads)
    results = run_all(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(report(args, results))
    return 0


def emit_result(payload: dict) -> None:
    """Worker side: the one line the parent parses."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


def run_worker(script: Path, args: Sequence[str], timeout: float = 600) -> dict:
    """Run ``python script --worker ... args`` in a fresh process; return its RESULT payload."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(REPO))
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            if proc.returncode != 0:
                break
            return json.loads(line[len(RESULT_PREFIX):])
    tail = (proc.stdout[-2000:] + "\n" + proc.stderr[-4000:]).strip()
    raise RuntimeError(f"worker {script.name} {' '.join(args)} failed (exit {proc.returncode}):\n{tail}")


# ------------------------------------------------------------------ statistics and output


def median(values: Iterable[float]) -> float:
    values = list(values)
    return float(statistics.median(values)) if values else float("nan")


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(statistics.fmean(values)) if values else float("nan")


def fmt(value: Any) -> str:
    """Compact numbers for tables: 1,234 / 123.4 / 12.3 / 1.23 / 0.123."""
    if isinstance(value, str):
        return value
    if value is None:
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    if value != value:  # nan
        return "–"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def machine_line(threads: int) -> str:
    import platform

    import torch

    load = os.getloadavg()[0]
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
            f"{threads} torch thread(s), load average at start {load:.2f}")


# ------------------------------------------------------------------ profiling


def start_profiler(interval: float = 0.0005):
    """A started pyinstrument profiler (wall clock)."""
    from pyinstrument import Profiler

    profiler = Profiler(interval=interval)
    profiler.start()
    return profiler


def _attributed(profiler, owned: Callable[[str], bool] | None) -> tuple[dict[tuple[str, str], float], float]:
    """Seconds per frame of a stopped profiler, and the total.

    Without ``owned``, frames are keyed by (function, file:line) and get
    their self time, summed over the call tree. With ``owned(path)``, every
    sample's time goes to the innermost frame whose file is owned (e.g.
    unimas's own code), so library time (torch, networkx, ...) lands on the
    project function that called it: "which of our functions costs what,
    including what it calls outside the project".
    """
    root = profiler.last_session.root_frame()
    total = root.time if root is not None else 0.0
    spent: dict[tuple[str, str], float] = defaultdict(float)

    def walk(frame, owner) -> None:
        key = (frame.function or "?", f"{frame.file_path_short or '?'}:{frame.line_no or 0}")
        if owned is not None:
            if frame.file_path and owned(frame.file_path):
                owner = key
            if owner is not None:
                spent[owner] += frame.total_self_time
        else:
            spent[key] += frame.total_self_time
        for child in frame.children:
            if not child.is_synthetic:
                walk(child, owner)

    if root is not None:
        walk(root, None)
    return spent, total


class RoundProfiler:
    """pyinstrument in rounds; frames ranked by their MEDIAN share of a round's time.

    A moment when the OS deschedules this process (other jobs on a shared
    machine) is charged to one random frame of one round; the median over
    rounds drops it. Call :meth:`tick` at round boundaries (it starts the
    first round), :meth:`finish` at the end.
    """

    def __init__(self, owned: Callable[[str], bool] | None = None, interval: float = 0.0005):
        self.owned = owned
        self.interval = interval
        self.shares: list[dict[tuple[str, str], float]] = []
        self.text = ""
        self._profiler = None

    def tick(self) -> None:
        self.finish()
        self._profiler = start_profiler(self.interval)

    def finish(self) -> None:
        if self._profiler is None:
            return
        self._profiler.stop()
        spent, total = _attributed(self._profiler, self.owned)
        if total:
            self.shares.append({key: value / total for key, value in spent.items()})
        self.text = self._profiler.output_text(unicode=False, color=False, show_all=False)
        self._profiler = None

    def frames(self, top: int = 15) -> list[dict]:
        keys = {key for share in self.shares for key in share}
        ranked = sorted(((key, median(share.get(key, 0.0) for share in self.shares)) for key in keys),
                        key=lambda kv: -kv[1])
        return [{"function": f, "where": w, "frac": frac} for (f, w), frac in ranked[:top]]


def profile_rounds(run_round: Callable[[], Any], rounds: int = 5, top: int = 15,
                   owned: Callable[[str], bool] | None = None) -> tuple[list[dict], str]:
    """Profile ``rounds`` separate calls of ``run_round`` (see :class:`RoundProfiler`)."""
    profiler = RoundProfiler(owned)
    for _ in range(rounds):
        profiler.tick()
        run_round()
    profiler.finish()
    return profiler.frames(top), profiler.text


def unimas_owned(path: str) -> bool:
    """Frames of unimas itself (the package, its built-in plugins and workflows)."""
    return any(f"{REPO}/{part}/" in path for part in ("unimas", "plugins", "workflows"))


def trl_owned(path: str) -> bool:
    """TRL's frames plus the transformers Trainer loop it runs in (``transformers/trainer*.py``)."""
    return f"{os.sep}trl{os.sep}" in path or f"{os.sep}transformers{os.sep}trainer" in path


def frames_table(frames: list[dict], label: str = "% of profiled time") -> str:
    return markdown_table([label, "function", "where"],
                          [[f"{100 * f['frac']:.1f}", f"`{f['function']}`", f"`{f['where']}`"] for f in frames])
