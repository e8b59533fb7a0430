"""User plugin code that raises what an episode does not expect, or returns values JSON cannot write: only its
own episode (or tool node, or turn's parse) fails, with the reason, and the run still writes its trajectory files."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.test_broken_inputs import FAST, assert_user_error, line_of, write_config, write_plugin
from tests.test_credit import REWARDS, assigner, episode
from tests.test_faults import tool_then_act
from tests.test_router import EchoTransport
from unimas.cli import main
from unimas.config.schema import ParserConfig, RoleConfig
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode, write_jsonl


def run_episodes(workflow, tools=None, parsers=None, episodes=2, roles=None):
    router = Router(EchoTransport(), max_batch_size=64, max_wait_s=0.01)
    roles = roles or {"a": RoleConfig(model="m", template="A:{question}")}
    controller = Controller(workflow, roles, router, tools or {}, parsers=parsers, tool_timeout_s=5)
    specs = [EpisodeSpec(f"e{i}", "t0", {"question": "q", "index": i}) for i in range(episodes)]
    return asyncio.run(asyncio.wait_for(controller.run(specs), 30))


def raises_cancelled_error():
    raise asyncio.CancelledError("a tool's own CancelledError")


async def raises_cancelled_error_async():
    raise asyncio.CancelledError("an async tool's own CancelledError")


def raises_generator_exit():
    raise GeneratorExit("a tool's GeneratorExit")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tool", [raises_cancelled_error, raises_cancelled_error_async, raises_generator_exit])
def test_a_tool_raising_cancelled_error_or_generator_exit_is_an_error_on_its_node(tool):
    """Both are BaseExceptions: they used to escape the tool call and take the whole step down with them."""
    for trajectory in run_episodes(tool_then_act, {"t": tool}):
        assert not trajectory.failed, trajectory.error
        assert trajectory.outcome["tool_error"].startswith(("CancelledError", "GeneratorExit"))
        assert trajectory.outcome["answer"] == "A:Q"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("exception", [asyncio.CancelledError, GeneratorExit])
def test_a_workflow_raising_cancelled_error_or_generator_exit_fails_only_its_episode(exception):
    async def workflow(ctx, task):
        answer = await ctx.act("a")
        if task["index"] == 0:
            raise exception("raised by the workflow itself")
        return {"answer": answer.text}

    first, second = run_episodes(workflow)
    assert first.failed and first.error.startswith(exception.__name__) and f"{__file__}:" in first.error
    assert not second.failed and second.outcome == {"answer": "A:Q"}


@pytest.mark.timeout(60)
def test_a_parser_raising_generator_exit_is_a_parse_error():
    def parse(text):
        raise GeneratorExit("parser bug")

    roles = {"a": RoleConfig(model="m", template="A:{question}", parser=ParserConfig(name="odd"))}

    async def workflow(ctx, task):
        answer = await ctx.act("a")
        return {"parse_error": answer.parse_error}

    for trajectory in run_episodes(workflow, parsers={"a": parse}, roles=roles):
        assert not trajectory.failed, trajectory.error
        assert "parser 'odd' failed: GeneratorExit: parser bug" in trajectory.outcome["parse_error"]


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text for this object")

    __repr__ = __str__


def hostile_episode() -> GraphTrajectory:
    """An episode whose outcome, parse result and tool result hold what JSON cannot write, next to plain data."""
    outcome = {"answer": "a", "pairs": {(1, 2): 3}, "raw": {b"key": 1}, "odd": Unprintable()}
    trajectory = GraphTrajectory(episode_id="e0", task_id="t0", task={"question": "q"}, outcome=outcome)
    trajectory.add_node(TurnNode(id="a#0", role="a", model_group="m", prompt="p", text="t", parsed=Unprintable()))
    trajectory.add_node(ToolNode(id="tool:t#0", tool="t", arguments={"x": 1}, result={frozenset({1}): "set key"}))
    return trajectory


def test_values_json_cannot_write_are_written_as_text_and_the_rest_as_it_was(tmp_path):
    path = tmp_path / "eval.jsonl"
    plain = GraphTrajectory(episode_id="e1", task_id="t0", outcome={"answer": "b"})
    write_jsonl(path, [hostile_episode(), plain])
    first, second = [json.loads(line) for line in path.read_text().splitlines()]
    outcome = first["outcome"]
    assert outcome["answer"] == "a"
    assert outcome["pairs"] == {"(1, 2)": 3}  # a key JSON refuses is written as its text
    assert outcome["raw"] == {"b'key'": 1}
    assert outcome["odd"] == "<a Unprintable that cannot be shown: RuntimeError>"
    turn, tool = first["nodes"]
    assert turn["parsed"] == "<a Unprintable that cannot be shown: RuntimeError>" and turn["text"] == "t"
    assert tool["arguments"] == {"x": 1}
    assert tool["result"] == {"frozenset({1})": "set key"}
    assert second["outcome"] == {"answer": "b"}


HOSTILE_PLUGIN = '''
import unimas


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text for this object")


async def returns_unwritable_values(ctx, task):
    message = await ctx.act("speaker")
    guess = await ctx.act("listener", message=message)
    return {"answer": guess.parsed, "by_pair": {(1, 2): "tuple key"}, "odd": Unprintable()}


@unimas.hookimpl
def unimas_workflows():
    return {"returns_unwritable_values": returns_unwritable_values}
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("staleness", [0, 1])  # 1: the checkpoint also saves rollouts not trained yet
def test_a_run_whose_workflow_returns_unwritable_values_writes_every_file(staleness, tmp_path, monkeypatch, capsys):
    (tmp_path / "unwritable_values_plugin.py").write_text(HOSTILE_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    tree = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    tree["plugins"] = ["unwritable_values_plugin"]
    tree["workflow"] = {"name": "returns_unwritable_values"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree))
    run = tmp_path / "run"
    settings = ["trainer.steps=1", "trainer.tasks_per_step=2", "algorithm.group_size=2", "trainer.eval_size=2",
                "trainer.sample_trajectories=2", "trainer.save_every=1", "trainer.stop_at_accuracy=null",
                "logging.report=false", f"algorithm.max_staleness={staleness}"]
    code = main(["train", str(tmp_path / "config.yaml"), "--run-dir", str(run)]
                + [part for setting in settings for part in ("--set", setting)])
    assert code == 0, capsys.readouterr().err
    for split in ("train", "eval"):
        for line in (run / "trajectories" / f"{split}.jsonl").read_text().splitlines():
            outcome = json.loads(line)["outcome"]
            assert outcome["by_pair"] == {"(1, 2)": "tuple key"}
            assert outcome["odd"] == "<a Unprintable that cannot be shown: RuntimeError>"
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert (run / "checkpoints" / "step_000001" / "COMPLETE").exists()


def test_a_reward_returning_a_million_unknown_keys_fails_its_episode_with_a_short_error():
    """The error names a few keys, cut short, and counts the rest: it is printed, and written into the episode."""
    def many_keys(trajectory, task):
        return {"a" * 10_000_000: 1.0} | {f"role{i}": 1.0 for i in range(1_000_000)}

    credit = assigner([{"name": "many_keys", "level": "role"}], functions={**REWARDS, "many_keys": many_keys})
    trajectory = episode("e", "t", solver_right=True, verifier_right=True)
    credit.allocate([trajectory])
    assert trajectory.failed and len(trajectory.error) < 1000, len(trajectory.error)
    assert f"returned {'a' * 60!r}..., 'role0', 'role1', " in trajectory.error
    assert "and 999991 more" in trajectory.error
    assert f"{__file__}:" in trajectory.error


@pytest.mark.timeout(60)
def test_a_workflow_that_swallows_its_timeout_and_returns_late_still_fails_at_the_timeout():
    """Catching the CancelledError of ``runtime.episode_timeout_s`` must not turn an overrun into a success."""
    async def workflow(ctx, task):
        answer = await ctx.act("a")
        if task["index"] == 0:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                pass  # a bare `except BaseException` in user code does the same
        return {"answer": answer.text}

    router = Router(EchoTransport(), max_batch_size=64, max_wait_s=0.01)
    roles = {"a": RoleConfig(model="m", template="A:{question}")}
    controller = Controller(workflow, roles, router, {}, episode_timeout_s=0.3)
    specs = [EpisodeSpec(f"e{i}", "t0", {"question": "q", "index": i}) for i in range(2)]
    late, in_time = asyncio.run(controller.run(specs))
    assert late.failed and late.error == "TimeoutError: the episode did not finish within 0.3 s"
    assert not in_time.failed and in_time.outcome == {"answer": "A:Q"}


class MessageRaises(Exception):
    """A user exception class whose message itself raises."""

    def __str__(self):
        raise RuntimeError("no message for this exception")


def tool_raising_an_unshowable_exception():
    raise MessageRaises()


@pytest.mark.timeout(60)
def test_an_exception_whose_message_raises_fails_only_its_episode_and_tool_node():
    async def workflow(ctx, task):
        tool = await ctx.tool("t")
        if task["index"] == 0:
            raise MessageRaises()
        return {"tool_error": tool.error}

    failed, tool_failed = run_episodes(workflow, {"t": tool_raising_an_unshowable_exception})
    assert failed.error.startswith("MessageRaises (its message cannot be shown: str() raised RuntimeError) (at ")
    assert f"{__file__}:" in failed.error
    assert not tool_failed.failed
    assert tool_failed.outcome["tool_error"] == "MessageRaises (its message cannot be shown: str() raised RuntimeError)"


def test_a_reward_raising_an_exception_whose_message_raises_fails_its_episode():
    def unshowable(trajectory, task):
        raise MessageRaises()

    credit = assigner([{"name": "unshowable"}], functions={**REWARDS, "unshowable": unshowable})
    trajectory = episode("e", "t", solver_right=True, verifier_right=True)
    credit.allocate([trajectory])
    assert trajectory.error.startswith("reward 'unshowable' (rewards.unshowable): MessageRaises (its message cannot "
                                       "be shown: str() raised RuntimeError) (at ")
    assert f"{__file__}:" in trajectory.error


def test_a_dataset_row_that_cannot_be_read_as_a_mapping_is_a_user_error_naming_the_row(tmp_path, monkeypatch, capsys):
    name, path = write_plugin(tmp_path, monkeypatch, """
        from collections.abc import Mapping

        class Row(Mapping):
            def __getitem__(self, key):
                raise RuntimeError("this row cannot be read")

            def __iter__(self):
                return iter(["target"])

            def __len__(self):
                return 1

        def rows(split, seed):
            return [Row()]

        @unimas.hookimpl
        def unimas_datasets():
            return {"rows": rows}
    """)
    config = write_config(tmp_path, lambda tree: tree.update(data={"name": "rows"}), plugins=[name])
    code = main(["train", str(config), "--run-dir", str(tmp_path / "run"), *FAST])
    assert_user_error(code, capsys.readouterr().err, "data (rows, eval split, row 0)",
                      "the task cannot be read as a mapping: RuntimeError: this row cannot be read",
                      f"{path}:{line_of(path, 'this row cannot be read')}")
