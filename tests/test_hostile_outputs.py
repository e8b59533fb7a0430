"""Model output is hostile data: every reader of it gives a parse error, a finite reward or a failed tool call.

Each test feeds one reader an input that broke it (a crash with the wrong exception, a reward hacked or
raising, or work that grew with the square of the input). Work is bounded by construction in the code
(a pairing pass, a cap on attempts, a size limit). Where a broken reader would do unbounded work the
tests count its calls, so a regression fails at once; where it works inside ``re`` or ``str`` and cannot
be counted, ``pytest.mark.timeout`` turns the hang into a failure (the fixed readers take milliseconds).
"""

from __future__ import annotations

import json
import threading

import pytest
from unimas_plugins import math_rewards, retrievers
from unimas_plugins.datasets import jsonl
from unimas_plugins.parsers import boxed, code_block, json_object
from unimas_plugins.retrievers import RetrievalError, format_passages, load_corpus
from unimas_plugins.tools import calculator
from unimas_workflows.code_team import _summary, code_tasks
from unimas_workflows.debate import verdict_label
from unimas_workflows.math_team import boxed_answer, math_jsonl

from unimas import ParseError
from unimas.errors import UserError
from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode
from unimas.workflow.safe_expr import ExpressionError, compile_expression


class BudgetExceeded(AssertionError):
    """A reader did more work on a hostile text than a linear reader needs."""


class CountingText(str):
    """A text whose one-character reads (``text[i]``) are counted; past ``budget`` they fail the test."""

    def __new__(cls, value: str, budget: int) -> "CountingText":
        text = super().__new__(cls, value)
        text.budget = budget
        return text

    def __getitem__(self, key):
        if isinstance(key, int):
            self.budget -= 1
            if self.budget < 0:
                raise BudgetExceeded("read the text character by character more often than its length")
        return super().__getitem__(key)


# -- parsers --------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("read", [boxed(), lambda text: boxed_answer(text) or ""], ids=["parser", "dataset"])
def test_many_unclosed_boxes_are_read_in_one_pass(read):
    """Each unclosed ``\\boxed{`` used to be scanned to the end of the text: 20k of them took minutes.
    (``boxed_answer`` copies the text with ``str()``, so there the timeout, not the count, catches it.)"""
    unclosed = "\\boxed{" * 20_000
    text = CountingText(r"\boxed{7} " + unclosed, budget=len(unclosed))
    assert read(text) == "7"


def test_the_boxed_parser_keeps_its_answers_on_nested_and_unbalanced_boxes():
    """The one-pass pairing reads what the per-box scan read: the last box whose brace closes."""
    parse = boxed()
    assert parse(r"\boxed{\frac{1}{2}} } \boxed{x{") == r"\frac{1}{2}"
    assert parse("}" * 5 + r"\boxed{a{b}c}" + "{" * 5) == "a{b}c"
    with pytest.raises(ParseError, match="no complete"):
        parse("\\boxed{" + "{" * 100_000)


@pytest.mark.parametrize(("text", "reason"), [
    ('{"a":' * 100_000, "nested too deeply"),  # used to raise RecursionError
    ('{"answer": ' + "9" * 5000 + "}", "4300 digits"),  # used to raise ValueError (int digit limit)
])
def test_json_parser_turns_deep_nesting_and_huge_integers_into_parse_errors(text, reason):
    """``raw_decode`` raises RecursionError / ValueError here, not JSONDecodeError: the parser let them out."""
    with pytest.raises(ParseError, match=reason):
        json_object(["answer"])(text)


@pytest.mark.parametrize("text", ["{" * 200_000, '{"a": 0, ' * 20_000], ids=["bare braces", "unterminated objects"])
def test_json_parser_decodes_a_bounded_number_of_candidates(text, monkeypatch):
    """Every ``{`` used to be decoded, each decode reading up to the end of the text: quadratic time."""
    calls = []
    decode = json.JSONDecoder.raw_decode

    def counted(self, text, start=0):
        calls.append(start)
        if len(calls) > 1_000:  # above the parser's cap, far below the thousands of candidates
            raise BudgetExceeded(f"decoded {len(calls)} candidate objects")
        return decode(self, text, start)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counted)
    with pytest.raises(ParseError):
        json_object(["answer"])(text)


def test_json_parser_still_finds_an_object_after_stray_braces():
    """Skipping a ``{`` that cannot open an object must not skip the object after it."""
    assert json_object(["answer"])('{{{ set {x} {"x": 1} {"answer": 3}') == {"answer": 3}


@pytest.mark.timeout(30)
def test_code_parser_on_a_fence_line_without_newline_gives_a_parse_error():
    """The fence regex backtracked over a long fence line with no newline (quadratic); ``str.find`` does not."""
    parse = code_block()
    with pytest.raises(ParseError, match="not terminated"):
        parse("```" + "a" * 1_000_000)
    with pytest.raises(ParseError, match="no complete fenced code block"):  # not "no ```None block"
        parse("```" * 1_000_000)


def test_code_parser_keeps_its_answers():
    """The ``str.find`` scan reads fences as the regex did: language from the fence line, any case."""
    assert code_block("python")("```js\nx\n``` then ```Python extra\ny = 1\n```") == "y = 1\n"
    assert code_block()("````\nbody```") == "body"


@pytest.mark.timeout(30)
def test_a_judge_verdict_padded_with_spaces_is_read_in_linear_time():
    """The label regex had two ``\\s*`` around an optional ``[.!]``: on ``a``, a million spaces and ``x`` they
    traded the spaces back and forth (quadratic; hours). It must answer None at once."""
    assert verdict_label("a" + " " * 1_000_000 + "x", {"side_a": "yes", "side_b": "no"}) is None
    assert [verdict_label(text, {}) for text in (" Debater  b. ", "A !", "a.!")] == ["B", "A", None]


# -- math rewards -----------------------------------------------------------------------------------


def test_off_the_main_thread_no_answer_reaches_sympy(monkeypatch):
    """Without SIGALRM nothing stops sympy on ``2^{10^{10}}`` (it held the GIL for minutes): such answers
    are compared as plain numbers and strings only."""
    parsed = []
    monkeypatch.setattr("math_verify.parse", lambda text, **kwargs: parsed.append(text) or [])
    results = []
    worker = threading.Thread(target=lambda: results.append(
        [math_rewards.equivalent(r"2^{10^{10}}", "1"), math_rewards.equivalent("0.5", "1/2")]))
    worker.start()
    worker.join()
    assert results == [[False, True]]
    assert parsed == []


@pytest.mark.parametrize("garbage", ["???", "\x00", "\ud800"])
def test_an_answer_nothing_can_read_earns_no_format_reward(garbage):
    """``math_verify.parse`` falls back to the bare string when it reads nothing, and that string counted as
    a readable expression: any garbage answer earned the full format reward."""
    trajectory = GraphTrajectory("e", "t")
    trajectory.add_node(TurnNode(id="solver#0", role="solver", model_group="g", prompt="", text=garbage,
                                 parsed=garbage))
    assert math_rewards.math_format(trajectory, {"answer": "1"}) == {"solver#0": 0.0}


# -- retrievers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("selection", ["2 " + "9" * 5000, ["2", "²", "9" * 5000]], ids=["text", "list"])
def test_a_selection_with_a_huge_or_odd_number_keeps_the_numbers_it_can_read(selection):
    """``int()`` of a 5000-digit run (past Python's digit limit) or of ``"²"`` raised ValueError inside the
    workflow, failing the episode; such a run names no passage."""
    passages = [{"id": "a", "title": "A", "text": "first"}, {"id": "b", "title": "B", "text": "second"}]
    assert format_passages(passages, selection=selection) == "[2] B: second"


def test_an_infinite_k_is_a_retrieval_error():
    """``int(inf)`` raises OverflowError, which ``_k`` let out instead of saying what k must be."""
    with pytest.raises(RetrievalError, match="k must be an integer"):
        retrievers.bm25_search("who", k=float("inf"))


# -- expressions and the calculator tool ----------------------------------------------------------


@pytest.mark.parametrize(("text", "env"), [
    ("int(answer) + 1", {"answer": "9" * 4300}),
    ("int(answer) * int(answer)", {"answer": "9" * 3000}),
])
def test_an_integer_too_long_to_print_is_an_expression_error(text, env):
    """10**4300 cannot be turned into text (Python's digit limit): an outcome holding it made rewards and the
    trajectory file raise far from the expression."""
    with pytest.raises(ExpressionError, match="bits"):
        compile_expression(text).evaluate(env)


def test_the_calculator_result_can_be_written_to_the_trajectory_file():
    """The model writes the calculator's expression: ``int("9" * 4000) ** 2`` by multiplication used to be a
    tool result that ``json.dumps`` cannot write, so saving the trajectory raised."""
    with pytest.raises(ValueError, match="bits"):
        calculator('int("9" * 4000) * int("9" * 4000)')
    trajectory = GraphTrajectory("e", "t")
    trajectory.add_node(ToolNode(id="tool:calculator#0", tool="calculator", arguments={},
                                 result=calculator('int("9" * 4000) + 1')))
    assert json.loads(trajectory.to_json())["nodes"][0]["result"] == 10 ** 4000


# -- code team ---------------------------------------------------------------------------------------


def test_forged_harness_lines_cannot_raise_or_inflate_the_pass_rate():
    """The candidate shares the harness's process and can find the nonce; its lines used to crash the fold
    (a list, a non-integer total) or set any total, so the reward could raise or exceed 1."""
    mark = "@@unimas-tests-0"
    lines = [f'{mark} {{"event": "total", "total": 2}}', f"{mark} [1]",
             f'{mark} {{"event": "total", "total": "x"}}', f'{mark} {{"event": "total", "total": {10 ** 400}}}',
             *[f'{mark} {{"event": "case", "ok": true}}'] * 5, f'{mark} {{"event": "done"}}']
    found = _summary("\n".join(lines), mark)
    assert (found["total"], found["passed"]) == (2, 2)


# -- task and corpus files ------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "reason"), [
    ('{"question": "q", "answer": ' + "9" * 5000 + "}", "4300 digits"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
@pytest.mark.parametrize(("read", "error"), [
    (lambda path: jsonl("train", 0, path), UserError),
    (lambda path: math_jsonl("train", 0, path), UserError),
    (lambda path: code_tasks("train", 0, path, allow_fallback=True), UserError),
    (load_corpus, RetrievalError),
], ids=["jsonl", "math_jsonl", "code_tasks", "bm25 corpus"])
def test_a_json_line_too_deep_or_with_a_huge_integer_is_a_clear_file_error(read, error, line, reason, tmp_path):
    """``json.loads`` raises RecursionError or ValueError (not JSONDecodeError) for these lines; the readers
    let them escape as tracebacks instead of naming the file and line."""
    path = tmp_path / "tasks.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(error, match=f"line 1 is not JSON: .*{reason}"):
        read(str(path))


@pytest.mark.parametrize("expression", ["'a' * 10", "[1, 2] * 3", "1 < 2", "1e999", "1e999 - 1e999", "'x'"])
def test_the_calculator_answers_numbers_only(expression: str):
    """The safe evaluator also computes strings, lists and comparisons for graph conditions; the calculator
    promises numbers, and a non-finite one would reach the model as ``inf``/``nan`` text."""
    with pytest.raises(ValueError):
        calculator(expression)
    assert calculator("2 * (3 + 4)") == 14 and calculator("7 / 2") == 3.5


@pytest.mark.parametrize("reader, error", [
    (lambda path: jsonl("train", 0, path), UserError),
    (lambda path: math_jsonl("train", 0, path), UserError),
    (load_corpus, RetrievalError),
])
@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.timeout(30)  # without the check the read blocks (FIFO) or never ends (/dev/zero)
def test_a_data_file_that_is_a_pipe_or_a_device_is_refused_not_read_forever(reader, error, kind: str, tmp_path):
    """Opening a FIFO blocks until a writer comes and ``/dev/zero`` never ends: the reader would hang the run
    (or fill memory) before any message. The file is refused by its kind, unopened."""
    import os

    path = tmp_path / "tasks.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = "/dev/zero"
    with pytest.raises(error, match="not a regular file"):
        reader(str(path))


@pytest.mark.timeout(30)
def test_the_sandbox_command_refuses_a_pipe_as_its_program(tmp_path, capsys):
    import os

    from unimas.cli import main

    fifo = tmp_path / "program.py"
    os.mkfifo(fifo)
    assert main(["sandbox", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err
