"""The garbage-collector settings a training run works under (``unimas.training.trainer.settle_collector``)."""

import gc

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.training.trainer import YOUNG_GC_THRESHOLD, settle_collector


def test_settle_collector_freezes_and_raises_only_the_young_threshold():
    previous, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    gc.set_threshold(700, 10, 10)
    try:
        assert settle_collector() == (700, 10, 10)  # what it replaced, for the caller to put back
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0
        gc.set_threshold(50_000, 10, 10)
        settle_collector()
        assert gc.get_threshold()[0] == 50_000  # a higher threshold set by the user is kept
    finally:
        gc.set_threshold(*previous)
        if not frozen_before:
            gc.unfreeze()


def test_a_training_run_puts_the_thresholds_back(tmp_path):
    previous = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        args = ["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(tmp_path), "--set", "logging.report=false",
                "--set", "trainer.steps=1", "--set", "trainer.tasks_per_step=2", "--set", "trainer.eval_every=0"]
        assert main(args) == 0
        assert (tmp_path / "metrics.jsonl").read_text().count("\n") >= 2  # step 0 and step 1 were logged
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*previous)
