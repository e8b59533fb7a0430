"""The code sandbox: each attack of issue 13 item 4 is stopped and reported with the right status."""

import asyncio
import contextlib
import json
import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

import pytest

from unimas.errors import UserError
from unimas.sandbox import runner as sandbox
from unimas.sandbox.runner import SandboxLimits, run_python

needs_bwrap = pytest.mark.skipif(not sandbox.available(), reason=f"sandbox unavailable: {sandbox.unavailable_reason()}")
QUICK = SandboxLimits(timeout_s=5.0)


def test_refused_when_unavailable(monkeypatch):
    monkeypatch.setattr(sandbox, "available", lambda: False)
    result = run_python("print(1)")
    assert result.status == "refused" and result.exit_code is None and result.stdout == ""
    assert "apt-get install bubblewrap" in result.stderr and "allow_fallback" in result.stderr
    with pytest.raises(UserError, match="bubblewrap"):
        sandbox.require_available(allow_fallback=False)
    assert set(result.to_json()) >= {"status", "exit_code", "stdout", "stderr", "duration_s"}


def test_oversized_input_and_bad_file_names_are_refused():
    assert run_python("x = 1\n" * 300_000).status == "refused"
    assert run_python("print(1)", files={"../escape.py": ""}).status == "refused"
    assert run_python("print(1)", files={"/etc/passwd": ""}).status == "refused"


def test_limits_are_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)


@needs_bwrap
def test_correct_code_passes_with_stdin_and_files():
    result = run_python("import helper\nprint(helper.twice(int(input())))", stdin="21\n", limits=QUICK,
                        files={"helper.py": "def twice(x):\n    return 2 * x\n"})
    assert (result.status, result.exit_code, result.stdout, result.stderr) == ("ok", 0, "42\n", "")
    assert 0 < result.duration_s < 5 and result.notes == []


@needs_bwrap
def test_exception_is_an_error():
    result = run_python("raise ValueError('boom')", limits=QUICK)
    assert result.status == "error" and result.exit_code == 1 and "ValueError: boom" in result.stderr


@needs_bwrap
def test_infinite_loop_times_out():
    # a CPU limit above the wall clock, so that the wall clock is what stops it (not a race between the two)
    result = run_python("while True:\n    pass", limits=SandboxLimits(timeout_s=1.0, cpu_s=5))
    assert result.status == "timeout" and result.exit_code is None
    assert 1.0 <= result.duration_s < 3.0


@needs_bwrap
def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock():
    result = run_python("while True:\n    pass", limits=SandboxLimits(timeout_s=10.0, cpu_s=1))
    assert result.status == "timeout" and result.duration_s < 5.0
    assert any("CPU limit" in note for note in result.notes)


@needs_bwrap
def test_memory_bomb_is_reported_as_memory():
    result = run_python("block = bytearray(4 << 30)\nprint('allocated')", limits=QUICK)
    assert result.status == "memory" and "allocated" not in result.stdout and "MemoryError" in result.stderr


def _processes_running(marker: str) -> int:
    found = 0
    for entry in os.listdir("/proc"):
        try:
            found += entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            pass
    return found


@pytest.mark.slow
@needs_bwrap
def test_fork_bomb_is_stopped_and_leaves_no_processes():
    marker = f"bomb_{uuid.uuid4().hex}"
    # Children that fail to fork sleep instead of exiting, so only the kill of the whole sandbox ends them;
    # main.py execs the bomb under a unique file name so that its processes can be counted from here.
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(60)\n"
    main = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-B', '{marker}.py'])\n"
    result = run_python(main, files={f"{marker}.py": bomb}, limits=SandboxLimits(timeout_s=2.0, max_processes=32))
    assert result.status == "timeout" and result.duration_s < 5.0
    assert _processes_running(marker) == 0
    plain = run_python("import os\nwhile True:\n    os.fork()", limits=SandboxLimits(timeout_s=5.0))
    assert plain.status == "error" and "Resource temporarily unavailable" in plain.stderr


@needs_bwrap
def test_no_network_even_to_loopback():
    code = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 80), timeout=2)\n"
            "except OSError as exc:\n    raise SystemExit(f'network: {exc}')\n")
    result = run_python(code, limits=QUICK)
    assert result.status == "error" and "network:" in result.stderr
    assert "refused" in result.stderr or "unreachable" in result.stderr
    interfaces = run_python("import socket\nprint(sorted(n for _, n in socket.if_nameindex()))", limits=QUICK)
    assert interfaces.stdout.strip() == "['lo']"  # a fresh network namespace: no route anywhere


@needs_bwrap
@pytest.mark.parametrize("target", ["/etc/unimas-sandbox-test", str(Path.cwd() / "unimas-sandbox-test"),
                                    str(Path.home() / "unimas-sandbox-test")])
def test_writes_outside_the_working_directory_fail(target):
    result = run_python(f"open({target!r}, 'w').write('x')\n", limits=QUICK)
    assert result.status == "error"
    # read-only root, or a path the sandbox's private /tmp does not even have (a checkout under /tmp)
    assert any(reason in result.stderr for reason in ("Read-only file system", "Permission denied",
                                                      "No such file or directory"))
    assert not Path(target).exists()


@needs_bwrap
def test_working_directory_is_writable_and_thrown_away():
    code = "open('out.txt', 'w').write('data')\nimport os\nprint(os.getcwd(), sorted(os.listdir('.')))"
    result = run_python(code, limits=QUICK)
    assert result.status == "ok" and result.stdout.strip() == f"{sandbox.WORKDIR} ['main.py', 'out.txt']"


@needs_bwrap
def test_environment_secrets_do_not_leak(monkeypatch):
    monkeypatch.setenv("UNIMAS_TEST_SECRET", "s3cret")
    result = run_python("import os\nprint(os.environ.get('UNIMAS_TEST_SECRET'))\nprint(dict(os.environ))",
                        limits=QUICK)
    assert result.status == "ok" and result.stdout.splitlines()[0] == "None"
    assert "s3cret" not in result.stdout


@needs_bwrap
def test_huge_output_is_truncated_with_a_note():
    limits = SandboxLimits(timeout_s=5.0, max_output_bytes=4096)
    result = run_python("import sys\nsys.stdout.write('x' * 10_000_000)\nsys.stderr.write('e' * 10_000)",
                        limits=limits)
    assert result.status == "ok"
    kept, note = result.stdout.split("\n[", 1)
    assert kept == "x" * 4096 and note.startswith("unimas sandbox: stdout truncated")
    assert "truncated" in result.stdout and "truncated" in result.stderr
    assert any("stdout truncated to 4096 of 10000000 bytes" in note for note in result.notes)


@needs_bwrap
def test_file_size_limit():
    result = run_python("open('big.bin', 'wb').write(b'0' * (100 << 20))", limits=QUICK)
    assert result.status == "error" and "File too large" in result.stderr


@needs_bwrap
def test_tool_plugin_returns_json():
    from unimas_plugins.sandbox import run_python_tool, unimas_tools

    assert unimas_tools()["run_python"] is run_python_tool
    result = asyncio.run(run_python_tool(code="print(input() * 2)", stdin="ab", timeout_s=5))
    assert json.loads(json.dumps(result))["stdout"] == "abab\n" and result["status"] == "ok"


@needs_bwrap
def test_cli_prints_one_json_object(tmp_path, capsys):
    from unimas.cli import main

    program = tmp_path / "prog.py"
    program.write_text("print(input().upper())\n")
    (tmp_path / "in.txt").write_text("hello\n")
    assert main(["sandbox", str(program), "--stdin", str(tmp_path / "in.txt"), "--timeout", "5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert set(data) >= {"status", "exit_code", "stdout", "stderr", "duration_s"}
    assert (data["status"], data["stdout"]) == ("ok", "HELLO\n")


def test_cli_exit_codes(tmp_path, capsys):
    from unimas.cli import main

    assert main(["sandbox", str(tmp_path / "missing.py")]) == 2
    assert "missing.py" in capsys.readouterr().err
    if sandbox.available():
        (tmp_path / "fail.py").write_text("raise SystemExit(3)\n")
        assert main(["sandbox", str(tmp_path / "fail.py"), "--timeout", "5"]) == 1
        data = json.loads(capsys.readouterr().out)
        assert (data["status"], data["exit_code"]) == ("error", 3)


# ---------------------------------------------------------------- host Unix sockets (issue 21 item 6)

_TRY_SOCKETS = """
import errno, json, os, socket, stat
targets = json.loads(input())
def attempt(kind, address, send=False):
    try:
        if kind == "pair":
            sock, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        else:
            sock = socket.socket(socket.AF_UNIX, kind)
        sock.settimeout(2)
        if send:
            sock.sendto(b"x", address)
            return "sent"
        sock.connect(address)
        return "connected"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
stream, datagram = targets["stream"], targets["datagram"]
print(json.dumps({
    "visible": not stream.startswith("\\0") and os.path.exists(stream) and stat.S_ISSOCK(os.stat(stream).st_mode),
    "stream": attempt(socket.SOCK_STREAM, stream),
    "datagram": attempt(socket.SOCK_DGRAM, datagram),
    "sendto": attempt(socket.SOCK_DGRAM, datagram, send=True),
    "pair_sendto": attempt("pair", datagram, send=True),
}))
"""


def _host_sockets(where: str, stack) -> dict[str, str]:
    """A listening stream socket and a bound datagram socket of the host at ``where``: their addresses."""
    if where == "abstract":
        base = f"\0unimas-sandbox-test-{uuid.uuid4().hex}"
        addresses = {"stream": base + "-stream", "datagram": base + "-dgram"}
    else:
        directory = tempfile.mkdtemp(prefix="unimas-sandbox-sock-", dir=where)
        stack.callback(shutil.rmtree, directory, True)
        os.chmod(directory, 0o755)  # searchable by the sandbox user, so only the filter can stop a connect
        addresses = {"stream": f"{directory}/stream.sock", "datagram": f"{directory}/dgram.sock"}
    for kind, key in ((socket.SOCK_STREAM, "stream"), (socket.SOCK_DGRAM, "datagram")):
        server = stack.enter_context(socket.socket(socket.AF_UNIX, kind))
        server.bind(addresses[key])
        if where != "abstract":
            os.chmod(addresses[key], 0o777)  # writable for everyone: connect() needs nothing more
        if kind == socket.SOCK_STREAM:
            server.listen()
        server.setblocking(False)
        addresses[key + "_server"] = server
    return addresses


@needs_bwrap
@pytest.mark.parametrize("where", ["/var/tmp", "/run", "host-tmp", "abstract"])
def test_no_unix_socket_of_the_host_is_reachable(where, tmp_path):
    """Stream connect, datagram connect and sendto (also through an unnamed socket pair) all fail with EPERM
    and the host side never sees a connection or a datagram; /var/tmp is visible in the sandbox, so there the
    seccomp filter alone is what stops them."""
    if where == "/run" and not os.access("/run", os.W_OK):
        pytest.skip("/run is not writable by this user")
    # the host's own temp dir (short: an AF_UNIX path has at most 107 bytes, and xdist's tmp_path is long)
    location = tempfile.gettempdir() if where == "host-tmp" else where
    with contextlib.ExitStack() as stack:
        host = _host_sockets(location, stack)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:  # the host itself can connect: a real target
            probe.connect(host["stream"])
            host["stream_server"].setblocking(True)
            host["stream_server"].accept()[0].close()
            host["stream_server"].setblocking(False)
        result = run_python(_TRY_SOCKETS, stdin=json.dumps({"stream": host["stream"], "datagram": host["datagram"]}),
                            limits=QUICK)
        assert result.status == "ok", result.stderr
        seen = json.loads(result.stdout)
        assert {seen[k] for k in ("stream", "datagram", "sendto", "pair_sendto")} == {"EPERM"}, seen
        assert seen["visible"] is (where == "/var/tmp")
        with pytest.raises(BlockingIOError):
            host["stream_server"].accept()
        with pytest.raises(BlockingIOError):
            host["datagram_server"].recv(16)


@needs_bwrap
def test_stream_socket_pairs_and_asyncio_still_work():
    code = ("import asyncio, multiprocessing, socket\na, b = socket.socketpair()\na.sendall(b'hi')\n"
            "print(b.recv(2).decode(), asyncio.run(asyncio.sleep(0, 'loop')))\n"
            "left, right = multiprocessing.Pipe()\nleft.send(7)\nprint(right.recv())\n")
    result = run_python(code, limits=QUICK)
    assert (result.status, result.stdout) == ("ok", "hi loop\n7\n"), result.stderr


def test_without_libseccomp_the_sandbox_is_unavailable(monkeypatch):
    from unimas.sandbox import seccomp as sandbox_seccomp

    why = "libseccomp is not installed (test)"
    monkeypatch.setattr(sandbox_seccomp, "program", lambda: (None, why))
    monkeypatch.setattr(sandbox, "_probes", {})
    if not sandbox.shutil.which("bwrap"):
        pytest.skip("bwrap missing: the libseccomp check comes after it")
    assert not sandbox.available() and sandbox.unavailable_reason() == why
    result = run_python("print(1)")
    assert result.status == "refused" and why in result.stderr and result.stdout == ""
    with pytest.raises(UserError, match="libseccomp"):
        sandbox.require_available()


def test_the_fallback_says_it_reaches_host_sockets(monkeypatch, tmp_path):
    """The fallback promises no socket isolation: its note says so, and a host socket is indeed reachable."""
    monkeypatch.setattr(sandbox, "available", lambda: False)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        directory = tempfile.mkdtemp(prefix="unimas-fallback-sock-", dir="/var/tmp")
        try:
            os.chmod(directory, 0o755)
            path = f"{directory}/s.sock"
            server.bind(path)
            os.chmod(path, 0o777)
            server.listen()
            code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\nprint('connected')\n"
            result = run_python(code, limits=QUICK, allow_fallback=True)
        finally:
            shutil.rmtree(directory, True)
    assert result.notes and "host's Unix sockets" in result.notes[0]
    assert result.status == "ok" and result.stdout == "connected\n", result.stderr
