"""Broken user input of every kind: exit code 2 (0 where only a warning is due), one message naming the
cause and where it is (field path, function, file:line), and no traceback unless ``--debug`` asks for it."""

import importlib.metadata
import itertools
import json
import pickle
import shutil
import textwrap

import pytest
import torch
import yaml

from tests.conftest import EXAMPLES
from unimas.cli import main
from unimas.config.loading import load_config
from unimas.output import checkpoints

QUICKSTART = EXAMPLES / "quickstart.yaml"
FAST = ["--set", "trainer.steps=1", "--set", "trainer.eval_size=4", "--set", "trainer.tasks_per_step=2"]
_unique = itertools.count()


def write_config(tmp_path, mutate=None, plugins=(), base=QUICKSTART):
    """The quickstart config (or ``base``), changed by ``mutate`` and loading ``plugins``, written to tmp_path."""
    tree = yaml.safe_load(base.read_text())
    if plugins:
        tree["plugins"] = list(plugins)
    if mutate is not None:
        mutate(tree)
    path = tmp_path / f"config{next(_unique)}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def write_plugin(tmp_path, monkeypatch, source):
    """A plugin module in tmp_path, importable under a name no other test uses; returns (name, file)."""
    name = f"broken_plugin_{next(_unique)}"
    path = tmp_path / f"{name}.py"
    path.write_text("import unimas\n" + textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, path


def line_of(path, text):
    """1-based line number of the first line of ``path`` containing ``text``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err
    for needle in needles:
        assert str(needle) in err, f"{needle!r} not in: {err}"


# -- plugin hooks ------------------------------------------------------------------------------------

def test_misspelt_hook_name_suggests_the_real_one(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, """
        @unimas.hookimpl
        def unimas_workflow():
            return {}
    """)
    code, _, err = run(capsys, "validate", write_config(tmp_path, plugins=[name]))
    assert_user_error(code, err, "'unimas_workflow'", "did you mean 'unimas_workflows'",
                      f"{path}:{line_of(path, '@unimas.hookimpl')}")  # a decorated function starts at its decorator


def test_hookimpl_with_a_name_pluggy_does_not_know(tmp_path, monkeypatch, capsys):
    """A marked function whose name does not start with ``unimas_`` reaches pluggy's ``check_pending``."""
    name, path = write_plugin(tmp_path, monkeypatch, """
        @unimas.hookimpl
        def workflows():
            return {}
    """)
    code, _, err = run(capsys, "validate", write_config(tmp_path, plugins=[name]))
    assert_user_error(code, err, f"'workflows' of plugin {name}", "matches no unimas hook",
                      "did you mean 'unimas_workflows'", f"{path}:{line_of(path, '@unimas.hookimpl')}")


def test_hook_function_without_hookimpl(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, """
        async def echo(ctx, task):
            return {}

        def unimas_workflows():
            return {"echo": echo}
    """)
    code, _, err = run(capsys, "validate", write_config(tmp_path, plugins=[name]))
    assert_user_error(code, err, "'unimas_workflows'", "@unimas.hookimpl",
                      f"{path}:{line_of(path, 'def unimas_workflows')}")


def test_hook_returning_a_list(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, """
        def my_reward(trajectory, task):
            return 1.0

        @unimas.hookimpl
        def unimas_rewards():
            return [my_reward]
    """)
    code, _, err = run(capsys, "validate", write_config(tmp_path, plugins=[name]))
    assert_user_error(code, err, "unimas_rewards", "returned a list", "must return a dict",
                      f"{path}:{line_of(path, '@unimas.hookimpl')}")


def test_hook_that_raises(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, """
        @unimas.hookimpl
        def unimas_tools():
            return {"calc": undefined_name}
    """)
    code, _, err = run(capsys, "validate", write_config(tmp_path, plugins=[name]))
    assert_user_error(code, err, "unimas_tools", "NameError", f"{path}:{line_of(path, 'undefined_name')}")


def test_listed_plugin_module_that_does_not_import(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, """
        import no_such_module_for_unimas_tests
    """)
    code, _, err = run(capsys, "validate", write_config(tmp_path, plugins=[name]))
    assert_user_error(code, err, "plugins", f"cannot import plugin module '{name}'", "ModuleNotFoundError",
                      f"{path}:{line_of(path, 'no_such_module')}")


def test_plain_def_workflow(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, """
        def sync_flow(ctx, task):
            return {"answer": "a"}

        @unimas.hookimpl
        def unimas_workflows():
            return {"sync_flow": sync_flow}
    """)
    config = write_config(tmp_path, lambda t: t.update(workflow={"name": "sync_flow"}), plugins=[name])
    code, _, err = run(capsys, "validate", config)
    assert_user_error(code, err, "workflow.name", "'sync_flow'", "plain function", "async def",
                      f"{path}:{line_of(path, 'def sync_flow')}")


# -- config fields -----------------------------------------------------------------------------------

def test_invalid_parser_regex_names_the_field(tmp_path, capsys):
    config = write_config(tmp_path, lambda t: t["roles"]["listener"].update(parser="([a-h]"))
    code, _, err = run(capsys, "validate", config)
    assert_user_error(code, err, "roles.listener.parser", "invalid regular expression", "missing )")
    assert "error: error:" not in err


def test_lora_role_without_adapter(tmp_path, capsys):
    config = write_config(tmp_path, lambda t: t["roles"]["listener"].pop("adapter"),
                          base=EXAMPLES / "quickstart_lora.yaml")
    code, _, err = run(capsys, "validate", config)
    assert_user_error(code, err, "roles.listener.adapter", "would train nothing", "adapter: listener",
                      "trainable: false", "lora.train_base")


def test_lora_role_without_adapter_as_an_explicit_frozen_choice(tmp_path, capsys):
    """``trainable: false`` is the explicit choice to act with the frozen base: accepted, and printed."""
    def frozen(tree):
        tree["roles"]["listener"].pop("adapter")
        tree["roles"]["listener"]["trainable"] = False
    code, out, err = run(capsys, "validate", write_config(tmp_path, frozen, base=EXAMPLES / "quickstart_lora.yaml"))
    assert code == 0, err
    assert "listener -> base (frozen," in out


# -- rewards that return names the run does not have --------------------------------------------------

REWARD_PLUGIN = """
    def ghost_roles(trajectory, task):
        return {"speaker": 1.0, "ghost": 1.0}

    def ghost_nodes(trajectory, task):
        return {"no-such-node": 1.0}

    def fails_every_other(trajectory, task, _calls=[0]):
        _calls[0] += 1
        if _calls[0] % 2:
            raise ValueError("reward broke")
        return 1.0

    def always_fails(trajectory, task):
        return trajectory.outcome["missing_key"]

    @unimas.hookimpl
    def unimas_rewards():
        return {"ghost_roles": ghost_roles, "ghost_nodes": ghost_nodes,
                "fails_every_other": fails_every_other, "always_fails": always_fails}
"""


def _with_reward(tree, name, level):
    tree["rewards"].append({"name": name, "level": level, "weight": 1.0})


def test_role_reward_naming_an_unknown_role(tmp_path, monkeypatch, capsys):
    name, _ = write_plugin(tmp_path, monkeypatch, REWARD_PLUGIN)
    config = write_config(tmp_path, lambda t: _with_reward(t, "ghost_roles", "role"), plugins=[name])
    code, _, err = run(capsys, "validate", config, "--episodes", 8)
    assert_user_error(code, err, "rewards.ghost_roles", "'ghost'", "not roles", "listener, speaker")


def test_turn_reward_naming_an_unknown_node(tmp_path, monkeypatch, capsys):
    name, _ = write_plugin(tmp_path, monkeypatch, REWARD_PLUGIN)
    config = write_config(tmp_path, lambda t: _with_reward(t, "ghost_nodes", "turn"), plugins=[name])
    code, _, err = run(capsys, "train", config, "--run-dir", tmp_path / "run", *FAST)
    assert_user_error(code, err, "rewards.ghost_nodes", "'no-such-node'", "turn node ids")


# -- exceptions in user workflows and rewards ---------------------------------------------------------

WORKFLOW_PLUGIN = """
    async def crashing(ctx, task):
        message = await ctx.act("speaker")
        return {"answer": message.text[99]}

    async def flaky(ctx, task, _calls=[0]):
        _calls[0] += 1
        odd = _calls[0] % 2  # read before the await: the episodes run concurrently
        message = await ctx.act("speaker")
        if odd:
            raise RuntimeError("flaky workflow")
        guess = await ctx.act("listener", message=message)
        return {"answer": guess.parsed}

    @unimas.hookimpl
    def unimas_workflows():
        return {"crashing": crashing, "flaky": flaky}
"""


def test_workflow_raising_in_every_eval_episode_stops_training(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, WORKFLOW_PLUGIN)
    config = write_config(tmp_path, lambda t: t.update(workflow={"name": "crashing"}), plugins=[name])
    code, _, err = run(capsys, "train", config, "--run-dir", tmp_path / "run", *FAST)
    assert_user_error(code, err, "step 0 evaluation", "every one of the 4 evaluation episodes failed",
                      "IndexError", f"{path}:{line_of(path, 'message.text[99]')}", "--debug")


def test_debug_shows_the_traceback_and_keeps_exit_2(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, WORKFLOW_PLUGIN)
    config = write_config(tmp_path, lambda t: t.update(workflow={"name": "crashing"}), plugins=[name])
    code, _, err = run(capsys, "--debug", "train", config, "--run-dir", tmp_path / "run", *FAST)
    assert code == 2
    assert "Traceback" in err
    assert f'File "{path}", line {line_of(path, "message.text[99]")}' in err  # the user's frame, not only ours
    assert "error: step 0 evaluation" in err


def test_reward_raising_in_every_eval_episode_stops_training(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, REWARD_PLUGIN)
    config = write_config(tmp_path, lambda t: t.update(rewards=[{"name": "always_fails", "level": "trajectory"}]),
                          plugins=[name])
    code, _, err = run(capsys, "train", config, "--run-dir", tmp_path / "run", *FAST)
    assert_user_error(code, err, "step 0 evaluation", "reward 'always_fails'", "KeyError",
                      f"{path}:{line_of(path, 'missing_key')}")


def test_eval_command_is_strict_too(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, WORKFLOW_PLUGIN)
    config = write_config(tmp_path, lambda t: t.update(workflow={"name": "crashing"}), plugins=[name])
    code, _, err = run(capsys, "eval", config, "--run-dir", tmp_path / "eval", "--set", "trainer.eval_size=4")
    assert_user_error(code, err, "evaluation episodes failed", f"{path}:{line_of(path, 'message.text[99]')}")


def test_dry_run_where_every_episode_fails(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, WORKFLOW_PLUGIN)
    config = write_config(tmp_path, lambda t: t.update(workflow={"name": "crashing"}), plugins=[name])
    code, _, err = run(capsys, "validate", config, "--episodes", 8)
    assert_user_error(code, err, "validate --episodes", "every one of the 8 dry-run episodes failed",
                      f"{path}:{line_of(path, 'message.text[99]')}")


def test_dry_run_where_some_episodes_fail_reports_them(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, WORKFLOW_PLUGIN)
    config = write_config(tmp_path, lambda t: t.update(workflow={"name": "flaky"}), plugins=[name])
    code, out, err = run(capsys, "validate", config, "--episodes", 8)
    assert code == 0, err
    assert "failed x4: RuntimeError: flaky workflow" in out
    assert f"{path}:{line_of(path, 'flaky workflow')}" in out


def test_dry_run_where_a_reward_fails_in_some_episodes(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, REWARD_PLUGIN)
    config = write_config(tmp_path, lambda t: _with_reward(t, "fails_every_other", "trajectory"), plugins=[name])
    code, out, err = run(capsys, "validate", config, "--episodes", 8)
    assert code == 0, err
    assert "failed x4: reward 'fails_every_other' (rewards.fails_every_other): ValueError: reward broke" in out
    assert f"{path}:{line_of(path, 'reward broke')}" in out


def test_dry_run_reports_roles_rewards_and_levels(tmp_path, monkeypatch, capsys):
    name, _ = write_plugin(tmp_path, monkeypatch, REWARD_PLUGIN.replace('"ghost": 1.0', '"listener": 0.5'))
    config = write_config(tmp_path, lambda t: _with_reward(t, "ghost_roles", "role"), plugins=[name])
    code, out, err = run(capsys, "validate", config, "--episodes", 8)
    assert code == 0, err
    assert "dry run: 8 episodes with stand-in models" in out
    assert "role speaker: 8 turns" in out and "role listener: 8 turns" in out
    assert "reward exact_match (level trajectory, weight 1): mean" in out
    assert "reward ghost_roles (level role, weight 1): keys listener, speaker" in out
    assert "failed x" not in out


def test_dry_run_reports_tool_calls_and_parse_errors(tmp_path, monkeypatch, capsys):
    name, _ = write_plugin(tmp_path, monkeypatch, """
        async def with_tool(ctx, task):
            message = await ctx.act("speaker")
            await ctx.tool("calculator", expression="1+1")
            await ctx.tool("calculator", expression=message)  # random text: mostly an error
            guess = await ctx.act("listener", message=message)
            return {"answer": guess.parsed}

        @unimas.hookimpl
        def unimas_workflows():
            return {"with_tool": with_tool}
    """)
    def mutate(tree):
        tree["workflow"] = {"name": "with_tool"}
        tree["roles"]["listener"]["parser"] = "(Z)"  # never matches the stand-in's letters
    code, out, err = run(capsys, "validate", write_config(tmp_path, mutate, plugins=[name]), "--episodes", 8)
    assert code == 0, err
    assert "tool calculator: 16 calls, " in out
    assert "role listener: 8 turns, 8 parse errors" in out


def test_workflow_asking_for_an_undeclared_role(tmp_path, monkeypatch, capsys):
    name, _ = write_plugin(tmp_path, monkeypatch, """
        async def wrong_role(ctx, task):
            return {"answer": (await ctx.act("critic")).parsed}

        @unimas.hookimpl
        def unimas_workflows():
            return {"wrong_role": wrong_role}
    """)
    config = write_config(tmp_path, lambda t: t.update(workflow={"name": "wrong_role"}), plugins=[name])
    code, _, err = run(capsys, "validate", config, "--episodes", 8)
    assert_user_error(code, err, "roles", "'critic'", "does not declare")


def test_trajectory_reward_returning_a_dict(tmp_path, monkeypatch, capsys):
    name, _ = write_plugin(tmp_path, monkeypatch, REWARD_PLUGIN)
    config = write_config(tmp_path, lambda t: _with_reward(t, "ghost_roles", "trajectory"), plugins=[name])
    code, _, err = run(capsys, "train", config, "--run-dir", tmp_path / "run", *FAST)
    assert_user_error(code, err, "rewards.ghost_roles", "returned dict", "level 'trajectory'", "must return a number")


# -- a broken installed plugin ------------------------------------------------------------------------

@pytest.fixture
def broken_entry_point(monkeypatch):
    """An installed ``unimas`` entry point whose module does not import."""
    original = importlib.metadata.entry_points
    fake = importlib.metadata.EntryPoint(name="broken_one", value="nonexistent_mod_xyz", group="unimas")

    def entry_points(**selection):
        found = original(**selection)
        return [*found, fake] if selection.get("group") == "unimas" else found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    return fake


def test_broken_installed_plugin_is_only_a_warning(broken_entry_point, capsys):
    code, out, err = run(capsys, "validate", QUICKSTART)
    assert code == 0, err
    assert "ok:" in out
    assert "warning: plugin 'broken_one' (nonexistent_mod_xyz)" in err and "ModuleNotFoundError" in err
    assert "Traceback" not in err


def test_broken_installed_plugin_is_named_when_its_names_are_asked_for(broken_entry_point, tmp_path, capsys):
    config = write_config(tmp_path, lambda t: t.update(workflow={"name": "from_the_broken_plugin"}))
    code, _, err = run(capsys, "validate", config)
    assert_user_error(code, err, "workflow.name", "'from_the_broken_plugin'", "failed to import",
                      "'broken_one' (nonexistent_mod_xyz)")


def test_plugins_command_lists_the_broken_plugin(broken_entry_point, capsys):
    code, out, err = run(capsys, "plugins")
    assert code == 0, err
    assert "broken: 'broken_one' (nonexistent_mod_xyz)" in out
    assert "signalling" in out


# -- a checkpoint's files: payloads and bad state never load; a bad checkpoint falls back --------------------------
# One tiny run holds every kind of state file: a LoRA group (speaker), a full one (listener), a snapshot pool of it
# (rival), a replay buffer and one step of pipelined rollouts. Checkpoints at steps 2 and 4 (step 5's is removed,
# so step 4 is the newest); each test damages a copy.

EVERYTHING = ["trainer.steps=5", "trainer.save_every=2", "trainer.tasks_per_step=2", "algorithm.group_size=2",
              "trainer.eval_size=2", "trainer.eval_every=0", "trainer.stop_at_accuracy=null",
              "algorithm.max_staleness=1", "logging.report=false", "logging.console=false",
              "algorithm.replay={name: verified_successes, params: {revisit: 0.5, threshold: 0.0}}"]


def _everything(tree):
    speaker, listener = tree["models"]["speaker_model"], tree["models"]["listener_model"]
    speaker["lora"] = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    tree["roles"]["speaker"]["adapter"] = "speaker"
    tree["models"]["rival"] = {"backend": "torch", "options": listener["options"], "trainable": False,
                               "snapshot": {"of": "listener_model", "every": 2, "pool": 2}}


def everything_args(config, *extra):
    return [str(config), *(part for item in (*EVERYTHING, *extra) for part in ("--set", item))]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """(config, run dir) of the run described above."""
    root = tmp_path_factory.mktemp("everything")
    config = write_config(root, _everything, base=EXAMPLES / "quickstart_separate.yaml")
    run_dir = root / "run"
    assert main(["train", *everything_args(config), "--run-dir", str(run_dir)]) == 0
    shutil.rmtree(run_dir / "checkpoints" / "step_000005")
    for name in ("pending_rollouts.jsonl", "replay_state.json", "snapshot_pools.json"):
        assert (run_dir / "checkpoints" / "step_000004" / name).is_file(), name
    return config, run_dir


@pytest.fixture
def saved(saved_run, tmp_path):
    config, base = saved_run
    shutil.copytree(base, tmp_path / "run")
    return config, tmp_path / "run"


class Payload:
    """Unpickling this would create ``path``: the file must never appear."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def newest(run_dir):
    return run_dir / "checkpoints" / "step_000004"


def vouch_for(config, run_dir):
    """Re-write the newest checkpoint's manifest to match what the test changed in it."""
    checkpoints.write_manifest(newest(run_dir), 4, load_config(str(config), EVERYTHING))


def resume(config, run_dir, capsys):
    code, out, err = run(capsys, "train", *everything_args(config), "--run-dir", run_dir, "--resume")
    assert "Traceback" not in out + err
    return code, out + err


def pickled(marker):
    return pickle.dumps(Payload(marker), protocol=2)


def _snapshot_weights(run_dir):
    return run_dir / "snapshots" / "rival" / "step_000004" / "model" / "model.safetensors"


CHECKPOINT_FILES = {  # kind -> (the file holding the payload, how it is planted)
    "lora adapter": (lambda r: newest(r) / "speaker_model/adapters/speaker/adapter_model.safetensors",
                     lambda path, marker: path.write_bytes(pickled(marker))),
    "replay state": (lambda r: newest(r) / "replay_state.json", lambda path, marker: path.write_bytes(pickled(marker))),
    "pending rollouts": (lambda r: newest(r) / "pending_rollouts.jsonl",
                         lambda path, marker: path.write_bytes(path.read_bytes() + pickled(marker))),
    "snapshot weights": (_snapshot_weights, lambda path, marker: path.write_bytes(pickled(marker))),
    "snapshot bin": (lambda r: _snapshot_weights(r).with_name("pytorch_model.bin"),
                     lambda path, marker: torch.save({"weight": Payload(marker)}, path)),
}


@pytest.mark.slow
@pytest.mark.parametrize("vouched", [False, True], ids=["unlisted", "vouched"])
@pytest.mark.parametrize("kind", sorted(CHECKPOINT_FILES))
def test_a_pickle_payload_in_a_checkpoint_file_never_runs_on_resume(saved, capsys, tmp_path, kind, vouched):
    config, run_dir = saved
    marker = tmp_path / "unpickled"
    where, plant = CHECKPOINT_FILES[kind]
    plant(where(run_dir), marker)
    if vouched:
        vouch_for(config, run_dir)
    code, output = resume(config, run_dir, capsys)
    assert code == 0 and not marker.exists()
    assert f"skipping checkpoint step_000004: {where(run_dir)}" in output, output
    assert "(step 2)" in output


@pytest.mark.parametrize("vouched", [False, True], ids=["unlisted", "vouched"])
@pytest.mark.parametrize("kind", ["lora adapter", "pending rollouts", "replay state"])  # eval plays no snapshot pool
def test_a_pickle_payload_in_a_checkpoint_file_never_runs_on_eval(saved, capsys, tmp_path, kind, vouched):
    config, run_dir = saved
    marker = tmp_path / "unpickled"
    where, plant = CHECKPOINT_FILES[kind]
    plant(where(run_dir), marker)
    if vouched:
        vouch_for(config, run_dir)
    code, _, err = run(capsys, "eval", *everything_args(config), "--checkpoint", newest(run_dir),
                       "--run-dir", tmp_path / "eval")
    assert_user_error(code, err, where(run_dir))
    assert not marker.exists()


@pytest.mark.parametrize("vouched", [False, True], ids=["unlisted", "vouched"])
def test_a_pickle_payload_in_an_adapter_never_runs_on_serve(saved, capsys, monkeypatch, tmp_path, vouched):
    import uvicorn

    config, run_dir = saved
    marker, started = tmp_path / "unpickled", []
    adapter = newest(run_dir) / "speaker_model/adapters/speaker/adapter_model.safetensors"
    adapter.write_bytes(pickled(marker))
    if vouched:
        vouch_for(config, run_dir)

    async def no_server(self, *args, **kwargs):
        started.append(self.config.port)

    monkeypatch.setattr(uvicorn.Server, "serve", no_server)
    code, _, err = run(capsys, "serve", *everything_args(config), "--checkpoint", newest(run_dir))
    assert_user_error(code, err, adapter)
    assert not marker.exists() and not started


def _pending(path, change):
    """Apply ``change`` to the first record of a pending-rollouts file."""
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    change(record)
    path.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")


def _rename_role(record):
    for node in record["episode"]["nodes"]:
        if node.get("role") == "listener":
            node["role"] = "ghost"


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("name", "damage", "cause"), [
    ("pending_rollouts.jsonl", lambda p: _pending(p, lambda r: r.update(step=3)),
     ":1: a rollout of step 4, which the checkpoint of step 4 already trained"),
    ("pending_rollouts.jsonl", lambda p: _pending(p, lambda r: r.update(step="4")), "step: Input should be"),
    ("pending_rollouts.jsonl", lambda p: _pending(p, _rename_role), "role(s) ghost, which this run does not have"),
    ("pending_rollouts.jsonl", lambda p: p.write_text(p.read_text()[:-40]), "JSONDecodeError"),
    ("pending_rollouts.jsonl", lambda p: _pending(p, lambda r: r["episode"].pop("task_id")), "KeyError"),
    ("replay_state.json", lambda p: _edit(p, lambda d: d.update(previous_step=9)),
     "previous_step 9: the checkpoint collected episodes up to step 4 only"),
    ("replay_state.json", lambda p: _edit(p, lambda d: d.update(buffer={"not": "a list"})),
     "does not match the expected contents"),
    ("replay_state.json", lambda p: _edit(p, lambda d: d.pop("previous")), "previous: Field required"),
    ("snapshot_pools.json", lambda p: _edit(p, lambda d: d.update(step=2)), "records step 2"),
    ("snapshot_pools.json", lambda p: _edit(p, lambda d: d.update(groups={"ghost": d["groups"]["rival"]})),
     "records pools of ghost, but this run's snapshot groups are rival"),
    ("snapshot_pools.json", lambda p: _edit(p, lambda d: d["groups"]["rival"].update(playing=8)),
     "taken after step 4"),
    ("snapshot_pools.json", lambda p: p.write_text("{\"step\": 4"), "JSONDecodeError"),
])
@pytest.mark.slow
def test_a_bad_state_file_makes_its_checkpoint_fall_back(saved, capsys, name, damage, cause):
    config, run_dir = saved
    damage(newest(run_dir) / name)
    vouch_for(config, run_dir)  # the manifest matches: the file's own schema check must catch it
    code, output = resume(config, run_dir, capsys)
    assert code == 0 and f"skipping checkpoint step_000004: {newest(run_dir) / name}" in output, output
    assert cause in output and "(step 2)" in output
    assert (run_dir / "checkpoints" / "damaged-step_000004").is_dir()
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4, 5]  # steps 3 to 5 trained once more, none twice in the log


def test_a_snapshot_pool_linked_out_of_the_run_is_refused_and_left_alone(saved, capsys, tmp_path):
    config, run_dir = saved
    pool, outside = run_dir / "snapshots" / "rival", tmp_path / "elsewhere"
    shutil.move(pool, outside)
    pool.symlink_to(outside, target_is_directory=True)
    (outside / "step_000009").mkdir()  # newer than the checkpoint: a resume deletes such a snapshot in its pool
    before = sorted(p.relative_to(outside) for p in outside.rglob("*"))
    code, output = resume(config, run_dir, capsys)
    assert_user_error(code, output, pool, "outside the run directory")
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before
