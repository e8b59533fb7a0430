"""State a run reads back: critic weights, critic settings, pending rollouts, replay state, credit channels.

Each case was seen to pass silently before (issue 43): a value head of NaN
resumed and trained on NaN, an empty or parent-directory ``critic.path``
validated, a ``critic.path`` added on resume was applied mid-run, pending
rollouts of a step the checkpoint cannot hold were dropped, a replay state
without its buffer resumed empty, and a ``gdpo`` channel no reward writes
trained as zeros. Every damaged file is "vouched for" (the manifest re-hashed),
so the file's own check must catch it, not the manifest's.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.config.loading import load_config
from unimas.output import checkpoints

PPO = str(EXAMPLES / "quickstart_ppo.yaml")
CENTRAL = str(EXAMPLES / "quickstart_central_critic.yaml")
QUICKSTART = str(EXAMPLES / "quickstart.yaml")
CRITIC_RUN = ["trainer.steps=4", "trainer.save_every=2", "trainer.tasks_per_step=2", "trainer.eval_every=0",
              "algorithm.group_size=2", "algorithm.critic_warmup=1", "trainer.stop_at_accuracy=null",
              "logging.report=false", "logging.console=false"]


def sets(settings: list[str], *extra: str) -> list[str]:
    return sum((["--set", item] for item in (*settings, *extra)), [])


def cli(capsys, *argv: str | Path) -> tuple[int, str]:
    """Exit code and everything printed; a traceback is never an answer."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert "Traceback" not in output, output
    return code, output


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


def vouch(config: str, settings: list[str], directory: Path, step: int) -> None:
    """Re-hash the manifest so it matches the damaged files."""
    checkpoints.write_manifest(directory, step, load_config(config, settings))


def metric_steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# -- 7. non-finite weights in a checkpoint are damage ------------------------------------------------------------

@pytest.fixture(scope="module")
def critic_runs(tmp_path_factory) -> dict[str, Path]:
    """A per-group critic run and a centralized critic run, checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("critics")
    runs = {"ppo": root / "ppo", "central": root / "central"}
    for name, config in (("ppo", PPO), ("central", CENTRAL)):
        assert main(["train", config, "--run-dir", str(runs[name]), *sets(CRITIC_RUN)]) == 0
    return runs


def poison_safetensors(path: Path, value: float) -> None:
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = value
    save_file(tensors, path)


def poison_optimizer(path: Path, value: float) -> None:
    state = torch.load(path, weights_only=True)
    first = state["state"][min(state["state"])]
    first["exp_avg_sq"] = first["exp_avg_sq"].clone()
    first["exp_avg_sq"].view(-1)[0] = value
    torch.save(state, path)


@pytest.mark.parametrize("kind, group, file, poison", [
    ("ppo", "shared", "critic/value_head.safetensors", lambda p: poison_safetensors(p, math.nan)),
    ("ppo", "shared", "critic/value_head.safetensors", lambda p: poison_safetensors(p, math.inf)),
    ("ppo", "shared", "critic/optimizer.pt", lambda p: poison_optimizer(p, math.nan)),
    ("ppo", "shared", "optimizer.pt", lambda p: poison_optimizer(p, -math.inf)),
    ("ppo", "shared", "critic/model/model.safetensors", lambda p: poison_safetensors(p, math.nan)),
    ("central", "central", "critic/value_head.safetensors", lambda p: poison_safetensors(p, math.nan)),
    ("central", "central", "critic/optimizer.pt", lambda p: poison_optimizer(p, math.inf)),
], ids=["head-nan", "head-inf", "critic-optimizer-nan", "policy-optimizer-inf", "critic-backbone-nan",
        "central-head-nan", "central-optimizer-inf"])
def test_non_finite_weights_in_a_checkpoint_send_it_to_damaged(critic_runs, tmp_path, capsys, kind, group, file,
                                                               poison):
    """A NaN value head resumed and logged ``critic/value_mean=nan`` from the next step: now it is damage."""
    config = PPO if kind == "ppo" else CENTRAL
    run = tmp_path / "run"
    shutil.copytree(critic_runs[kind], run)
    damaged = ckpt(run, 4) / group / file
    poison(damaged)
    vouch(config, CRITIC_RUN, ckpt(run, 4), 4)
    code, output = cli(capsys, "train", config, "--run-dir", run, "--resume", *sets(CRITIC_RUN))
    assert code == 0, output
    assert f"skipping checkpoint step_000004: {damaged}" in output and "NaN or infinite" in output, output
    assert "(step 2)" in output
    assert (run / "checkpoints" / "damaged-step_000004" / group / file).is_file()
    for record in metric_steps(run):
        assert all(not isinstance(v, float) or math.isfinite(v) for k, v in record.items() if "critic/" in k), record


def test_init_from_a_checkpoint_with_a_nan_value_head_is_refused_naming_the_file(critic_runs, tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(ckpt(critic_runs["ppo"], 4), source)
    head = source / "shared" / "critic" / "value_head.safetensors"
    poison_safetensors(head, math.nan)
    code, output = cli(capsys, "train", PPO, "--run-dir", tmp_path / "warm",
                       *sets(CRITIC_RUN, f"models.shared.options={{init_from: {source}}}"))
    assert code == 2 and str(head) in output and "NaN or infinite" in output, output


# -- 8. critic.path and central_critic in validate; critic.path on resume ---------------------------------------

@pytest.mark.parametrize("value, words", [
    ('""', "is empty"),
    ("..", "not a Hugging Face model directory"),
    ("../../nowhere", "does not exist"),
], ids=["empty", "parent-dir", "missing"])
def test_validate_refuses_a_critic_path_that_is_no_model_dir(capsys, value, words):
    code, output = cli(capsys, "validate", PPO, "--set", f"models.shared.critic.path={value}")
    assert code == 2 and "models.shared.critic.path" in output and words in output, output


def test_a_central_critic_naming_a_policy_group_names_the_field(capsys):
    code, output = cli(capsys, "validate", CENTRAL, "--set", "algorithm.central_critic=speaker_model")
    assert code == 2 and "algorithm.central_critic" in output and "role speaker" in output, output


def test_a_critic_path_added_on_resume_is_refused_naming_both_values(critic_runs, tmp_path, capsys):
    """The critic has trained from the group's backbone; another backbone mid-run is a different critic."""
    run = tmp_path / "run"
    shutil.copytree(critic_runs["ppo"], run)
    other = ckpt(run, 2) / "shared" / "critic" / "model"  # a model dir that exists: the refusal is about the change
    before = (run / "metrics.jsonl").read_text()
    code, output = cli(capsys, "train", PPO, "--run-dir", run, "--resume",
                       *sets(CRITIC_RUN, f"models.shared.critic.path={other}"))
    assert code == 2 and "models.shared.critic.path null -> " in output, output
    assert "cannot resume with a changed setting" in output
    assert (run / "metrics.jsonl").read_text() == before and ckpt(run, 4).is_dir()


# -- 10. pending rollouts, replay state, credit channels ----------------------------------------------------------

PIPELINED = ["trainer.steps=5", "trainer.save_every=2", "trainer.tasks_per_step=2", "algorithm.group_size=2",
             "trainer.eval_every=0", "trainer.stop_at_accuracy=null", "algorithm.max_staleness=1",
             "logging.report=false", "logging.console=false",
             "algorithm.replay={name: verified_successes, params: {revisit: 0.5, threshold: 0.0}}"]


@pytest.fixture(scope="module")
def pipelined_run(tmp_path_factory) -> Path:
    """A run with one step of pending rollouts and a replay buffer in its newest checkpoint (step 4)."""
    run = tmp_path_factory.mktemp("pipelined") / "run"
    assert main(["train", QUICKSTART, "--run-dir", str(run), *sets(PIPELINED)]) == 0
    shutil.rmtree(ckpt(run, 5))
    return run


@pytest.fixture
def pipelined(pipelined_run, tmp_path) -> Path:
    shutil.copytree(pipelined_run, tmp_path / "run")
    return tmp_path / "run"


def edit_lines(path: Path, change) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        change(record)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def resume(capsys, run: Path, *extra: str) -> tuple[int, str]:
    return cli(capsys, "train", QUICKSTART, "--run-dir", run, "--resume", *sets(PIPELINED, *extra))


def test_pending_rollouts_of_a_step_the_checkpoint_cannot_hold_are_damage(pipelined, capsys):
    """Step 4's checkpoint holds rollouts of step 5 (its next); rollouts of step 10 come from elsewhere."""
    pending = ckpt(pipelined, 4) / "pending_rollouts.jsonl"
    edit_lines(pending, lambda r: r.update(step=9))
    vouch(QUICKSTART, PIPELINED, ckpt(pipelined, 4), 4)
    code, output = resume(capsys, pipelined)
    assert code == 0 and f"skipping checkpoint step_000004: {pending}" in output, output
    assert "step 10" in output and "(step 2)" in output


def test_pending_rollouts_the_run_will_not_train_are_announced(pipelined, capsys):
    code, output = resume(capsys, pipelined, "trainer.steps=4")
    assert code == 0, output
    assert "pending_rollouts.jsonl" in output and "not trained" in output and "step(s) 5" in output, output


@pytest.mark.parametrize("change", [lambda d: d.pop("buffer"), lambda d: d.update(buffer=None)],
                         ids=["buffer-missing", "buffer-null"])
def test_a_replay_state_without_its_buffer_is_damage(pipelined, capsys, change):
    path = ckpt(pipelined, 4) / "replay_state.json"
    data = json.loads(path.read_text())
    assert data["buffer"] is not None  # the fixture's buffer keeps state: losing it must not pass as empty
    change(data)
    path.write_text(json.dumps(data))
    vouch(QUICKSTART, PIPELINED, ckpt(pipelined, 4), 4)
    code, output = resume(capsys, pipelined)
    assert code == 0 and f"skipping checkpoint step_000004: {path}" in output, output
    assert "buffer" in output and "(step 2)" in output


def test_a_checkpoint_without_replay_state_says_the_buffer_starts_empty(pipelined, capsys):
    for step in (2, 4):
        (ckpt(pipelined, step) / "replay_state.json").unlink()
        vouch(QUICKSTART, PIPELINED, ckpt(pipelined, step), step)
    code, output = resume(capsys, pipelined)
    assert code == 0 and "(step 4)" in output, output
    assert "replay_state.json" in output and "starts empty" in output


@pytest.mark.parametrize("channels, missing", [
    ("[exact_match, speed]", "'speed'"),
    ("[exact_match#0]", "'exact_match#0'"),
])
def test_gdpo_with_a_channel_no_reward_writes_is_refused_naming_it(capsys, channels, missing):
    code, output = cli(capsys, "validate", QUICKSTART, "--set", "algorithm.estimator=passthrough",
                       "--set", f"algorithm.credit={{name: gdpo, params: {{channels: {channels}}}}}")
    assert code == 2 and "algorithm.credit.params.channels" in output and missing in output, output
    assert "exact_match" in output  # the channels there are


def test_gdpo_with_the_rewards_channels_validates(capsys):
    code, output = cli(capsys, "validate", QUICKSTART, "--set", "algorithm.estimator=passthrough",
                       "--set", "algorithm.credit={name: gdpo, params: {channels: [exact_match]}}")
    assert code == 0, output


# -- 9. an integer past int()'s digit limit in a config --------------------------------------------------------------

def test_a_config_integer_of_5000_digits_names_its_key_and_line(tmp_path, capsys):
    """YAML's int() raised a bare ValueError (a traceback) past Python's 4,300-digit limit."""
    text = Path(QUICKSTART).read_text().replace("seed: 0", "seed: " + "9" * 5000, 1)
    config = tmp_path / "config.yaml"
    config.write_text(text)
    code, output = cli(capsys, "validate", config)
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "9" * 5000 in row)
    assert code == 2 and "seed: an integer of 5000 digits" in output and f"line {line}," in output, output
