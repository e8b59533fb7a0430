"""A catalogue of bad inputs (config files, data files, plugin modules), each found by an adversarial trial.

Every one must end in exit code 2 and one message naming the cause (file, field path or row), never a
traceback. Most are caught by ``unimas validate``; the few that only show when a model loads or
generates run one short training step.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.conftest import EXAMPLES
from unimas.cli import main

QUICKSTART = EXAMPLES / "quickstart.yaml"
GRAPH = EXAMPLES / "quickstart_graph.yaml"
FAST = ("--set", "trainer.steps=1", "--set", "trainer.eval_size=4", "--set", "trainer.tasks_per_step=2")
_unique = itertools.count()

Make = Callable[[Path], Path]
"""Writes a config (and the files it names) into a folder; returns the config's path."""


@dataclass(frozen=True)
class Case:
    id: str
    make: Make
    needles: tuple[str, ...]
    extra: tuple[str, ...] = ()
    command: str = "validate"


def _write(folder: Path, text: str | bytes) -> Path:
    path = folder / f"config{next(_unique)}.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def raw(text: str | bytes | Callable[[str], str | bytes]) -> Make:
    """A config given as text: fixed, or made from the quickstart text."""
    return lambda folder: _write(folder, text(QUICKSTART.read_text()) if callable(text) else text)


def tree(mutate: Callable[[dict], Any], base: Path = QUICKSTART) -> Make:
    """The ``base`` config with ``mutate`` applied to its parsed tree."""
    def make(folder: Path) -> Path:
        config = yaml.safe_load(base.read_text())
        mutate(config)
        return _write(folder, yaml.safe_dump(config))
    return make


def with_file(name: str, content: bytes | str, mutate: Callable[[dict, str], Any]) -> Make:
    """The quickstart config naming a file ``name`` (its absolute path is passed to ``mutate``)."""
    def make(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return tree(lambda config: mutate(config, str(path)))(folder)
    return make


def jsonl_data(content: bytes | str) -> Make:
    return with_file("tasks.jsonl", content, lambda c, p: c.update(data={"name": "jsonl", "params": {"path": p}}))


def plugin(source: str, mutate: Callable[[dict, str], Any] = lambda c, m: None) -> Make:
    """A plugin module (importable: the test puts the folder on sys.path) listed under ``plugins:``."""
    def make(folder: Path) -> Path:
        module = f"catalogue_plugin_{next(_unique)}"
        (folder / f"{module}.py").write_text("import unimas\n" + source)
        return tree(lambda config: (config.update(plugins=[module]), mutate(config, module)))(folder)
    return make


def setting(key: str, value: Any) -> Make:
    """The quickstart config with one dotted ``key`` set to ``value`` in the YAML tree."""
    def mutate(config: dict) -> None:
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[last] = value
    return tree(mutate)


def method(key: str, name: str, **params: Any) -> Make:
    """The quickstart config with ``algorithm.<key>: {name, params}``."""
    return setting(f"algorithm.{key}", {"name": name, "params": params})


def agent(program: Callable[[Path], str], mutate: Callable[[dict], Any] = lambda c: None) -> Make:
    """The quickstart config run by a ``workflow.agent`` command whose program ``program`` makes in the folder."""
    return lambda folder: tree(lambda c: (c.update(workflow={"agent": {"command": [program(folder)]}}),
                                          mutate(c)))(folder)


def not_executable(folder: Path) -> str:
    (folder / "agent.py").write_text("print('{}')\n")
    (folder / "agent.py").chmod(0o644)
    return str(folder / "agent.py")


def a_directory(folder: Path) -> str:
    (folder / "agent_dir").mkdir()
    return str(folder / "agent_dir")


def a_dir(folder: Path) -> Path:
    (folder / "dir.yaml").mkdir()
    return folder / "dir.yaml"


def empty_model_dir(folder: Path) -> Path:
    (folder / "not_a_model").mkdir()
    return tree(lambda c: c["models"]["shared"].update(options={"path": str(folder / "not_a_model")}))(folder)


BOMB = "\n".join(["name: bomb", "models: {}", "roles: {}", "data: {name: signalling}", "workflow:",
                  "  name: signalling", "  params:", '    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol"]']
                 + [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)])
DATASET_PLUGIN = """
@unimas.hookimpl
def unimas_datasets():
    return {{"odd": lambda split, seed: {rows}}}
"""
ODD_DATA = {"name": "odd", "params": {}}
ESTIMATOR_PLUGIN = """
from pydantic import PositiveFloat

def scaled(token_level_rewards, response_mask, *, scale: PositiveFloat = 1.0):
    return token_level_rewards * scale * response_mask, token_level_rewards * response_mask

@unimas.hookimpl
def unimas_estimators():
    return {"scaled": scaled}
"""
NAN = float("nan")
WORKFLOW_PLUGIN = """
async def odd_chars(ctx, task):
    message = await ctx.act("speaker", target="?!")
    return {"answer": message.text}

@unimas.hookimpl
def unimas_workflows():
    return {"odd_chars": odd_chars}
"""
LORA = {"r": 2, "target_modules": ["q_proj", "query_key_value"]}


def _lora(config: dict) -> None:
    config["models"]["shared"]["lora"] = LORA
    config["roles"]["speaker"]["adapter"] = "speaker"
    config["roles"]["listener"]["adapter"] = "listener"


CASES = [
    # -- the config file itself
    Case("config-is-a-directory", a_dir, ("dir.yaml", "is a directory")),
    Case("config-is-binary", raw(b"\x7fELF\x02\x01\x00\x00"), ("binary file",)),
    Case("config-not-utf8", raw(lambda t: t.replace("Two-role", "Zwei-R\xf4lle").encode("latin-1")),
         ("not UTF-8", "line 1")),
    Case("config-too-large", raw(lambda t: t + "#" * (1 << 20)), ("the limit is 1048576",)),
    Case("config-missing", lambda folder: folder / "nowhere.yaml", ("nowhere.yaml", "not found")),
    Case("config-empty", raw(""), ("must be a YAML mapping",)),
    Case("config-a-list", raw("- name: x\n"), ("must be a YAML mapping",)),
    Case("yaml-syntax-error", raw(lambda t: t + "\nroles: [unclosed\n"), ("not valid YAML", "line")),
    Case("yaml-deeply-nested", raw(lambda t: t + "\nlogging: {wandb: " + "[" * 5000 + "]" * 5000 + "}\n"),
         ("nested more than 64 levels",)),
    Case("yaml-alias-bomb", raw(BOMB), ("alias bomb", "line 13")),
    Case("yaml-recursive-alias", raw(lambda t: t.replace("data: {", "data: &d {params: [*d], ").replace(
        ", params: {targets: abcdefgh}", "")), ("refers to the value that contains it",)),
    Case("yaml-duplicate-top-key", raw(lambda t: t + "\nname: again\n"), ("duplicate key 'name'", "first at line 4")),
    Case("yaml-duplicate-nested-key", raw(lambda t: t.replace('template: "S:{target}"',
                                                              'template: "S:{target}"\n    template: "S:"')),
         ("duplicate key 'template'", "line 16")),
    Case("yaml-binary-tag", raw(lambda t: t + "\nlogging: {wandb: {key: !!binary aGVsbG8=}}\n"),
         ("tag:yaml.org,2002:binary is not supported",)),
    Case("yaml-set-tag", raw(lambda t: t.replace("workflow: {name: signalling}",
                                                 "workflow: {name: signalling, params: {s: !!set {a: null}}}")),
         ("tag:yaml.org,2002:set is not supported",)),
    # -- numbers
    Case("seed-too-large", raw(lambda t: t), ("trainer.seed", "less than 2147483648"),
         ("--set", "trainer.seed=99999999999")),
    Case("seed-negative", setting("trainer.seed", -1), ("trainer.seed",)),
    Case("reward-weight-nan", setting("rewards.0.weight", float("nan")), ("rewards.0.weight", "finite")),
    Case("entropy-coef-inf-by-set", raw(lambda t: t), ("algorithm.entropy_coef", "finite"),
         ("--set", "algorithm.entropy_coef=.inf")),
    Case("temperature-inf", setting("roles.speaker.generation.temperature", float("inf")),
         ("roles.speaker.generation.temperature", "finite")),
    Case("lr-nan", setting("models.shared.optim.lr", float("nan")), ("models.shared.optim.lr",)),
    Case("tiny-init-std-inf", setting("models.shared.options.tiny.init_std", float("inf")),
         ("models.shared.options.tiny.init_std", "finite")),
    Case("gamma-above-one", setting("algorithm.gamma", 2.0), ("algorithm.gamma",)),
    Case("betas-out-of-range", setting("models.shared.optim.betas", [0.9, 1.5]), ("models.shared.optim.betas",)),
    Case("clip-ratio-low-negative", setting("algorithm.clip_ratio_low", -0.1), ("algorithm.clip_ratio_low",)),
    # -- missing or empty sections, unsafe names
    Case("roles-empty", setting("roles", {}), ("roles", "at least 1")),
    Case("models-empty", setting("models", {}), ("models", "at least 1")),
    Case("data-missing", tree(lambda c: c.pop("data")), ("data", "Field required")),
    Case("workflow-empty", setting("workflow", {}), ("workflow", "exactly one of 'name'")),
    Case("run-name-with-slash", setting("name", "../escape"), ("run name",)),
    Case("group-name-with-dots", tree(lambda c: c["models"].update({"..": c["models"].pop("shared")})),
         ("model group name",)),
    Case("run-name-absolute", setting("name", "/etc/evil"), ("run name",)),
    Case("group-name-absolute", tree(lambda c: c["models"].update({"/tmp/x": c["models"].pop("shared")})),
         ("model group name",)),
    Case("adapter-name-with-dots", setting("roles.speaker.adapter", "../../escape"), ("adapter name",)),
    Case("adapter-name-hidden", setting("roles.speaker.adapter", ".hidden"), ("adapter name",)),
    # -- tiny models
    Case("heads-do-not-divide-width", setting("models.shared.options.tiny.num_heads", 3),
         ("models.shared.options.tiny", "not divisible by num_heads 3")),
    Case("max-new-tokens-beyond-positions", setting("roles.speaker.generation.max_new_tokens", 500),
         ("roles.speaker.generation.max_new_tokens", "128 positions")),
    Case("eval-max-new-tokens-beyond-positions", setting("roles.listener.eval_generation", {"max_new_tokens": 128}),
         ("roles.listener.eval_generation.max_new_tokens",)),
    Case("system-outside-alphabet", setting("roles.speaker.system", "Hi "), ("roles.speaker.system", "'H'", "'i'")),
    Case("template-outside-alphabet", setting("roles.speaker.template", "S?{target}"),
         ("roles.speaker.template", "'?'")),
    Case("task-value-outside-alphabet", setting("data.params.targets", "abZ"),
         ("roles.speaker.template", "{target} of row 2", "'Z'")),
    Case("path-not-a-model-dir", setting("models.shared.options", {"path": "no/such/model"}),
         ("models.shared.options.path", "no config.json")),
    Case("path-is-a-hub-name", setting("models.shared.options", {"path": "Qwen/Qwen2.5-0.5B-Instruct"}),
         ("models.shared.options.path", "hf download Qwen/Qwen2.5-0.5B-Instruct")),
    Case("path-dir-without-config", empty_model_dir, ("models.shared.options.path", "not_a_model")),
    Case("init-from-not-a-checkpoint", setting("models.shared.options", {"init_from": "no/such/run"}),
         ("models.shared.options.init_from", "neither a unimas checkpoint")),
    Case("lora-target-module-missing", tree(_lora), ("models.shared.lora.target_modules", "'query_key_value'",
                                                     "q_proj"), FAST, "train"),
    Case("prompt-outside-alphabet-at-generate", plugin(WORKFLOW_PLUGIN, lambda c, m: c.update(
        workflow={"name": "odd_chars"})), ("outside the tokenizer's vocabulary", "'?'",
                                           "models.shared.options.tiny.alphabet"), FAST, "train"),
    # -- data files and datasets
    Case("jsonl-not-utf8", jsonl_data(b'{"target": "a"}\n{"target": "\xe9"}\n'), ("tasks.jsonl", "line 2", "UTF-8")),
    Case("jsonl-row-not-object", jsonl_data("[1, 2]\n"), ("tasks.jsonl", "line 1", "JSON object")),
    Case("jsonl-row-not-json", jsonl_data('{"target": "a"\n'), ("tasks.jsonl", "line 1 is not JSON")),
    Case("jsonl-missing", setting("data", {"name": "jsonl", "params": {"path": "no/tasks.jsonl"}}),
         ("data.params.path", "not found")),
    Case("jsonl-path-is-a-directory", with_file("tasks.jsonl.d", "", lambda c, p: c.update(
        data={"name": "jsonl", "params": {"path": str(Path(p).parent)}})), ("data.params.path", "cannot read")),
    Case("jsonl-path-not-a-string", setting("data", {"name": "jsonl", "params": {"path": 3}}),
         ("data.params.path", "file name")),
    Case("inline-row-not-a-mapping", setting("data", {"name": "inline", "params": {"tasks": [{"target": "a"}, 7]}}),
         ("row 1", "must be a mapping")),
    Case("graph-row-missing-field", tree(lambda c: c.update(data={"name": "inline", "params": {
        "tasks": [{"target": "a", "answer": "a"}, {"answer": "b"}]}}), base=GRAPH),
         ("workflow.graph.nodes.speak.inputs", "row 1", "no field 'target'")),
    Case("dataset-value-not-json", plugin(DATASET_PLUGIN.format(rows='[{"target": "a", "bad": {1, 2}}]'),
                                          lambda c, m: c.update(data=ODD_DATA)),
         ("row 0", "not JSON-serialisable")),
    Case("dataset-returns-a-dict", plugin(DATASET_PLUGIN.format(rows='{"target": "a"}'),
                                          lambda c, m: c.update(data=ODD_DATA)), ("data.name", "list of dicts")),
    Case("dataset-raises", plugin(DATASET_PLUGIN.format(rows="1 / 0"), lambda c, m: c.update(data=ODD_DATA)),
         ("dataset 'odd' failed", "ZeroDivisionError")),
    # -- algorithm plugins (docs/algorithms.md): a misspelt name is caught by validate, before any model loads
    Case("unknown-rollout-control", setting("algorithm.rollout", {"name": "entropy_brnch"}),
         ("algorithm.rollout.name", "entropy_brnch", "entropy_branch")),
    Case("unknown-update-order", setting("algorithm.update_order", {"name": "reverse"}),
         ("algorithm.update_order.name", "reverse_execution")),
    Case("unknown-credit-shaper", setting("algorithm.credit", {"name": "hgpo2"}), ("algorithm.credit.name", "hgpo")),
    # -- algorithm plugin parameters, checked against the types each plugin declares (unimas/config/plugin_params.py)
    Case("rollout-param-unknown", method("rollout", "entropy_branch", sibling=1),
         ("algorithm.rollout.params.sibling", "unknown parameter", "siblings")),
    Case("rollout-param-float-for-int", method("rollout", "entropy_branch", roots=2.0),
         ("algorithm.rollout.params.roots", "valid integer", "2.0")),
    Case("rollout-param-negative-size", method("rollout", "entropy_branch", siblings=-1),
         ("algorithm.rollout.params.siblings", "greater than 0")),
    Case("rollout-param-nan", method("rollout", "adaptive_budget", probe=NAN), ("algorithm.rollout.params.probe",)),
    Case("rollout-param-string-for-int", method("rollout", "adaptive_budget", probe="4"),
         ("algorithm.rollout.params.probe", "valid integer")),
    Case("rollout-param-refused-by-train", method("rollout", "entropy_branch", roots="4"),
         ("algorithm.rollout.params.roots", "valid integer"), FAST, "train"),
    Case("rollout-param-not-a-choice", method("rollout", "entropy_branch", trigger="random"),
         ("algorithm.rollout.params.trigger", "'entropy' or 'mixed'")),
    Case("replay-param-unknown", method("replay", "verified_successes", per_tsk=1),
         ("algorithm.replay.params.per_tsk", "per_task")),
    Case("replay-param-float-for-int", method("replay", "verified_successes", per_task=1.5),
         ("algorithm.replay.params.per_task", "valid integer")),
    Case("replay-param-negative-size", method("replay", "verified_successes", per_group=-2),
         ("algorithm.replay.params.per_group", "greater than 0")),
    Case("replay-param-nan", method("replay", "verified_successes", threshold=NAN),
         ("algorithm.replay.params.threshold", "finite")),
    Case("replay-param-string-for-float", method("replay", "verified_successes", revisit="0.5"),
         ("algorithm.replay.params.revisit", "valid number")),
    Case("update-order-param-unknown", method("update_order", "reverse_execution", dmp=0.1),
         ("algorithm.update_order.params.dmp", "damp")),
    Case("update-order-param-negative", method("update_order", "reverse_execution", damp=-0.5),
         ("algorithm.update_order.params.damp", "greater than or equal to 0")),
    Case("update-order-param-nan", method("update_order", "reverse_execution", ratio_clip=NAN),
         ("algorithm.update_order.params.ratio_clip", "finite")),
    Case("update-order-param-string-for-float", method("update_order", "reverse_execution", damp="0.1"),
         ("algorithm.update_order.params.damp", "valid number")),
    Case("credit-param-unknown", method("credit", "gagpo", gama=0.9), ("algorithm.credit.params.gama", "gamma")),
    Case("credit-param-string-gamma", method("credit", "gagpo", gamma="0.9"),
         ("algorithm.credit.params.gamma", "valid number", "'0.9'")),
    Case("credit-param-nan", method("credit", "hgpo", alpha=NAN), ("algorithm.credit.params.alpha", "finite")),
    Case("credit-param-negative", method("credit", "hgpo", epsilon=-1e-6),
         ("algorithm.credit.params.epsilon", "greater than 0")),
    Case("credit-param-int-for-bool", method("credit", "gagpo", normalize=1),
         ("algorithm.credit.params.normalize", "valid boolean")),
    Case("credit-param-none-taken", method("credit", "counterfactual", alpha=1.0),
         ("algorithm.credit.params.alpha", "known: none")),
    Case("credit-params-explicit-model-check", method("credit", "gdpo", channels=["a"], weights=[1.0, 2.0]),
         ("algorithm.credit.params", "one number per channel")),
    Case("credit-params-required-missing", method("credit", "gdpo"), ("algorithm.credit.params.channels", "required")),
    Case("loss-param-unknown", tree(lambda c: c["algorithm"].update(loss="m2po", loss_params={"tao": 0.01})),
         ("algorithm.loss_params.tao", "tau")),
    Case("loss-param-string-for-float", tree(lambda c: c["algorithm"].update(loss="m2po", loss_params={"tau": "0.01"})),
         ("algorithm.loss_params.tau", "valid number")),
    Case("loss-param-negative", tree(lambda c: c["algorithm"].update(loss="m2po", loss_params={"tau": -0.01})),
         ("algorithm.loss_params.tau", "greater than 0")),
    Case("loss-param-nan", tree(lambda c: c["algorithm"].update(loss="m2po", loss_params={"tau": NAN})),
         ("algorithm.loss_params.tau", "finite")),
    Case("loss-param-of-a-verl-loss", setting("algorithm.loss_params", {"clip": 0.1}),
         ("algorithm.loss_params.clip", "known: none")),
    Case("group-loss-param-nan", setting("models.shared.algorithm", {"loss": "m2po", "loss_params": {"tau": NAN}}),
         ("models.shared.algorithm.loss_params.tau", "finite")),
    Case("estimator-param-of-verl-grpo", setting("algorithm.estimator_params", {"epsilon": 1e-6}),
         ("algorithm.estimator_params.epsilon", "known: none")),
    Case("estimator-param-string", plugin(ESTIMATOR_PLUGIN, lambda c, m: c["algorithm"].update(
        estimator="scaled", estimator_params={"scale": "2"})), ("algorithm.estimator_params.scale", "valid number")),
    Case("estimator-param-nan", plugin(ESTIMATOR_PLUGIN, lambda c, m: c["algorithm"].update(
        estimator="scaled", estimator_params={"scale": NAN})), ("algorithm.estimator_params.scale", "finite")),
    Case("fork-an-agent-program", agent(lambda f: sys.executable, lambda c: c["algorithm"].update(
        rollout={"name": "entropy_branch"})), ("algorithm.rollout.name", "workflow.agent", "forks")),
    # -- workflow.agent.command: found as the agent runner finds it (a path relative to the cwd, or on PATH)
    Case("agent-command-missing", agent(lambda f: "./no_such_agent.py"),
         ("workflow.agent.command", "'./no_such_agent.py' does not exist")),
    Case("agent-command-not-on-path", agent(lambda f: "no-such-agent-program"),
         ("workflow.agent.command", "not on PATH")),
    Case("agent-command-is-a-directory", agent(a_directory), ("workflow.agent.command", "is a directory")),
    Case("agent-command-not-executable", agent(not_executable),
         ("workflow.agent.command", "is not executable", "chmod +x")),
    # -- plugin modules
    Case("plugin-syntax-error", plugin("def broken(:\n"), ("cannot import plugin module", "SyntaxError")),
    Case("plugin-raises-on-import", plugin("raise RuntimeError('no GPU here')\n"),
         ("cannot import plugin module", "RuntimeError: no GPU here")),
    Case("plugin-not-installed", setting("plugins", ["no_such_plugin_module"]), ("plugins", "no_such_plugin_module")),
    Case("plugin-empty-name", setting("plugins", [""]), ("plugins", "cannot import")),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_exits_2_naming_the_cause(case: Case, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a train case writes its run directory here
    config = case.make(tmp_path)
    code = main([case.command, str(config), *case.extra])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err
    for needle in case.needles:
        assert needle in err, f"{needle!r} not in: {err}"


def test_catalogue_is_large_and_ids_are_unique():
    assert len(CASES) >= 40
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("make", [
    raw(lambda t: t),
    raw(lambda t: t.replace("generation: {max_new_tokens: 1, temperature: 1.0, require_eos: false}",
                            "generation: &gen {max_new_tokens: 1, temperature: 1.0, require_eos: false}", 1)
        .replace("generation: {max_new_tokens: 1, temperature: 1.0, require_eos: false}", "generation: *gen")),
    jsonl_data("\n".join(json.dumps({"target": t, "answer": t}) for t in "abcd") + "\n"),
    method("rollout", "entropy_branch", roots=2, siblings=1, trigger="mixed"),
    method("credit", "gdpo", channels=["exact_match"], weights=[1.0]),
    tree(lambda c: c["algorithm"].update(loss="m2po", loss_params={"tau": 0.02})),
    agent(lambda f: sys.executable),
], ids=["quickstart", "anchors-and-aliases", "jsonl-data", "typed-params", "explicit-params-model", "loss-params",
        "agent-program"])
def test_valid_variants_still_pass(make: Make, tmp_path, capsys):
    code = main(["validate", str(make(tmp_path))])
    assert code == 0, capsys.readouterr().err


@pytest.mark.slow
def test_valid_variant_trains(tmp_path, capsys):
    config = jsonl_data("\n".join(json.dumps({"target": t, "answer": t}) for t in "abcd") + "\n")(tmp_path)
    code = main(["train", str(config), "--run-dir", str(tmp_path / "run"), *FAST])
    assert code == 0, capsys.readouterr().err
