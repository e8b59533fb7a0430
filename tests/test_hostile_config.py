"""Hostile and careless inputs to the config loader and the CLI that got past the earlier catalogues
(tests/test_bad_configs.py, tests/test_broken_inputs.py).

Each one ended in a traceback, a MemoryError, a hang, a setting silently read as something else, or a
user's file overwritten. Every one must end in exit code 2 and a message naming the field, the override
or the path, with nothing written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.test_bad_configs import setting, tree
from unimas.cli import main
from unimas.config.loading import load_config

QUICKSTART = EXAMPLES / "quickstart.yaml"
NO_TRAINING = ("--set", "trainer.steps=0", "--set", "trainer.eval_size=2", "--set", "logging.report=false")
"""Overrides that make a run that would go ahead (the bug these tests guard against) end within a second."""


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    code = main([str(arg) for arg in argv])
    return code, capsys.readouterr().err


def assert_user_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in: {err}"


# -- the config file itself ---------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["loop", "missing"])
def test_a_config_that_is_a_broken_symlink_says_so(target: str, tmp_path, capsys):
    """Both were reported as "config file not found" although ``ls`` shows the file."""
    config = tmp_path / "experiment.yaml"
    config.symlink_to(tmp_path / "loop.yaml" if target == "loop" else tmp_path / "moved.yaml")
    if target == "loop":
        (tmp_path / "loop.yaml").symlink_to(config)
    code, err = run(capsys, "validate", config)
    assert_user_error(code, err, str(config), "symbolic link that leads nowhere")


# -- numbers YAML 1.1 reads as text ---------------------------------------------------------------------------

@pytest.mark.parametrize("written, fix", [("1e-3", "1.0e-03 or 0.001"), ("2.5E4", "2.5e+04 or 25000.0")])
def test_a_float_param_written_with_a_bare_exponent_says_how_to_write_it(written: str, fix: str, tmp_path, capsys):
    """PyYAML reads ``1e-3`` as the string '1e-3' (YAML 1.1 wants a dot and a signed exponent), so a strictly
    checked float parameter was refused with "got str '1e-3'" for what the user wrote as a number."""
    config = tree(lambda c: c["algorithm"].update(loss="m2po", loss_params={"tau": "TAU"}))(tmp_path)
    config.write_text(config.read_text().replace("TAU", written))
    code, err = run(capsys, "validate", config)
    assert_user_error(code, err, "algorithm.loss_params.tau", f"got str '{written}'", f"write it as {fix}")
    config.write_text(config.read_text().replace(written, fix.split(" or ")[0]))
    assert run(capsys, "validate", config)[0] == 0  # the spelling the message gives is read as a number


# -- counts too large for any machine: validated fine, then a traceback, a MemoryError or a hang ------------

@pytest.mark.parametrize("override, needles", [
    ("trainer.torch_threads=100000000000000000000", ("trainer.torch_threads", "at most 1024")),
    ("algorithm.group_size=100000000000000000000", ("trainer.tasks_per_step", "algorithm.group_size",
                                                     "episodes per step")),
    ("trainer.tasks_per_step=100000000000000000000", ("trainer.tasks_per_step", "episodes per step")),
    ("trainer.eval_samples=100000000000000000000", ("trainer.eval_samples", "episodes per evaluation")),
], ids=["torch-threads", "group-size", "tasks-per-step", "eval-samples"])
def test_a_count_no_machine_can_hold_is_refused_by_validate(override: str, needles: tuple[str, ...], capsys):
    """torch raised an overflow from ``set_num_threads``, the episode lists ran out of memory or took hours
    to build: all after validation had said ok."""
    code, err = run(capsys, "validate", QUICKSTART, "--set", override)
    assert_user_error(code, err, *needles)


def test_a_large_eval_size_is_a_cap_not_a_count(capsys):
    """``eval_size`` only caps the eval split (8 tasks here), so a huge value runs 8 episodes: still valid."""
    code, err = run(capsys, "validate", QUICKSTART, "--set", "trainer.eval_size=100000000000000000000")
    assert code == 0, err


# -- a YAML boolean where a number belongs: pydantic read it as 1 or 0 ------------------------------------

@pytest.mark.parametrize("key, value", [
    ("trainer.save_every", True),  # was: a checkpoint every step
    ("models.shared.optim.lr", True),  # was: a learning rate of 1.0
    ("roles.speaker.generation.temperature", False),  # was: greedy sampling
    ("models.shared.resources.memory_gb", True),  # an Optional[float]
])
def test_a_boolean_where_a_number_belongs_is_refused(key: str, value: bool, tmp_path, capsys):
    code, err = run(capsys, "validate", setting(key, value)(tmp_path))
    assert_user_error(code, err, key, f"got the boolean {str(value).lower()}")


def test_booleans_still_set_boolean_settings():
    config = load_config(QUICKSTART, ["logging.report=no", "roles.speaker.trainable=false"])
    assert config.logging.report is False and config.roles["speaker"].trainable is False


# -- --set overrides ------------------------------------------------------------------------------------

@pytest.mark.parametrize("override", ["=5", "=", ".steps=5", "trainer..steps=5", "trainer.steps.=5"])
def test_an_override_with_an_empty_key_is_blamed_on_the_override(override: str, capsys):
    """It used to set a key named '' and be reported as an unknown key of the config file."""
    code, err = run(capsys, "validate", QUICKSTART, "--set", override)
    assert_user_error(code, err, "--set", f"override '{override}' has an empty key")
    assert "invalid config" not in err


def test_an_override_indexes_a_list_as_error_paths_do():
    """docs/config.md: any key can be overridden, and validation names list items ``rewards.0.weight``."""
    config = load_config(QUICKSTART, ["rewards.0.weight=2.5", "rewards.0.level=role"])
    assert (config.rewards[0].weight, config.rewards[0].level) == (2.5, "role")


@pytest.mark.parametrize("place", ["workflow.params", "logging.wandb", "algorithm.rollout.params"])
def test_an_override_key_deeper_than_a_config_may_nest_is_refused(place: str, capsys):
    """The file's nesting limit did not apply to ``--set`` keys: 3000 keys deep ended in a RecursionError
    (checking plugin params) or a pydantic serialisation error (the validate summary), as tracebacks."""
    deep = ".".join(["a"] * 3000)
    code, err = run(capsys, "validate", QUICKSTART, "--set", "algorithm.rollout.name=entropy_branch",
                    "--set", f"{place}.{deep}=1")
    assert_user_error(code, err, "--set", "keys deep", "at most 64 levels")


@pytest.mark.parametrize("override", ["rewards.1.weight=2", "rewards.-1.weight=2", "rewards.x.weight=2",
                                      f"rewards.{'9' * 5000}.weight=2"])  # int() refuses 5000 digits
def test_an_override_past_the_end_of_a_list_names_the_list(override: str, capsys):
    code, err = run(capsys, "validate", QUICKSTART, "--set", override)
    assert_user_error(code, err, "--set", "'rewards' is a list", "(0 to 0)")


# -- reward and workflow params: checked against the function's signature like algorithm plugin params --------

@pytest.mark.parametrize("override, needles", [
    ("rewards.0.params={fild: answer}", ("rewards[0].params.fild", "unknown parameter", "known: field, target")),
    ("rewards.0.params={field: [answer]}", ("rewards[0].params.field", "valid string")),
    ("workflow.params={rounds: 3}", ("workflow.params.rounds", "unknown parameter", "known: none")),
], ids=["reward-unknown-name", "reward-wrong-type", "workflow-unknown-name"])
def test_a_reward_or_workflow_param_the_function_does_not_take_is_refused_by_validate(override: str,
                                                                                       needles: tuple[str, ...],
                                                                                       capsys):
    """validate said ok; training loaded the models, then failed every evaluation episode with a TypeError
    and blamed "the workflow or reward code" for what was a config mistake."""
    code, err = run(capsys, "validate", QUICKSTART, "--set", override)
    assert_user_error(code, err, *needles)


def test_reward_params_the_function_takes_still_validate(capsys):
    code, err = run(capsys, "validate", QUICKSTART, "--set", "rewards.0.params={field: answer, target: answer}")
    assert code == 0, err


# -- run directories and checkpoints ----------------------------------------------------------------------

@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("given", ["config.yaml", "experiment.yaml"], ids=["its-own-config", "another-config"])
def test_a_run_dir_holding_files_but_no_run_is_refused_and_left_alone(command: str, given: str, tmp_path, capsys):
    """``unimas train exp/config.yaml --run-dir exp`` (or ``--run-dir .`` in a project, or ``/``) wrote the
    resolved config over the user's own ``config.yaml`` and put metrics and checkpoints among their files."""
    own = QUICKSTART.read_text() + "# my notes\n"
    (tmp_path / "config.yaml").write_text(own)
    if given != "config.yaml":
        shutil.copy(QUICKSTART, tmp_path / given)
    before = sorted(path.name for path in tmp_path.iterdir())
    code, err = run(capsys, command, tmp_path / given, "--run-dir", tmp_path, *NO_TRAINING)
    assert_user_error(code, err, f"--run-dir {tmp_path}", "holds files but no unimas run", "config.yaml",
                      "nothing was changed")
    assert (tmp_path / "config.yaml").read_text() == own
    assert sorted(path.name for path in tmp_path.iterdir()) == before


def test_an_empty_existing_run_dir_is_still_used(tmp_path, capsys):
    code, err = run(capsys, "train", QUICKSTART, "--run-dir", tmp_path, *NO_TRAINING)
    assert code == 0, err
    assert (tmp_path / "metrics.jsonl").is_file()


def test_resuming_from_the_runs_own_config_is_still_allowed(tmp_path, capsys):
    """``unimas train RUN/config.yaml --run-dir RUN --resume`` reads the config that the run wrote."""
    run_dir = tmp_path / "run"
    assert run(capsys, "train", QUICKSTART, "--run-dir", run_dir, *NO_TRAINING)[0] == 0
    code, err = run(capsys, "train", run_dir / "config.yaml", "--run-dir", run_dir, "--resume", *NO_TRAINING)
    assert code == 0, err


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("where, needle", [
    ("a_file", "is not a directory"),
    ("a_file/run", "a_file is not a directory"),
    ("dangling_link", "is not a directory"),
], ids=["file", "inside-a-file", "dangling-symlink"])
def test_a_run_dir_that_cannot_be_a_directory_is_refused(command: str, where: str, needle: str, tmp_path, capsys):
    """mkdir raised FileExistsError or NotADirectoryError as a traceback (after the run had started)."""
    (tmp_path / "a_file").write_text("not a run\n")
    (tmp_path / "dangling_link").symlink_to(tmp_path / "nowhere")
    config = tmp_path / "experiment.yaml"
    shutil.copy(QUICKSTART, config)
    code, err = run(capsys, command, config, "--run-dir", tmp_path / where, *NO_TRAINING)
    assert_user_error(code, err, "--run-dir", needle)
    assert (tmp_path / "a_file").read_text() == "not a run\n" and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("checkpoint", ["nowhere", "a_file", "."], ids=["missing", "a-file", "not-a-checkpoint"])
def test_eval_of_a_bad_checkpoint_writes_nothing(checkpoint: str, tmp_path, monkeypatch, capsys):
    """The check came after the run directory (default: a new one under runs/) was made and the models
    were loaded, so each typo left an empty run directory behind."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("not a checkpoint\n")
    code, err = run(capsys, "eval", QUICKSTART, "--checkpoint", checkpoint)
    assert_user_error(code, err, checkpoint, "not a complete unimas checkpoint")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize("argv", [
    ["train", str(QUICKSTART), "--run-dir", "r" * 5000, *NO_TRAINING],
    ["eval", str(QUICKSTART), "--run-dir", "r" * 5000, *NO_TRAINING],
    ["eval", str(QUICKSTART), "--checkpoint", "c" * 5000, *NO_TRAINING],
], ids=["train-run-dir", "eval-run-dir", "eval-checkpoint"])
def test_a_path_too_long_for_the_file_system_is_a_user_error(argv: list[str], tmp_path, monkeypatch, capsys):
    """``stat`` raised ENAMETOOLONG (OSError) out of the run-directory and checkpoint checks as a traceback."""
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, *argv)
    assert_user_error(code, err, "File name too long")
    assert list(tmp_path.iterdir()) == []


# -- command-line numbers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["validate", str(QUICKSTART), "--episodes", "-1"], "argument --episodes: must be 0 or more"),
    (["serve", str(QUICKSTART), "--port", "70000"], "argument --port: must be a port from 0 to 65535"),
    (["serve", str(QUICKSTART), "--port", "-1"], "argument --port: must be a port from 0 to 65535"),
    (["sandbox", str(QUICKSTART), "--timeout", "inf", "--allow-fallback"], "argument --timeout: must be a finite"),
    (["serve", str(QUICKSTART), "--port", "http"], "argument --port: must be a whole number, got 'http'"),
], ids=["negative-episodes", "port-too-large", "negative-port", "infinite-timeout", "port-not-a-number"])
def test_an_out_of_range_option_is_a_usage_error(argv: list[str], needle: str, capsys):
    """These reached an IndexError (no dry-run episode to show), ``bind`` (OverflowError) or
    ``math.ceil(inf)`` as tracebacks."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_more_dry_run_episodes_than_memory_holds_are_refused_before_any_run(capsys):
    """The dry run built its episode list before running any: ``--episodes 10**20`` ended in a MemoryError."""
    code = main(["validate", str(QUICKSTART), "--episodes", "1000001"])
    out, err = capsys.readouterr()
    assert_user_error(code, err, "--episodes", "at most 1000000")
    assert "ok:" not in out


# -- backend options and cluster files share the config's strictness ------------------------------------------

@pytest.mark.parametrize("override, field", [
    ("models.shared.options.tiny.num_layers=true", "models.shared.options.tiny.num_layers"),
    ("models.shared.options.tiny.init_std=.nan", "models.shared.options.tiny.init_std"),
])
def test_backend_options_refuse_booleans_and_nan_where_numbers_belong(override: str, field: str, capsys):
    """A backend's options are config too: ``num_layers: true`` was a model of one layer."""
    code, err = run(capsys, "validate", QUICKSTART, "--set", override)
    assert_user_error(code, err, field)


@pytest.mark.parametrize("node", ["{cpus: .inf, memory_gb: 64}", "{cpus: 8, memory_gb: .inf}",
                                  "{cpus: true, memory_gb: 64}"])
def test_a_cluster_file_refuses_infinite_or_boolean_sizes(node: str, tmp_path, capsys):
    """An infinite CPU count made every config fit; ``true`` CPUs was one CPU."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"- {node}\n")
    code, err = run(capsys, "validate", QUICKSTART, "--cluster", cluster)
    assert_user_error(code, err, str(cluster))
