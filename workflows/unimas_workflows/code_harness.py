"""The code team's test harness: the verdict comes from a process the graded program never runs in.

This file runs only inside the sandbox (:func:`unimas.sandbox.runner.run_python`), as ``main.py`` next to a
copy of ``plain_data.py``; :mod:`unimas_workflows.code_team` sends it as text and never imports it.

Why two processes. A program graded in the process that writes the report can forge the report: walk the
stack to the reporter (``sys._getframe``), find the nonce and write lines to fd 1, return an object whose
``__eq__`` always says yes, patch or shadow the builtins the tests use, answer after the per-test timer fired,
raise ``StopIteration`` to end a test's loop early. An RL policy finds such tricks. So:

* The **judge** (this process, ``python main.py``) holds the nonce and the report and never runs the
  program. It makes itself non-dumpable first (``PR_SET_DUMPABLE`` 0), so a process of the same uid cannot
  read or write its memory (``/proc/PID/mem``, ``ptrace``) nor open its file descriptors through ``/proc``,
  and drops its own directory (writable by the program) from ``sys.path``.
* The **program's process** is a fresh interpreter (``subprocess`` fork+exec of ``main.py
  --serve-candidate``; the judge's memory is never forked into running code), given only the prelude and the
  program over a pipe. It runs them, lists what they define (functions; plain-data globals by value;
  modules by name; anything else by its type), then answers "call NAME with ARGS" with the return value or
  the exception's type name and text. Its stdout is redirected to stderr; it talks on a duplicate of the pipe.
* Values cross as tagged JSON (:mod:`plain_data`): only exact builtin types, bounded in size and depth, and
  rebuilt by the judge, so the tests compare real ``int``/``str``/``list`` values. A return value of any
  other type (a custom object, a subclass, a generator, a function) fails that test ("returned a X, not
  plain data"). Arguments are copied too, so a test cannot see the program mutate them in place.
* The judge runs the prelude and the tests (task data, not model output) in its own namespace, where
  ``candidate`` (HumanEval's ``check(candidate)``) and the program's top-level functions are proxies into
  the program's process and its plain-data globals are copies (taken once, after loading). What the prelude
  implements stays the task's (a program cannot redefine a helper the tests check with, e.g. HumanEval/32's
  ``poly``); what it only declares (a signature with a docstring, ``pass`` or ``...``) and the entry point are
  the program's. A program's name does not shadow a builtin the tests use (``abs``, ``len``), unless it is
  the entry point. Other names the tests use (the program's classes, objects, non-stdlib modules) make that
  test fail with an error that says so. Exceptions come back as the builtin exception of the same name
  (``except ValueError`` in a test still works), except ``StopIteration``-like ones, which could end a test's
  loop early; any other type is a ``ProgramError`` that names it.
* Each test runs under the judge's ``SIGALRM`` timer (``case_timeout_s``). When it fires during a call, or
  the program's process dies (``os._exit``, a crash, memory), that test fails and a fresh process (prelude +
  program loaded again, under the same timer) serves the next tests; if it cannot be loaded again, the
  remaining tests fail.
* The report is kept in memory and written only at the end, after every other process in the sandbox is
  killed: the sandbox's init (bubblewrap's pid 1) holds the stdout pipe, and when unimas does not run as
  root a process of the sandbox can open it through ``/proc/1/fd/1``, read the nonce from a report line and
  write forged ones. In the sandbox's own pid namespace ``kill(-1, SIGKILL)`` reaches every process but init
  and the judge; the judge checks ``/proc`` until no other one is alive, then reports. Without that
  namespace (the ``allow_fallback`` mode) only the program's process group is killed: a process that left it
  could still forge. To report before the sandbox's wall clock ends the run, the judge stops testing
  ``min(1 s, 20 %)`` of ``timeout_s`` early, reports what ran, then waits for the wall clock, so the status
  stays ``timeout`` as before.

Input: JSON on stdin ``{nonce, prelude, code, tests, entry_point, case_timeout_s, timeout_s, isolated}``.
Output: lines ``<nonce> {json}`` on stdout: ``total`` (counted before the program loads), ``loaded`` or
``load_error``, one ``case`` per test, ``setup_error`` for a failing setup statement, ``done``.
"""

import ast
import builtins
import ctypes
import importlib
import json
import os
import signal
import subprocess
import sys
import time

import plain_data

SERVE_FLAG = "--serve-candidate"
PR_SET_DUMPABLE = 4
RESERVE_FRACTION, MAX_RESERVE_S = 0.2, 1.0
REPLAYED_EXCEPTIONS = {name for name, value in vars(builtins).items()
                       if isinstance(value, type) and issubclass(value, Exception)
                       and not issubclass(value, (StopIteration, StopAsyncIteration))}
"""Builtin exceptions a program's exception is raised again as, by name: a test may catch them."""


# ---------------------------------------------------------------- the program's process


def serve_candidate() -> None:
    """Load the prelude and the program, reply with what they define, then answer calls until stdin ends."""
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.stdin, sys.stdout = open(os.devnull), sys.stderr  # noqa: SIM115 - lives as long as the process

    def reply(message: dict) -> None:
        try:
            replies.write(plain_data.dumps(message).encode() + b"\n")
            replies.flush()
        except BaseException:  # e.g. the program lowered the recursion limit: the judge sees the process end
            os._exit(70)

    setup = plain_data.loads(requests.readline())
    namespace = {"__name__": "__candidate__"}
    try:
        if setup["prelude"]:
            exec(compile(setup["prelude"], "<prelude>", "exec"), namespace)
        exec(compile(setup["code"], "<candidate>", "exec"), namespace)
    except BaseException as exc:
        reply({"error": exception_text(exc)})
        return
    reply({"names": definitions(namespace)})
    for line in requests:
        request = plain_data.loads(line)
        reply(answer(namespace, request["call"], request["args"], request["kwargs"]))


def exception_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:
        text = "(its text could not be read)"
    return (type(exc).__name__ + (": " + text if text else ""))[:300]


def definitions(namespace: dict) -> dict:
    """What the program defines, for the judge: ``(kind,)`` or ``(kind, detail)`` per top-level name."""
    names = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        try:
            if type(value) is type(sys):
                names[name] = ("module", str(value.__name__))
            elif isinstance(value, type):
                names[name] = ("other", "class")
            elif callable(value):
                names[name] = ("function",)
            else:
                plain_data.dumps(value)
                names[name] = ("value", value)
        except BaseException:
            names[name] = ("other", type(value).__name__)
    try:
        plain_data.dumps(names)
    except plain_data.NotPlainData:  # too much in all: the values stay behind
        names = {name: entry if entry[0] != "value" else ("other", "value too large to copy")
                 for name, entry in names.items()}
    return names


def answer(namespace: dict, name: str, args: tuple, kwargs: dict) -> dict:
    try:
        result = namespace[name](*args, **kwargs)
    except BaseException as exc:
        try:
            return {"raised": type(exc).__name__[:100], "message": exception_text(exc)}
        except BaseException:
            return {"raised": "BaseException", "message": ""}
    try:
        plain_data.dumps(result)
    except BaseException as exc:
        what = type(result).__name__[:100]
        if type(result) in (list, tuple, dict, set, frozenset):
            return {"refused": f"returned a {what} that is not plain data: {exception_text(exc)}"}
        return {"refused": f"returned a {what}, not plain data"}
    return {"returned": result}


# ---------------------------------------------------------------- the judge


class CaseTimeout(BaseException):
    """A test, or the program's reloading, ran past ``case_timeout_s``."""


class OutOfTime(BaseException):
    """The run's own deadline: stop testing and report while the sandbox still reads stdout."""


class ProgramError(Exception):
    """An exception of the program that is not raised again as itself (its type name leads the text)."""


class ProgramGone(Exception):
    """The program's process ended, or broke the protocol, or could not be started."""


class Alarm:
    """``SIGALRM`` for two deadlines: the current test's (``arm``) and the whole run's.

    A signal while disarmed, or before a deadline (another process may send one), is ignored.
    """

    def __init__(self, run_deadline: float):
        self.run_deadline = run_deadline
        self.case_deadline = None
        self.armed = False
        signal.signal(signal.SIGALRM, self.ring)

    def arm(self, seconds) -> None:
        """Until ``seconds`` from now (None: no limit of its own) or the run's deadline, whichever is first."""
        now = time.monotonic()
        if now >= self.run_deadline:
            raise OutOfTime()
        self.case_deadline = None if seconds is None else now + seconds
        self.armed = True
        self.restart_timer(now)

    def disarm(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)

    def restart_timer(self, now: float) -> None:
        ends = self.run_deadline if self.case_deadline is None else min(self.case_deadline, self.run_deadline)
        signal.setitimer(signal.ITIMER_REAL, max(ends - now, 0.001))

    def ring(self, signum, frame) -> None:
        if not self.armed:
            return
        now = time.monotonic() + 0.001
        if now >= self.run_deadline:
            signal.setitimer(signal.ITIMER_REAL, 0.05)  # again, should a test swallow the exception
            raise OutOfTime()
        if self.case_deadline is not None and now >= self.case_deadline:
            self.armed = False
            raise CaseTimeout()
        self.restart_timer(now)


class Program:
    """The program's process, seen from the judge: started fresh, loaded, then called by name."""

    def __init__(self, script: str, prelude: str, code: str):
        self.command = [sys.executable, "-E", "-s", "-B", script, SERVE_FLAG]
        self.workdir = os.path.dirname(script)
        self.setup = {"prelude": prelude, "code": code}
        self.process = None
        self.busy = False

    def start(self) -> dict:
        """Start and load a fresh process: what the program defines; :class:`ProgramGone` when it cannot."""
        self.stop()
        try:
            self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            cwd=self.workdir, close_fds=True, start_new_session=True)
        except OSError as exc:
            raise ProgramGone(f"could not start the program's process: {exc}") from None
        self.busy = True
        try:
            self.send(self.setup)
        except plain_data.NotPlainData as exc:
            self.stop()
            raise ProgramGone(f"the program cannot be sent to its process: {exc}") from None
        message = self.receive("while loading")
        self.busy = False
        if set(message) == {"error"} and type(message["error"]) is str:
            self.stop()
            raise ProgramGone(message["error"])
        names = message.get("names") if set(message) == {"names"} else None
        if type(names) is not dict or not all(valid_entry(name, entry) for name, entry in names.items()):
            self.stop()
            raise ProgramGone("the program's process broke the protocol while loading")
        return names

    def call(self, name: str, args: tuple, kwargs: dict):
        if self.process is None:
            raise ProgramGone("the program's process is not running")
        self.busy = True
        try:
            self.send({"call": name, "args": args, "kwargs": kwargs})
        except plain_data.NotPlainData as exc:
            self.busy = False
            raise TypeError(f"the tests passed {name}() a value that is not plain data: {exc}") from None
        message = self.receive(f"during {name}()")
        self.busy = False
        if set(message) == {"returned"}:
            return message["returned"]
        if set(message) == {"raised", "message"} and type(message["raised"]) is str:
            raise replayed(message["raised"], str(message["message"]))
        if set(message) == {"refused"}:
            raise ProgramError(f"{name}() {message['refused']}"[:300])
        self.stop()
        raise ProgramGone(f"the program's process broke the protocol during {name}()")

    def send(self, message: dict) -> None:
        line = plain_data.dumps(message).encode() + b"\n"
        try:
            self.process.stdin.write(line)
            self.process.stdin.flush()
        except OSError:  # BrokenPipeError: the process is gone; receive() says how it ended
            pass

    def receive(self, when: str) -> dict:
        line = self.process.stdout.readline(plain_data.MAX_MESSAGE_BYTES + 1)
        if len(line) > plain_data.MAX_MESSAGE_BYTES:
            self.stop()
            raise ProgramGone(f"the program's process sent more than {plain_data.MAX_MESSAGE_BYTES} bytes {when}")
        if not line.endswith(b"\n"):  # its stdout ended: so did the process, or it will soon
            ended = self.process.wait()
            self.stop()
            how = f"killed by signal {-ended}" if ended < 0 else f"exit code {ended}"
            raise ProgramGone(f"the program's process ended {when} ({how})")
        try:
            message = plain_data.loads(line)
        except plain_data.NotPlainData as exc:
            self.stop()
            raise ProgramGone(f"the program's process sent a message that is not plain data: {exc}") from None
        if type(message) is not dict:
            self.stop()
            raise ProgramGone(f"the program's process broke the protocol {when}")
        return message

    def stop(self) -> None:
        """Kill the process and its process group (a descendant that left the group is ``finish``'s)."""
        if self.process is None:
            return
        for kill in (lambda: os.killpg(self.process.pid, signal.SIGKILL), self.process.kill):
            try:
                kill()
            except OSError:
                pass
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.process, self.busy = None, False


def valid_entry(name, entry) -> bool:
    if type(name) is not str or not name.isidentifier() or type(entry) is not tuple or not entry:
        return False
    shapes = {"function": 1, "value": 2, "module": 2, "other": 2}
    return shapes.get(entry[0]) == len(entry) and (entry[0] == "value" or all(type(e) is str for e in entry))


def replayed(type_name: str, text: str) -> Exception:
    """The program's exception in the judge: the builtin of that name when there is one, else a ProgramError."""
    if type_name in REPLAYED_EXCEPTIONS:
        message = text.partition(": ")[2]
        try:
            return getattr(builtins, type_name)(*([message] if message else []))
        except Exception:  # e.g. UnicodeDecodeError wants five arguments
            pass
    return ProgramError(f"{text} (raised by the program)")


def proxy(program: Program, name: str):
    def call_program(*args, **kwargs):
        return program.call(name, args, kwargs)

    call_program.__name__ = call_program.__qualname__ = name
    return call_program


def declared_only(prelude: str) -> set:
    """Functions the prelude declares without implementing (the body is a docstring, ``pass`` or ``...``)."""
    declared = set()
    for node in ast.parse(prelude, "<prelude>").body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            placeholder = all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                          and (isinstance(s.value.value, str) or s.value.value is ...))
                              for s in node.body)
            (declared.add if placeholder else declared.discard)(node.name)
    return declared


def stdlib_module(name: str):
    """The judge's own import of a standard-library module the program imported (its directory is off sys.path)."""
    if name.partition(".")[0] not in sys.stdlib_module_names:
        return None
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def bind_program(namespace: dict, program: Program, names: dict, prelude: str, entry_point: str) -> dict:
    """Put the program's definitions into the tests' namespace; returns the names the tests cannot use."""
    kept = {name for name in namespace if not name.startswith("__")} - declared_only(prelude) - {entry_point}
    unusable = {}
    for name, entry in names.items():
        if name.startswith("__") or name in kept or (hasattr(builtins, name) and name != entry_point):
            continue
        kind = entry[0]
        module = stdlib_module(entry[1]) if kind == "module" else None
        if kind == "function":
            namespace[name] = proxy(program, name)
        elif kind == "value":
            namespace[name] = entry[1]
        elif module is not None:
            namespace[name] = module
        else:
            namespace.pop(name, None)
            unusable[name] = f"a {entry[1][:60]}" if kind == "other" else f"the module {entry[1][:60]}"
    return unusable


def is_case(node) -> bool:
    if isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant):
        return False
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def test_steps(tests: str):
    """The statements to run in order, and whether the tests are HumanEval's ``check(candidate)``."""
    check, setup = None, []
    for node in ast.parse(tests, "<tests>").body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "check":
            check = node
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Name) and node.value.func.id == "check"):
            continue  # a trailing check(f) call: the harness calls it
        else:
            setup.append(node)
    return (setup + list(check.body) if check is not None else setup), check is not None


class Judge:
    """Runs the tests against a :class:`Program` and keeps the report until every other process is gone."""

    def __init__(self, payload: dict, script: str, started: float):
        self.payload = payload
        self.events = []
        self.unusable = {}
        self.case_timeout_s = float(payload["case_timeout_s"])
        timeout_s = float(payload["timeout_s"])
        self.alarm = Alarm(started + timeout_s - min(MAX_RESERVE_S, RESERVE_FRACTION * timeout_s))
        self.program = Program(script, payload["prelude"], payload["code"])

    def emit(self, **event) -> None:
        self.events.append(event)

    def describe(self, exc: BaseException) -> str:
        if isinstance(exc, CaseTimeout):
            return "timed out after %gs" % self.case_timeout_s
        if isinstance(exc, (ProgramError, ProgramGone)):
            return str(exc)[:300]
        if isinstance(exc, NameError) and getattr(exc, "name", None) in self.unusable:
            return (f"NameError: {exc.name!r} is {self.unusable[exc.name]} of the program: the tests run in "
                    "another process and can use only its functions and plain data")[:300]
        return exception_text(exc)

    def run(self) -> None:
        payload = self.payload
        steps, check_style = test_steps(payload["tests"])
        self.emit(event="total", total=sum(1 for node in steps if is_case(node)))
        namespace = {"__name__": "__tests__"}
        try:
            self.alarm.arm(None)
            if payload["prelude"]:
                exec(compile(payload["prelude"], "<prelude>", "exec"), namespace)
            names = self.program.start()
        except OutOfTime:
            raise
        except BaseException as exc:
            self.emit(event="load_error", error=self.describe(exc))
            return
        finally:
            self.alarm.disarm()
        entry_point = payload["entry_point"]
        if check_style:
            if names.get(entry_point, ("missing",))[0] != "function":
                self.emit(event="load_error", error="the code defines no %r" % entry_point)
                return
            namespace["candidate"] = proxy(self.program, entry_point)
        self.unusable = bind_program(namespace, self.program, names, payload["prelude"], entry_point)
        self.emit(event="loaded")
        self.run_steps(steps, namespace)
        self.emit(event="done")

    def run_steps(self, steps: list, namespace: dict) -> None:
        index, lost = 0, None
        for node in steps:
            case = is_case(node)
            if lost is None and self.program.process is None:
                lost = self.restart()
            error = lost
            if lost is None:
                code = compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])), "<tests>", "exec")
                try:
                    self.alarm.arm(self.case_timeout_s)
                    exec(code, namespace)
                except OutOfTime:
                    raise
                except BaseException as exc:
                    error = self.describe(exc)
                finally:
                    self.alarm.disarm()
                if self.program.busy:  # interrupted mid-call: its reply would answer the next call
                    self.program.stop()
            if case:
                source = ast.get_source_segment(self.payload["tests"], node) or ""
                self.emit(event="case", index=index, ok=error is None, error=error, source=source[:300])
                index += 1
            elif error is not None:
                self.emit(event="setup_error", error=error)

    def restart(self):
        """Load a fresh program's process after the last one died or was stopped; why not, or None."""
        try:
            self.alarm.arm(self.case_timeout_s)
            self.program.start()
            return None
        except CaseTimeout:
            self.program.stop()
            return "the program could not be loaded again within %gs" % self.case_timeout_s
        except ProgramGone as exc:
            return f"the program could not be loaded again: {exc}"[:300]
        finally:
            self.alarm.disarm()

    def finish(self, isolated: bool) -> bool:
        """Kill the program's processes; True when none is left that could read or forge the report."""
        self.program.stop()
        if not isolated:
            return True
        for _ in range(200):
            try:
                os.kill(-1, signal.SIGKILL)  # in the sandbox's pid namespace: all but its init and the judge
            except OSError:  # ProcessLookupError: none left to signal
                pass
            if not others_alive():
                return True
            time.sleep(0.01)
        return False

    def write_report(self, mark: str) -> None:
        channel = sys.__stdout__
        for event in self.events:
            channel.write(mark + " " + json.dumps(event) + "\n")
        channel.flush()


def others_alive() -> bool:
    """Whether a process other than the namespace's init and this one is alive (zombies are not)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, os.getpid()):
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                state = stat.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            return True
    return False


def judge() -> None:
    started = time.monotonic()
    script = os.path.abspath(sys.argv[0])
    sys.path[:] = [entry for entry in sys.path if entry not in ("", os.path.dirname(script))]
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SystemExit("the test harness could not protect its memory (prctl PR_SET_DUMPABLE failed)")
    payload = json.loads(sys.stdin.read())
    mark = payload.pop("nonce")
    sys.stdout = sys.stderr  # a print in the tests or the prelude is not a report line
    isolated = bool(payload["isolated"]) and os.getppid() == 1
    tests = Judge(payload, script, started)
    out_of_time = False
    try:
        tests.run()
    except OutOfTime:
        out_of_time = True
    finally:
        tests.alarm.disarm()
    if not tests.finish(isolated):
        raise SystemExit("could not stop the program's processes: no report, it could be read and forged")
    tests.write_report(mark)
    while out_of_time:  # the sandbox's wall clock ends the run: its status stays "timeout"
        time.sleep(60)


if __name__ == "__main__":
    if sys.argv[1:] == [SERVE_FLAG]:
        serve_candidate()
    else:
        judge()
