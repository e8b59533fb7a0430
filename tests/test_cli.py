"""CLI contract: exit codes, messages that name the field, no tracebacks for user errors."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES, shared_chat_model
from unimas.cli import main


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_validates(config, capsys, chat_model, request, tmp_path_factory):
    """Chat examples point at a model directory the user builds or downloads: the test model stands in (with
    heads 32 wide where vLLM samples: its CPU attention takes no narrower)."""
    models = yaml.safe_load(config.read_text())["models"]

    def stand_in(options: dict) -> Path:
        if options.get("sampler") == "vllm":
            return shared_chat_model(request.config, tmp_path_factory, name="tiny-chat-h2", num_heads=2)
        return chat_model

    local = [f"models.{g}.options.path={stand_in(m['options'])}" for g, m in models.items()
             if str((m.get("options") or {}).get("path", "")).startswith("models/")]
    assert main(["validate", str(config), *[a for s in local for a in ("--set", s)]]) == 0
    out = capsys.readouterr().out
    assert "roles -> model groups" in out


def test_validate_summary_names_the_sharing_scheme(capsys):
    main(["validate", str(EXAMPLES / "quickstart_lora.yaml")])
    assert "LoRA adapter per role on one base (adapters listener, speaker)" in capsys.readouterr().out
    main(["validate", str(EXAMPLES / "quickstart.yaml")])
    assert "shared by 2 roles" in capsys.readouterr().out


def broken(tmp_path, mutate):
    tree = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    mutate(tree)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda t: t["roles"]["listener"].update(model="nowhere"), "roles.listener.model"),
        (lambda t: t["roles"]["listener"].update(adapter="x"), "roles.listener.adapter"),
        (lambda t: t["roles"]["speaker"].update(template="S:{target.__class__}"), "roles.speaker.template"),
        (lambda t: t.update(workflow={"name": "nope"}), "workflow.name"),
        (lambda t: t["rewards"][0].update(name="nope"), "rewards[0].name"),
        (lambda t: t["algorithm"].update(estimator="nope"), "algorithm.estimator"),
        (lambda t: t["algorithm"].update(group_size=1), "algorithm.group_size"),
        (lambda t: t["algorithm"].update(loss="nope"), "algorithm.loss"),
        (lambda t: t["trainer"].update(stepz=1), "trainer.stepz"),
    ],
)
def test_user_errors_exit_2_naming_the_field(tmp_path, capsys, mutate, expected):
    assert main(["validate", str(broken(tmp_path, mutate))]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "Traceback" not in err


def test_graph_errors_name_the_node(tmp_path, capsys):
    def graph(tree):
        tree["workflow"] = {"graph": {
            "start": "speak",
            "nodes": {"speak": {"kind": "llm", "role": "speaker"},
                      "listen": {"kind": "llm", "role": "listener", "inputs": {"message": "speak"}},
                      "orphan": {"kind": "llm", "role": "listener", "inputs": {"message": "speak"}}},
            "edges": [{"from": "speak", "to": "listen"}, {"from": "listen", "to": "ghost"}],
            "outcome": {"answer": "listen"},
        }}
    assert main(["validate", str(broken(tmp_path, graph))]) == 2
    err = capsys.readouterr().err
    assert "workflow.graph.edges[1].to" in err and "ghost" in err
    assert "orphan" in err


@pytest.mark.slow
def test_cli_process_exit_code_and_debug_traceback(tmp_path):
    path = broken(tmp_path, lambda t: t["roles"]["listener"].update(model="nowhere"))
    quiet = subprocess.run([sys.executable, "-m", "unimas.cli", "validate", str(path)], capture_output=True, text=True)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    loud = subprocess.run([sys.executable, "-m", "unimas.cli", "--debug", "validate", str(path)],
                          capture_output=True, text=True)
    assert "Traceback" in loud.stderr


def test_override_reaches_the_config(tmp_path, capsys):
    assert main(["validate", str(EXAMPLES / "quickstart.yaml"), "--set", "algorithm.group_size=1"]) == 2
    assert "algorithm.group_size" in capsys.readouterr().err


def test_training_into_an_existing_run_is_refused_and_loses_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    assert main(["train", str(EXAMPLES / "quickstart.yaml"), "--run-dir", str(run)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_too_many_failed_episodes_stop_the_run_with_one_line(tmp_path, capsys):
    (tmp_path / "broken_workflow.py").write_text(
        "import unimas\n\nasync def crash(ctx, task):\n"
        "    if ctx.trajectory.episode_id.startswith('s'):  # training episodes only\n"
        "        raise ValueError('bug in my workflow')\n    return {}\n\n"
        "@unimas.hookimpl\ndef unimas_workflows():\n    return {'crash': crash}\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        path = broken(tmp_path, lambda t: t.update(workflow={"name": "crash"}, plugins=["broken_workflow"]))
        assert main(["train", str(path), "--run-dir", str(tmp_path / "run"), "--set", "trainer.steps=1"]) == 1
    finally:
        sys.path.remove(str(tmp_path))
    err = capsys.readouterr().err
    assert "episodes failed" in err and "ValueError: bug in my workflow" in err and "Traceback" not in err


def test_plugins_verbose_lists_each_algorithm_parameter_with_type_and_default(capsys):
    assert main(["plugins", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "entropy_branch  (unimas; algorithm.rollout.params)" in out
    assert "    roots: int (> 0) = 4  -- episodes per task run from scratch" in out
    assert '    trigger: "entropy" | "mixed" = "entropy"' in out
    assert "    gamma: float (>= 0, <= 1) = 1.0" in out  # gagpo
    assert "    channels: list[str] (min length 1) (required)" in out  # gdpo's explicit model
    assert "    tau: float | null = null" in out  # m2po, a policy loss's keyword-only parameter
    assert "counterfactual  (unimas; algorithm.credit.params)\n    no parameters" in out
    assert main(["plugins"]) == 0
    assert "roots:" not in capsys.readouterr().out


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on(tmp_path):
    """`kill -USR1` on a CLI that seems stuck prints where each thread waits; the command still finishes."""
    program = tmp_path / "wait.py"
    program.write_text("import time\ntime.sleep(2)\nprint('done')\n")
    proc = subprocess.Popen([sys.executable, "-m", "unimas.cli", "sandbox", str(program), "--allow-fallback"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    usr1 = 1 << (signal.SIGUSR1 - 1)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:  # until the CLI catches SIGUSR1
            caught = next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                          if line.startswith("SigCgt:"))
            if int(caught.split()[1], 16) & usr1:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert '"status": "ok"' in out and "done" in out  # the sandboxed program ran to its end
    assert "Current thread" in err and "File " in err  # faulthandler's dump of the main thread
