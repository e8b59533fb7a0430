"""The console says where a run is, in words: labels instead of metric keys, no misleading stop line on a
failure, a finished run's resume in one line, and library noise only with ``--debug``."""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path

import pytest
import yaml

from unimas.cli import main
from unimas.config.loading import config_from_dict
from unimas.output.console import ConsoleLogger, quiet_libraries
from unimas.output.rundir import RunDir

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SHORT = ["trainer.tasks_per_step=4", "trainer.eval_size=4", "logging.report=false", "trainer.stop_at_accuracy=null"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _config(**changes):
    tree = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    tree.update(changes)
    return config_from_dict(tree, "quickstart.yaml")


RECORDS = [
    {"step": 0, "eval/accuracy": 0.25, "eval/reward/exact_match#0": 0.25, "eval/role/speaker/reward_mean": 1.5,
     "eval/role/listener/reward_mean": 1.25},
    {"step": 1, "reward/mean": 0.5, "role/speaker/reward_mean": 1.5, "group/shared/kl": 0.0},
    {"step": 2, "reward/mean": 0.75, "eval/accuracy": 0.5, "eval/role/speaker/reward_mean": 1.75},
]


def _show(config, stream, mode="train") -> str:
    logger = ConsoleLogger(config, RunDir(Path("unused")), stream=stream, mode=mode)
    for record in RECORDS if mode == "train" else RECORDS[:1]:
        logger.log(record)
    logger.close()
    return stream.getvalue()


def test_numbers_are_labelled_by_what_they_are_not_by_metric_keys():
    twice = [{"name": "exact_match", "level": "trajectory"}, {"name": "exact_match", "level": "trajectory"}]
    text = _show(_config(rewards=twice, trainer={"steps": 2}), io.StringIO())
    assert "#0" not in text and "eval/" not in text and "role/" not in text
    assert "eval reward (exact_match, rewards[0]) 0.250" in text
    assert "train reward (exact_match, rewards[0]) 0.750" in text
    # a role's credit is a sum of rewards (it can exceed 1): said so wherever it is shown
    assert "eval credit per turn (sum of rewards): speaker 1.50, listener 1.25" in text
    assert text.splitlines()[-1].startswith("done: 2/2 steps")


def test_unimas_eval_says_which_reward_entry_an_internal_key_is():
    from unimas.output.console import eval_metric_note

    twice = [{"name": "exact_match", "level": "trajectory"}, {"name": "exact_match", "level": "trajectory"}]
    config = _config(rewards=twice)
    assert eval_metric_note(config, "eval/reward/exact_match#1") == "reward 'exact_match', rewards[1]"
    assert eval_metric_note(config, "eval/accuracy") == "mean of the primary reward (exact_match, rewards[0])"
    assert "sum of the rewards" in eval_metric_note(config, "eval/role/speaker/reward_mean")
    once = _config()
    assert eval_metric_note(once, "eval/reward/exact_match") == ""  # the key is the reward's own name
    assert eval_metric_note(once, "eval/failures") == ""


def test_the_terminal_shows_steps_per_second_and_what_credit_is():
    text = _show(_config(trainer={"steps": 4}), _Terminal())
    assert "steps/s" in text and "ETA" in text and "step" in text
    assert "credit = a turn's weighted sum of rewards" in text
    assert "stopped early: 2/4 steps" in text


def _train(tmp_path, *sets: str) -> int:
    args = ["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(tmp_path / "run")]
    return main([*args, *[a for s in [*SHORT, *sets] for a in ("--set", s)]])


def test_resuming_a_finished_run_says_so_in_one_line(tmp_path, capsys):
    assert _train(tmp_path, "trainer.steps=1") == 0
    capsys.readouterr()
    assert main(["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(tmp_path / "run"), "--resume",
                 *[a for s in [*SHORT, "trainer.steps=1"] for a in ("--set", s)]]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{tmp_path / 'run'}: already complete at step 1 (trainer.steps: 1); "
                                "nothing to resume"]
    assert "Traceback" not in err and "stopped" not in out + err


def test_a_run_its_stop_condition_ended_is_complete_too(tmp_path, capsys):
    stop = ["trainer.steps=3", "trainer.eval_every=1", "trainer.stop_at_accuracy=0.0"]
    assert _train(tmp_path, *stop) == 0
    capsys.readouterr()
    resume = ["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(tmp_path / "run"), "--resume"]
    assert main([*resume, *[a for s in [*SHORT, *stop] for a in ("--set", s)]]) == 0
    assert "already complete at step 1 (trainer.stop_at_accuracy was met there)" in capsys.readouterr().out


PLUGIN = '''
import logging
import warnings

import unimas


async def noisy(ctx, task):
    logging.getLogger("peft.tuners.fake").warning("chatter from a library logger")
    logging.getLogger("/venv/lib/python3.11/site-packages/verl/workers/fake.py").warning("chatter from verl")
    warnings.warn_explicit("a library deprecation", FutureWarning, "fake.py", 1, module="torch.fake")
    logging.getLogger("my_plugin").warning("the user's own note")
    message = await ctx.act("speaker")
    guess = await ctx.act("listener", message=message)
    return {"answer": guess.parsed}


async def broken(ctx, task):
    raise RuntimeError("broken for every input")


@unimas.hookimpl
def unimas_workflows():
    return {"noisy": noisy, "broken": broken}
'''


@pytest.fixture
def plugin_config(tmp_path, monkeypatch):
    """``plugin_config(workflow) -> path``: the quickstart running one of :data:`PLUGIN`'s workflows."""
    module = f"console_plugin_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(workflow: str) -> Path:
        tree = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
        tree.update(plugins=[module], workflow={"name": workflow})
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree))
        return tmp_path / "config.yaml"

    return write


def test_a_failing_run_prints_the_error_and_no_stop_line(plugin_config, tmp_path, capsys):
    args = ["train", str(plugin_config("broken")), "--run-dir", str(tmp_path / "run")]
    code = main([*args, *[a for s in [*SHORT, "trainer.steps=1"] for a in ("--set", s)]])
    out, err = capsys.readouterr()
    assert code == 2 and "error:" in err and "broken for every input" in err
    assert "stopped" not in out and "steps" not in out


@pytest.mark.parametrize("debug", [False, True])
def test_library_noise_shows_only_with_debug(plugin_config, tmp_path, monkeypatch, capsys, recwarn, debug):
    monkeypatch.setattr(logging.root, "handlers", [])  # records reach stderr through logging's last resort
    args = ["train", str(plugin_config("noisy")), "--run-dir", str(tmp_path / "run"),
            *[a for s in [*SHORT, "trainer.steps=1"] for a in ("--set", s)]]
    assert main(["--debug", *args] if debug else args) == 0
    err = capsys.readouterr().err
    library_warnings = [w for w in recwarn if "a library deprecation" in str(w.message)]
    assert "the user's own note" in err
    assert ("chatter from a library logger" in err) == debug
    assert ("chatter from verl" in err) == debug  # verl names loggers by their file
    assert bool(library_warnings) == debug


def test_quiet_libraries_restores_everything_it_changed(monkeypatch):
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    before = list(warnings.filters)
    with quiet_libraries():
        import os

        assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
        assert logging.lastResort.filters
    assert "TRANSFORMERS_VERBOSITY" not in __import__("os").environ
    assert warnings.filters == before and not logging.lastResort.filters
