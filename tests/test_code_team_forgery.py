"""Reward forgery by the graded code: every known trick gets no credit for the tests it did not really pass.

The verdict comes from a harness process the candidate never runs in (see ``unimas_workflows.code_harness``),
so each program below must score only what it honestly earns. The last tests check the plain-data codec that
carries values between the two processes.
"""

import math
import os

import pytest
from unimas_workflows import code_team as ct
from unimas_workflows import plain_data

from tests.test_code_team import ADD_TESTS, needs_sandbox

FIND_HARNESS = '''
import os, sys
def harness_frame():
    frame = sys._getframe(1)
    while frame is not None and "emit" not in frame.f_locals:
        frame = frame.f_back
    return frame
def forge_all_passed(write):
    for index in range(3):
        write(event="case", index=index, ok=True, error=None, source="")
    write(event="done")
'''

FRAME_FORGERY = FIND_HARNESS + '''
def add(a, b):
    frame = harness_frame()
    if frame is not None:
        forge_all_passed(frame.f_locals["emit"])
        os._exit(0)
    return -100
'''

FD_FORGERY = FIND_HARNESS + '''
import json
def add(a, b):
    frame = harness_frame()
    if frame is not None:
        mark = frame.f_locals["mark"]
        forge_all_passed(lambda **event: os.write(1, (mark + " " + json.dumps(event) + "\\n").encode()))
        os._exit(0)
    return -100
'''

IMPORT_EXIT_FORGERY = FIND_HARNESS + '''
frame = harness_frame()
if frame is not None:
    forge_all_passed(frame.f_locals["emit"])
sys.exit(0)
def add(a, b):
    return -100
'''

EXIT_MID_RUN_FORGERY = FIND_HARNESS + '''
def add(a, b):
    if b == 1:  # the second test: forge the rest, then end the process before the harness reports
        frame = harness_frame()
        if frame is not None:
            forge_all_passed(frame.f_locals["emit"])
        os._exit(0)
    return a + b
'''

LATE_ANSWER = '''
def add(a, b):
    if (a, b) == (1, 2):
        try:
            while True:
                pass
        except BaseException:  # the old in-process timer raised here: answer after the time is up
            return 3
    return a + b
'''

ALWAYS_EQUAL = {
    "object": "class Anything:\n    def __eq__(self, other):\n        return True\n"
              "    def __ne__(self, other):\n        return False\nresult = Anything()",
    "int subclass": "class Int(int):\n    __hash__ = int.__hash__\n    def __eq__(self, other):\n        return True\n"
                    "result = Int(0)",
    "str subclass": "class Str(str):\n    __hash__ = str.__hash__\n    def __eq__(self, other):\n        return True\n"
                    "result = Str('')",
    "list subclass": "class List(list):\n    def __eq__(self, other):\n        return True\nresult = List()",
}

PATCHED_BUILTINS = '''
import builtins
real_abs, real_len, real_isinstance = abs, len, isinstance  # patched only where f's answers are checked
builtins.abs = lambda value: 0 if value == 97 else real_abs(value)
builtins.len = lambda value: 3 if value == 100 else real_len(value)
builtins.isinstance = lambda value, kinds: value == 100 or real_isinstance(value, kinds)
def f(x):
    return 100
'''
BUILTIN_TESTS = "assert abs(f(1) - 3) < 1e-9\nassert len(f(3)) == 3\nassert isinstance(f(1), str)"

STOP_ITERATION = "def add(a, b):\n    raise StopIteration\n"
LOOP_TESTS = "for got, want in zip(map(add, [1, 2], [2, 2]), [3, 4]):\n    assert got == want"

REPORT_THIEF = '''
import os
ready, in_place = os.pipe()
def steal_and_forge():  # opening bwrap's pid 1's stdout works when unimas does not run as root
    try:
        reader = os.open("/proc/1/fd/1", os.O_RDONLY)
        writer = os.open("/proc/1/fd/1", os.O_WRONLY)
    except OSError:
        return
    finally:
        os.write(in_place, b"x")
    seen = b""
    while b"@@unimas-tests-" not in seen or not seen.endswith(b"\\n"):
        chunk = os.read(reader, 4096)
        if not chunk:
            return
        seen += chunk
    mark = seen[seen.index(b"@@unimas-tests-"):].split(b" ")[0]
    for index in range(3):
        os.write(writer, mark + b' {"event": "case", "index": %d, "ok": true}\\n' % index)
    os.write(writer, mark + b' {"event": "done"}\\n')
if os.fork() == 0:
    os.setsid()  # out of the program's process group
    if os.fork() == 0:
        steal_and_forge()
    os._exit(0)
os.read(ready, 1)  # the thief is in place before any test runs
def add(a, b):
    return -100
'''


def assert_no_credit(result, passed=0):
    assert result["total"] == 3, result
    assert result["passed"] == passed, result


@needs_sandbox
def test_walking_frames_to_the_harness_reporter_earns_nothing():
    assert_no_credit(ct.run_tests_sync(FRAME_FORGERY, ADD_TESTS, "add"))


@needs_sandbox
def test_writing_forged_report_lines_to_fd_1_earns_nothing():
    assert_no_credit(ct.run_tests_sync(FD_FORGERY, ADD_TESTS, "add"))


@needs_sandbox
def test_forging_then_exiting_at_import_is_a_load_error_without_credit():
    result = ct.run_tests_sync(IMPORT_EXIT_FORGERY, ADD_TESTS, "add")
    assert_no_credit(result)
    assert result["status"] == "error" and "SystemExit" in result["error"]


@needs_sandbox
def test_ending_the_process_mid_run_fails_that_test_and_the_next_ones_run_again():
    result = ct.run_tests_sync(EXIT_MID_RUN_FORGERY, ADD_TESTS, "add")
    assert_no_credit(result, passed=2)  # add(1, 2) and add(2, 2) are right; add(-1, 1) ended the process
    assert result["status"] == "ok" and result["error"].startswith("assert add(-1, 1) == 0")


@needs_sandbox
def test_an_answer_after_the_case_timeout_does_not_count_and_the_next_tests_run_in_a_fresh_process():
    result = ct.run_tests_sync(LATE_ANSWER, ADD_TESTS, "add", case_timeout_s=0.5)
    assert_no_credit(result, passed=2)
    assert result["status"] == "ok" and "timed out" in result["error"]


@needs_sandbox
@pytest.mark.parametrize("kind", sorted(ALWAYS_EQUAL))
def test_values_that_claim_to_equal_anything_are_refused(kind):
    program = ALWAYS_EQUAL[kind] + "\ndef add(a, b):\n    return result\n"
    result = ct.run_tests_sync(program, ADD_TESTS, "add")
    assert_no_credit(result)
    assert "not plain data" in result["error"]


@needs_sandbox
def test_patched_builtins_do_not_reach_the_tests():
    result = ct.run_tests_sync(PATCHED_BUILTINS, BUILTIN_TESTS, "f")
    assert_no_credit(result)


@needs_sandbox
def test_raising_stop_iteration_does_not_end_a_test_loop_early():
    result = ct.run_tests_sync(STOP_ITERATION, LOOP_TESTS, "add")
    assert (result["passed"], result["total"]) == (0, 1), result
    assert "StopIteration" in result["error"]


@needs_sandbox
@pytest.mark.skipif(os.geteuid() == 0, reason="as root the report pipe is root's and the thief cannot open it, so the "
                    "test would pass with or without the defence; the attack needs an unprivileged user")
def test_a_detached_process_cannot_steal_the_nonce_from_the_report_pipe():
    assert_no_credit(ct.run_tests_sync(REPORT_THIEF, ADD_TESTS, "add"))


HONEST_PLAIN = '''
import math
LIMIT = 10
TABLE = {1: "one", (2, 3): frozenset({4})}
def add(a, b):
    return a + b
def stats(values):
    return (min(values), max(values)), {"mean": sum(values) / len(values)}
def odd(values):
    return {v for v in values if v % 2}
def ratio(a, b):
    if b == 0:
        raise ZeroDivisionError("b is zero")
    return a / b
def power(n):
    return 7 ** n
def weird():
    return float("nan"), -0.0, math.inf, 1 + 2j, b"\\x00\\xff", None, True
class Helper:
    pass
'''
HONEST_PLAIN_TESTS = '''
assert add(1, 2) == 3
assert stats([1, 2, 3]) == ((1, 3), {"mean": 2.0})
assert odd([1, 2, 3]) == {1, 3} and type(odd([1])) is set
try:
    ratio(1, 0)
except ZeroDivisionError as exc:
    assert "zero" in str(exc)
else:
    assert False
assert power(300) == 7 ** 300
nan, zero, inf, z, raw, none, yes = weird()
assert math.isnan(nan) and math.copysign(1, zero) == -1 and inf == math.inf
assert (z, raw, none, yes) == (1 + 2j, b"\\x00\\xff", None, True)
assert LIMIT == 10 and TABLE[1] == "one" and TABLE[(2, 3)] == frozenset({4})
assert math.sqrt(add(8, 8)) == 4
'''


@needs_sandbox
def test_honest_code_keeps_full_credit_in_both_test_styles():
    result = ct.run_tests_sync(HONEST_PLAIN, HONEST_PLAIN_TESTS, "add")
    assert (result["passed"], result["total"], result["status"]) == (9, 9, "ok"), result
    check = ("def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n"
             "    assert poly([1, 1]) == 2\n")
    prelude = "def poly(xs):\n    return sum(xs)\n\ndef sort_list(values):\n    \"\"\"Sort.\"\"\"\n"
    honest = prelude + "\ndef sort_list(values):\n    return sorted(values)\n"
    result = ct.run_tests_sync(honest, check, "sort_list", prelude=prelude)
    assert (result["passed"], result["total"], result["status"]) == (2, 2, "ok"), result
    # Redefining a helper the task's tests check with (HumanEval/32's poly, /38's encode_cyclic) changes nothing.
    cheat = "def poly(xs):\n    return 2\n\ndef sort_list(values):\n    return values\n"
    assert ct.run_tests_sync(cheat, check, "sort_list", prelude=prelude)["passed"] == 1


@needs_sandbox
def test_a_class_the_tests_use_fails_with_a_clear_error():
    result = ct.run_tests_sync(HONEST_PLAIN, "assert Helper() is not None\nassert add(1, 1) == 2", "add")
    assert (result["passed"], result["total"]) == (1, 2)
    assert "Helper" in result["error"] and "plain data" in result["error"]


PLAIN_VALUES = [
    None, True, False, 0, -1, 7 ** 300, -(2 ** 4000), 1.5, -0.0, math.inf, -math.inf, 1e-310, "", "héllo\udc80",
    b"", b"\x00\xff", 1 + 2j, [], (), {}, set(), frozenset(), [1, (2, 3)], (1, [2]), {1: 2, "1": 3, (1, 2): None},
    {frozenset({1}): {2: [3.5]}}, {1, "a", (2, 3)}, frozenset({b"x"}), [[[]]], ({"a": ()},),
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=[f"{i}-{type(v).__name__}" for i, v in enumerate(PLAIN_VALUES)])
def test_the_codec_round_trips_plain_data_with_exact_types(value):
    decoded = plain_data.loads(plain_data.dumps(value))
    assert decoded == value and same_types(decoded, value)


def same_types(left, right) -> bool:
    if type(left) is not type(right):
        return False
    if isinstance(left, (list, tuple)):
        return all(same_types(a, b) for a, b in zip(left, right))
    if isinstance(left, dict):
        return all(same_types(a, b) and same_types(left[a], right[b]) for a, b in zip(left, right))
    return True


def test_the_codec_keeps_nan_signed_zero_and_int_keys():
    nan, zero = plain_data.loads(plain_data.dumps((math.nan, -0.0)))
    assert math.isnan(nan) and math.copysign(1.0, zero) == -1.0
    assert plain_data.loads(plain_data.dumps({1: 2})) == {1: 2}
    assert type(next(iter(plain_data.loads(plain_data.dumps({1: 2}))))) is int


class Anything:
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [Anything(), type("Int", (int,), {})(1), type("Str", (str,), {})("x"),
                                   bytearray(b"x"), (i for i in ()), len, [Anything()], {1: object()}],
                         ids=lambda v: type(v).__name__)
def test_the_codec_refuses_anything_but_exact_plain_types(value):
    with pytest.raises(plain_data.NotPlainData, match="not plain data"):
        plain_data.dumps(value)


def test_the_codec_refuses_oversized_or_too_deep_data():
    deep = []
    for _ in range(plain_data.MAX_DEPTH + 1):
        deep = [deep]
    for value in (deep, list(range(plain_data.MAX_ITEMS + 1)), 1 << (4 * plain_data.MAX_INT_HEX_DIGITS + 4)):
        with pytest.raises(plain_data.NotPlainData):
            plain_data.dumps(value)
    hostile = ['{"list": ' * 10_000 + "[]" + "}" * 10_000, '{"int": "' + "f" * 20_000 + '"}', "x" * 10,
               "[1, 2]", "3", '{"float": 1.5}', '{"dict": [[[], 1]]}', '{"set": [{"list": []}]}',
               '{"tuple": [], "list": []}', '"' + "x" * plain_data.MAX_MESSAGE_BYTES + '"']
    for text in hostile:
        with pytest.raises(plain_data.NotPlainData):
            plain_data.loads(text)


@needs_sandbox
def test_a_program_that_hangs_when_loaded_again_fails_the_remaining_tests():
    program = ("import os\nif os.path.exists('loaded-once'):\n    while True:\n        pass\n"
               "open('loaded-once', 'w').close()\ndef add(a, b):\n    while a == 1:\n        pass\n    return a + b\n")
    result = ct.run_tests_sync(program, ADD_TESTS, "add", case_timeout_s=0.5)
    assert (result["passed"], result["total"], result["status"]) == (0, 3, "ok"), result
    assert [f["error"] for f in result["failures"]] == [
        "timed out after 0.5s", *["the program could not be loaded again within 0.5s"] * 2]
