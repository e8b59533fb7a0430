"""Run untrusted Python (model-written code, task checkers) in a bubblewrap sandbox.

The isolation comes from bubblewrap (``bwrap``, the Debian/Ubuntu package
``bubblewrap``), not from Python-level restrictions:

* new user, pid, network, ipc and uts namespaces (``--unshare-all``): no
  network at all, the code sees only its own processes, and it runs as an
  unprivileged uid (when unimas runs as root, the sandbox is started as
  ``nobody`` so that the kernel's process-count limit applies);
* no Unix socket of the host: a seccomp filter (:mod:`unimas.sandbox.seccomp`,
  built with libseccomp, installed by ``bwrap --seccomp``) refuses to create
  Unix sockets, so no daemon's socket file is reachable wherever it lies in
  the host tree, and abstract sockets stay behind the network namespace.
  Hiding directories could not promise this: ``connect()`` needs only write
  permission on the socket file, which a read-only mount does not remove,
  and sockets can sit anywhere (``/var``, a checkout, an interpreter prefix).
  Without libseccomp the sandbox counts as unavailable;
* the host file system read-only, with ``/home``, ``/root``, ``$HOME``,
  ``/tmp`` and ``/run`` (daemons' sockets and, in containers, mounted
  secrets) hidden behind empty tmpfs mounts; the only writable places are the
  throwaway working directory ``/tmp/work`` (a size-limited tmpfs, gone when
  the run ends) and ``/dev/shm`` (also a small tmpfs);
* a cleared environment: ``PATH``, ``HOME``, ``LANG`` and
  ``PYTHONDONTWRITEBYTECODE`` only, so no API keys or tokens leak in;
* resource limits set by a short launcher inside the sandbox right before the
  untrusted code starts: address space (memory), CPU seconds, process count,
  file size, no core dumps; plus a wall-clock limit enforced from outside by
  killing the whole process group (and with it the pid namespace);
* stdout and stderr each capped at ``max_output_bytes`` (the rest is counted
  and dropped, and a note says so).

Without bubblewrap, :func:`run_python` refuses (status ``refused``) unless
the caller passes ``allow_fallback=True``: then the code runs with the same
rlimits, scrubbed environment and temporary directory but *without*
namespaces and without the seccomp filter — it can reach the network and the
host's Unix sockets (a daemon listening on one can be driven), read any file
the (unprivileged) user can read, and write wherever that user may write.
``docs/workflows/sandbox.md`` describes both modes.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath

from unimas.errors import UserError
from unimas.sandbox import seccomp as sandbox_seccomp
from unimas.sandbox.pipes import Capture, feed, kill_group

STATUSES = ("ok", "error", "timeout", "memory", "refused")
MAX_SOURCE_BYTES = 1 << 20          # source plus extra files; bigger inputs are refused
MAX_STDIN_BYTES = 8 << 20
WORKDIR = "/tmp/work"               # the working directory inside the sandbox
SANDBOX_UID = 1000                  # uid/gid the code sees inside the user namespace
UNPRIVILEGED_UID = 65534            # `nobody`: the host uid used when unimas itself runs as root
INSTALL_HINT = ("install bubblewrap and libseccomp (Debian/Ubuntu: `apt-get install bubblewrap libseccomp2`; "
                "Fedora: `dnf install bubblewrap libseccomp`), or accept the weaker fallback without namespaces "
                "explicitly (`allow_fallback=True`, `unimas sandbox --allow-fallback`), see docs/workflows/sandbox.md")
FALLBACK_NOTE = ("weaker fallback: no bubblewrap namespaces and no seccomp filter, so the code can use the network "
                 "and the host's Unix sockets and read and write whatever the sandbox user may; only rlimits, a "
                 "scrubbed environment and a temporary directory apply")

# Runs inside the sandbox before the untrusted code: sets the rlimits, then replaces itself with main.py.
# main.py runs with -E -s -B: `-I` without its safe-path part, so files next to main.py can be imported.
_LAUNCHER = """\
import os, resource as R, sys
a = [int(x) for x in sys.argv[1:6]]
def cap(limit, soft, hard):
    old = R.getrlimit(limit)[1]
    if old != R.RLIM_INFINITY:
        soft, hard = min(soft, old), min(hard, old)
    R.setrlimit(limit, (soft, hard))
cap(R.RLIMIT_CORE, 0, 0)
cap(R.RLIMIT_FSIZE, a[3], a[3])
cap(R.RLIMIT_CPU, a[1], a[1] + 1)
cap(R.RLIMIT_NPROC, a[2], a[2])
cap(R.RLIMIT_AS, a[0], a[0])
os.execv(sys.executable, [sys.executable, "-E", "-s", "-B", "main.py"])
"""
_MEMORY_HINTS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


@dataclass
class SandboxResult:
    """What one sandboxed run did. ``status`` is one of :data:`STATUSES`."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    notes: list[str] = field(default_factory=list)  # truncation, fallback mode, why a run was refused

    def to_json(self) -> dict:
        data = asdict(self)
        data["duration_s"] = round(self.duration_s, 4)
        return data


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. ``cpu_s`` defaults to ``timeout_s``; memory is the address-space limit."""

    timeout_s: float = 10.0
    cpu_s: float | None = None
    memory_mb: int = 512
    max_processes: int = 64
    max_file_mb: int = 16
    max_output_bytes: int = 65536

    def __post_init__(self):
        for name in ("timeout_s", "memory_mb", "max_processes", "max_file_mb", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")
        if self.cpu_s is not None and not self.cpu_s > 0:
            raise ValueError(f"sandbox limit cpu_s must be positive, got {self.cpu_s!r}")
        if self.memory_mb < 64:
            raise ValueError(f"sandbox limit memory_mb must be at least 64 (Python needs it to start), "
                             f"got {self.memory_mb}")

    @property
    def cpu_seconds(self) -> int:
        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s))


# ---------------------------------------------------------------- probing


_probe_lock = threading.Lock()
_probes: dict[str, tuple[str | None, str]] = {}  # mode -> (interpreter or None, reason when None)


def available() -> bool:
    """Whether bubblewrap is installed and can start a Python inside its namespaces (probed once)."""
    return _probe("bwrap")[0] is not None


def unavailable_reason() -> str:
    """Why :func:`available` is false ('' when it is true)."""
    interpreter, reason = _probe("bwrap")
    return "" if interpreter else (reason or "bubblewrap does not work here")


def require_available(allow_fallback: bool = False) -> None:
    """For validators: raise :class:`UserError` unless the sandbox (or the accepted fallback) can run."""
    if available():
        return
    if allow_fallback:
        if _probe("fallback")[0] is not None:
            return
        raise UserError(f"the sandbox fallback cannot run Python either: {_probe('fallback')[1]}", where="sandbox")
    raise UserError(f"the code sandbox is unavailable: {unavailable_reason()}; {INSTALL_HINT}", where="sandbox")


def _candidates() -> list[str]:
    """Interpreters to try: this one (resolved, so a virtualenv's packages stay out), then the system's."""
    found = [os.path.realpath(sys.executable)] if sys.executable else []
    for directory in ("/usr/bin", "/usr/local/bin", "/bin"):
        path = shutil.which("python3", path=directory)
        if path and os.path.realpath(path) not in found:
            found.append(os.path.realpath(path))
    return found


def _probe(mode: str) -> tuple[str | None, str]:
    with _probe_lock:
        if mode not in _probes:
            _probes[mode] = _find_interpreter(mode)
        return _probes[mode]


def _find_interpreter(mode: str) -> tuple[str | None, str]:
    if mode == "bwrap" and not shutil.which("bwrap"):
        return None, "bubblewrap (`bwrap`) is not installed"
    if mode == "bwrap" and sandbox_seccomp.program()[0] is None:
        return None, sandbox_seccomp.program()[1]
    if sys.platform != "linux":
        return None, f"the sandbox needs Linux (this is {sys.platform})"
    reasons = []
    for interpreter in _candidates():
        result = _execute(mode, interpreter, "print('sandbox-ok')", {}, "", SandboxLimits(timeout_s=20.0))
        if result.exit_code == 0 and result.stdout.strip() == "sandbox-ok":
            return interpreter, ""
        detail = (result.stderr.strip().splitlines() or [result.status])[-1]
        reasons.append(f"{interpreter}: {detail}")
    if not reasons:
        return None, "no python3 interpreter found"
    what = "bubblewrap cannot start Python" if mode == "bwrap" else "cannot start Python"
    return None, f"{what} ({'; '.join(reasons)})"


# ---------------------------------------------------------------- running


def run_python(source: str, *, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
               files: dict[str, str] | None = None, allow_fallback: bool = False) -> SandboxResult:
    """Run ``source`` as ``main.py`` (next to ``files``: relative path -> text) in a fresh sandbox.

    Never raises for anything the code does; a refusal (sandbox missing
    without ``allow_fallback``, input too large, bad file name) is a result
    with status ``refused``.
    """
    files = dict(files or {})
    problem = _check_input(source, files, stdin)
    if problem:
        return _refused(problem)
    if available():
        mode = "bwrap"
    elif allow_fallback:
        mode = "fallback"
    else:
        return _refused(f"the code sandbox is unavailable: {unavailable_reason() or 'bubblewrap does not work here'}; "
                        f"{INSTALL_HINT}")
    interpreter, reason = _probe(mode)
    if interpreter is None:
        return _refused(f"the sandbox cannot run Python: {reason}")
    return _execute(mode, interpreter, source, files, stdin, limits)


def _refused(why: str) -> SandboxResult:
    return SandboxResult("refused", None, "", why, 0.0, [why])


def _check_input(source: str, files: dict[str, str], stdin: str) -> str:
    if not isinstance(source, str):
        return f"source must be a string, got {type(source).__name__}"
    size = len(source.encode("utf-8", "surrogatepass"))
    for name, text in files.items():
        path = PurePosixPath(str(name))
        if (not str(name) or path.is_absolute() or ".." in path.parts or str(path) in (".", "main.py")
                or "\0" in str(name)):
            return f"file name {name!r} refused: use a relative path without '..' other than main.py"
        if not isinstance(text, str):
            return f"file {name!r} must be text, got {type(text).__name__}"
        size += len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        return f"source and files are {size} bytes, more than the {MAX_SOURCE_BYTES} accepted"
    if len(stdin) > MAX_STDIN_BYTES:
        return f"stdin is {len(stdin)} characters, more than the {MAX_STDIN_BYTES} accepted"
    return ""


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}


def _hidden_dirs() -> list[str]:
    """Host directories replaced by empty tmpfs mounts: where users keep credentials, and ``/run`` (daemons'
    sockets, a container's mounted secrets)."""
    hidden = []
    for path in ("/home", "/root", os.path.expanduser("~"), "/run", "/var/run"):
        path = os.path.realpath(path)
        if os.path.isdir(path) and path != "/" and path not in hidden:
            hidden.append(path)
    return hidden


def _bwrap_command(interpreter: str, launcher_args: list[str], file_fds: dict[str, int], seccomp_fd: int,
                   limits: SandboxLimits) -> list[str]:
    tmpfs_bytes = str(max(64, 4 * limits.max_file_mb) << 20)
    cmd = ["bwrap", "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
           "--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
           "--size", tmpfs_bytes, "--tmpfs", "/tmp", "--size", tmpfs_bytes, "--tmpfs", "/dev/shm",
           "--remount-ro", "/dev"]
    prefix = os.path.dirname(os.path.dirname(interpreter))
    for hidden in _hidden_dirs():
        cmd += ["--tmpfs", hidden]
        if prefix == hidden or prefix.startswith(hidden + "/"):  # an interpreter installed under a home
            cmd += ["--ro-bind", prefix, prefix]
        cmd += ["--remount-ro", hidden]
    cmd += ["--dir", WORKDIR]
    for name, fd in file_fds.items():
        parent = str(PurePosixPath(WORKDIR, name).parent)
        if parent != WORKDIR:
            cmd += ["--dir", parent]
        cmd += ["--file", str(fd), f"{WORKDIR}/{name}"]
    cmd += ["--seccomp", str(seccomp_fd), "--chdir", WORKDIR, "--clearenv"]
    for key, value in _env(WORKDIR).items():
        cmd += ["--setenv", key, value]
    return cmd + ["--", interpreter, "-I", "-c", _LAUNCHER, *launcher_args]


def _processes_of(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count


def _readable_fd(data: bytes, opened: list) -> int:
    """A rewound temporary file holding ``data``, for bwrap to read through an inherited descriptor."""
    handle = tempfile.TemporaryFile()  # noqa: SIM115 - the caller closes everything in ``opened``
    handle.write(data)
    handle.flush()
    handle.seek(0)
    opened.append(handle)
    return handle.fileno()


def _execute(mode: str, interpreter: str, source: str, files: dict[str, str], stdin: str,
             limits: SandboxLimits) -> SandboxResult:
    as_root = os.geteuid() == 0
    drop = {"user": UNPRIVILEGED_UID, "group": UNPRIVILEGED_UID, "extra_groups": []} if as_root else {}
    run_uid = UNPRIVILEGED_UID if as_root else os.getuid()
    all_files = {"main.py": source, **files}
    notes: list[str] = []
    nproc = limits.max_processes
    if mode == "fallback":
        notes.append(FALLBACK_NOTE)
        nproc += _processes_of(run_uid)  # without a user namespace the kernel counts every process of the uid
    launcher_args = [str(limits.memory_mb << 20), str(limits.cpu_seconds), str(nproc), str(limits.max_file_mb << 20)]
    opened: list = []
    workdir = None
    try:
        if mode == "bwrap":
            filter_program, why = sandbox_seccomp.program()
            if filter_program is None:
                return _refused(f"the code sandbox is unavailable: {why}")
            fds = {name: _readable_fd(text.encode("utf-8", "surrogatepass"), opened)
                   for name, text in all_files.items()}
            seccomp_fd = _readable_fd(filter_program, opened)
            cmd = _bwrap_command(interpreter, launcher_args, fds, seccomp_fd, limits)
            popen = {"pass_fds": (*fds.values(), seccomp_fd), "env": _env(WORKDIR), "cwd": "/"}
        else:
            workdir = tempfile.mkdtemp(prefix="unimas-sandbox-")
            for name, text in all_files.items():
                path = os.path.join(workdir, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8", errors="surrogatepass") as handle:
                    handle.write(text)
            if as_root:
                for root, dirs, names in os.walk(workdir):
                    for entry in [root, *(os.path.join(root, n) for n in dirs + names)]:
                        os.chown(entry, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
            cmd = [interpreter, "-I", "-c", _LAUNCHER, *launcher_args]
            popen = {"env": _env(workdir), "cwd": workdir}
        return _supervise(cmd, popen, drop, stdin, limits, notes, mode)
    finally:
        for handle in opened:
            handle.close()
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _supervise(cmd: list[str], popen: dict, drop: dict, stdin: str, limits: SandboxLimits,
               notes: list[str], mode: str) -> SandboxResult:
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True, **popen, **drop)
    except OSError as exc:
        return _refused(f"could not start the sandbox: {exc}")
    readers = [Capture(proc.stdout, limits.max_output_bytes), Capture(proc.stderr, limits.max_output_bytes)]
    writer = threading.Thread(target=feed, args=(proc.stdin, stdin.encode("utf-8", "surrogatepass")), daemon=True)
    for thread in (*readers, writer):
        thread.start()
    timed_out = False
    try:
        proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        kill_group(proc.pid)  # the wall clock, and any leftovers of the group once the main process ended
        proc.wait()
    duration = time.monotonic() - start
    for thread in (*readers, writer):
        thread.join(timeout=2.0)  # a process that escaped the group (fallback only) may hold a pipe open
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    stdout = readers[0].text("stdout", notes)
    stderr = readers[1].text("stderr", notes)
    code = proc.returncode
    # bwrap reports a child killed by signal N as exit code 128 + N; without bwrap Popen gives -N.
    sig = -code if code < 0 else (code - 128 if mode == "bwrap" and 128 < code < 160 else None)
    tail = readers[1].tail.decode("utf-8", "replace")
    if timed_out:
        status = "timeout"
        notes.append(f"wall-clock limit of {limits.timeout_s:g} s reached; the process group was killed")
        code = None
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and duration >= limits.cpu_seconds):
        status = "timeout"
        notes.append(f"CPU limit of {limits.cpu_seconds} s reached")
    elif code != 0 and any(hint in tail for hint in _MEMORY_HINTS):
        status = "memory"
        notes.append(f"memory limit of {limits.memory_mb} MB reached")
    else:
        status = "ok" if code == 0 else "error"
        if sig is not None:
            notes.append(f"killed by signal {signal.Signals(sig).name if sig in signal.valid_signals() else sig}")
    return SandboxResult(status, code, stdout, stderr, duration, notes)
