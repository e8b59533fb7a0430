"""The recorded synchronous runs whose shape and counts ``algorithm.max_staleness: 0`` must reproduce.

``python -m tests.async_golden`` (re)records ``tests/data/sync_golden.json``: short fixed-seed
quickstart runs (one shared group; one group per role) on the synchronous loop, metrics without
timings. It was recorded before the asynchronous pipeline existed; re-record only on purpose. Only the
metric names and the values the config decides are compared (``tests/test_async_pipeline.py``): the sampled ones
differ between CPUs.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.conftest import EXAMPLES

GOLDEN = Path(__file__).parent / "data" / "sync_golden.json"
CONFIGS = ("quickstart.yaml", "quickstart_separate.yaml")
SETTINGS = ["trainer.steps=3", "trainer.eval_every=2", "trainer.tasks_per_step=4", "trainer.stop_at_accuracy=null",
            "logging.report=false", "logging.console=false"]
VOLATILE = ("time/", "_time_s", "_per_s", "wall_s")


def stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not any(part in k for part in VOLATILE)} for r in records]


def run(config: str, run_dir: Path, extra: list[str] = (), resume: bool = False) -> list[dict]:
    """Train ``config`` with :data:`SETTINGS` and ``extra`` (``--set`` values); its metrics without timings."""
    import torch

    from unimas.cli import main

    torch.set_num_threads(1)
    sets = sum((["--set", s] for s in [*SETTINGS, *extra]), [])
    assert main(["train", str(EXAMPLES / config), "--run-dir", str(run_dir), *(["--resume"] if resume else []),
                 *sets]) == 0
    return stable([json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        golden = {config: run(config, Path(tmp) / config) for config in CONFIGS}
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"recorded {GOLDEN}", file=sys.stderr)
