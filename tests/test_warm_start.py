"""``unimas warmstart`` (issue 45 item 3): pairs rendered exactly as each role's turn renders them, a checkpoint
``init_from`` takes, and the pair file read as hostile input (exit 2 naming the file and line)."""

from __future__ import annotations

import json

import pytest

from unimas.cli import main

CODE = dict(zip("abcdefgh", "01234567"))
"""The protocol the warm start teaches the quickstart's roles: the speaker writes a target's digit, the listener
reads it back; a team that follows it is always right."""


def _write(path, lines) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def _pairs() -> list[dict]:
    return ([{"role": "speaker", "vars": {"target": t}, "answer": d} for t, d in CODE.items()]
            + [{"role": "listener", "vars": {"message": d}, "answer": t} for t, d in CODE.items()])


def test_warm_start_writes_a_checkpoint_that_plays_as_fitted(repo, tmp_path, capsys):
    config = str(repo / "examples" / "quickstart.yaml")
    data = _write(tmp_path / "pairs.jsonl", _pairs())
    out = tmp_path / "warm"
    code = main(["warmstart", config, "--data", data, "--eval", data, "--out", str(out), "--steps", "400",
                 "--batch-size", "16", "--lr", "0.01", "--eval-every", "25", "--target", "1.0"])
    assert code == 0, capsys.readouterr().err
    assert "greedy accuracy 1.000" in capsys.readouterr().out
    assert (out / "shared" / "model" / "config.json").is_file()
    # the fitted prompts are the prompts a run's turns see: the team, started from the checkpoint, plays the code
    run = tmp_path / "run"
    code = main(["train", config, "--run-dir", str(run), "--set", f"models.shared.options={{init_from: {out / 'shared'}}}",
                 "--set", "trainer.steps=0", "--set", "logging.report=false"])
    assert code == 0, capsys.readouterr().err
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["eval/accuracy"] == pytest.approx(1.0)
    episode = json.loads((run / "trajectories" / "eval.jsonl").read_text().splitlines()[0])
    speaker = next(n for n in episode["nodes"] if n.get("role") == "speaker")
    assert speaker["text"] == CODE[episode["task"]["target"]]


@pytest.mark.parametrize("line, says", [
    ("{not json", "not JSON"),
    ('["speaker", "a", "0"]', "JSON object"),
    ('{"role": "judge", "vars": {}, "answer": "x"}', "'judge' is not a role"),
    ('{"role": "speaker", "vars": {}, "answer": "0"}', "needs {target}"),
    ('{"role": "speaker", "vars": {"target": "a"}, "answer": ""}', "non-empty string"),
    ('{"role": "speaker", "vars": {"target": ["a"]}, "answer": "0"}', "string or a number"),
    ('{"role": "speaker", "vars": {"target": "a"}, "answer": "0", "extra": 1}', "unknown key 'extra'"),
    ('{"role": "speaker", "vars": [1], "answer": "0"}', "object of template variables"),
])
def test_a_bad_line_exits_2_naming_the_file_and_line(repo, tmp_path, capsys, line, says):
    data = _write(tmp_path / "pairs.jsonl", [_pairs()[0], "", line])
    code = main(["warmstart", str(repo / "examples" / "quickstart.yaml"), "--data", data, "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{data}:3" in err and says in err
    assert not (tmp_path / "out").exists()  # refused before any model loads or anything is written


def test_a_frozen_role_or_a_missing_file_exits_2(repo, tmp_path, capsys):
    config = str(repo / "examples" / "quickstart.yaml")
    data = _write(tmp_path / "pairs.jsonl", _pairs())
    assert main(["warmstart", config, "--data", data, "--out", str(tmp_path / "o"),
                 "--set", "roles.listener.trainable=false"]) == 2
    assert "not trainable" in capsys.readouterr().err
    assert main(["warmstart", config, "--data", str(tmp_path / "absent.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "absent.jsonl" in capsys.readouterr().err
    assert main(["warmstart", config, "--data", _write(tmp_path / "empty.jsonl", [""]), "--out",
                 str(tmp_path / "o")]) == 2
    assert "no pairs" in capsys.readouterr().err


def test_a_chat_roles_pairs_are_rendered_through_its_chat_template(repo, chat_model, tmp_path):
    """On a chat model the fitted prompt is the role's turn as the model sees it: system message and chat markers
    around the template, tokenising back to the very ids a turn samples after."""
    from unimas.config.loading import config_from_dict, load_config
    from unimas.contract.registry import build_registry
    from unimas.controller.conversation import conversation
    from unimas.groups.base import GenRequest
    from unimas.runtime.build import build_group
    from unimas.training.warm_start import read_pairs, rendered_examples, warm_start

    tree = load_config(repo / "examples" / "math_team_cpu.yaml").model_dump(mode="json", by_alias=True)
    tree["models"]["team"]["options"] = {"path": str(chat_model)}
    tree["roles"]["solver"]["system"] = "You add."
    config = config_from_dict(tree, "math_team_cpu.yaml")
    data = _write(tmp_path / "pairs.jsonl", [{"role": "solver", "vars": {"question": "2 + 3"}, "answer": "5"},
                                              {"role": "verifier", "vars": {"question": "2 + 3", "proposal": 6},
                                               "answer": "wrong"}])
    pairs = read_pairs(data, config)
    group = build_group(config, build_registry(config.plugins), "team")
    try:
        solver, verifier = rendered_examples(group, config, pairs)
        role = config.roles["solver"]
        messages, _, _ = conversation("solver", role, "solve: 2 + 3", ())
        request = GenRequest(prompt="", generation=role.generation, messages=messages)
        sampled = group.policy.render_prompts([request], 4)[0]
        assert group.policy.fit_prompts([solver.prompt], 4)[0] == sampled.ids  # the ids RL samples after
        assert "You add." in solver.prompt and "solve: 2 + 3" in solver.prompt and solver.prompt != "solve: 2 + 3"
        assert "check: 2 + 3 = 6" in verifier.prompt and solver.response == "5"
    finally:
        group.close()
    result = warm_start(config, pairs, tmp_path / "out", steps=2, batch_size=2, log=lambda line: None)
    assert (result.checkpoints["team"] / "model" / "config.json").is_file() and result.steps["team"] == 2
