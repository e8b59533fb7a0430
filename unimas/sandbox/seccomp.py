"""The sandbox's seccomp filter: sandboxed code cannot open a Unix socket, so it reaches no host daemon.

Why a filter and not only fewer mounts: ``connect()`` to a socket file needs
write permission on the file only, not a writable file system, so a socket
anywhere in the read-only host tree the sandbox sees (``/var``, an
interpreter prefix, a checkout) stays reachable however the mounts are
chosen. The filter closes that for every path at once. It is built by
libseccomp (the C library; Debian/Ubuntu package ``libseccomp2``, already a
dependency of apt and systemd), called through :mod:`ctypes` because its own
Python bindings ship only with distributions, for their system Python (the
PyPI wrappers are unmaintained or unofficial rebuilds), and handed to
bubblewrap as ``--seccomp FD``, which installs it (with ``no_new_privs``)
right before the sandboxed interpreter starts.

What it refuses, with ``EPERM``:

* ``socket(AF_UNIX, ...)``: no Unix socket to ``connect``, ``bind`` or
  ``sendto`` with; abstract sockets are also out of reach because they live
  in the network namespace, which the sandbox does not share;
* ``socketpair(AF_UNIX, SOCK_DGRAM or SOCK_RAW)``: an unnamed datagram socket
  could still ``sendto`` (or ``connect`` to) a host datagram socket such as
  the journal's. Stream and seqpacket pairs stay allowed (asyncio's event
  loop and ``multiprocessing.Pipe`` use them): a connected stream socket
  cannot be connected again (``EISCONN``);
* ``io_uring_setup``/``io_uring_enter``/``io_uring_register``: io_uring
  opens sockets without the system calls above, out of seccomp's sight.

The argument checks compare the low 32 bits only, as the kernel reads these
``int`` arguments, so setting high bits does not slip past. System calls of
another architecture (a 32-bit program) kill the process: libseccomp's default
for a filter built for the native one. Code that needs a Unix socket of its own
(``multiprocessing``'s forkserver or a ``Manager``, ``logging``'s syslog
handler) fails with ``PermissionError`` inside the sandbox.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import socket
import tempfile

LIBRARY = "libseccomp.so.2"
_ALLOW = 0x7FFF0000                    # SCMP_ACT_ALLOW
_DENY = 0x00050000 | errno.EPERM       # SCMP_ACT_ERRNO(EPERM)
_MASKED_EQ = 7                         # SCMP_CMP_MASKED_EQ: (argument & datum_a) == datum_b
_LOW_32 = 0xFFFFFFFF
_SOCKET_TYPE_MASK = 0xF                # SOCK_NONBLOCK and SOCK_CLOEXEC sit above it


class _ArgCmp(ctypes.Structure):
    """libseccomp's ``struct scmp_arg_cmp``."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _masked(arg: int, mask: int, value: int) -> _ArgCmp:
    return _ArgCmp(arg, _MASKED_EQ, mask, value)


RULES: list[tuple[str, list[_ArgCmp]]] = [
    ("socket", [_masked(0, _LOW_32, socket.AF_UNIX)]),
    ("socketpair", [_masked(0, _LOW_32, socket.AF_UNIX), _masked(1, _SOCKET_TYPE_MASK, socket.SOCK_DGRAM)]),
    ("socketpair", [_masked(0, _LOW_32, socket.AF_UNIX), _masked(1, _SOCKET_TYPE_MASK, socket.SOCK_RAW)]),
    ("io_uring_setup", []),
    ("io_uring_enter", []),
    ("io_uring_register", []),
]
"""(system call, comparisons that must all hold) -> refused with EPERM; everything else is allowed."""

@functools.cache
def program() -> tuple[bytes | None, str]:
    """The filter as the BPF bytes ``bwrap --seccomp`` reads, or (None, why it cannot be built); built once."""
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as exc:
        return None, (f"libseccomp is not installed ({exc}; Debian/Ubuntu: `apt-get install libseccomp2`, "
                      "Fedora: `dnf install libseccomp`); the sandbox needs it to keep code off the host's "
                      "Unix sockets")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    context = lib.seccomp_init(_ALLOW)
    if not context:
        return None, "libseccomp could not create a filter (seccomp_init failed)"
    try:
        for name, comparisons in RULES:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return None, (f"libseccomp does not know the system call {name} on this architecture (too old? "
                              "2.5 or later knows all of them); without a rule for it the filter would leave a gap")
            array = (_ArgCmp * len(comparisons))(*comparisons)
            result = lib.seccomp_rule_add_array(context, _DENY, number, len(comparisons), array)
            if result < 0:
                return None, f"libseccomp refused the rule for {name}: {errno.errorcode.get(-result, result)}"
        return _export(lib, context)
    finally:
        lib.seccomp_release(context)


def _export(lib: ctypes.CDLL, context: int) -> tuple[bytes | None, str]:
    with tempfile.TemporaryFile() as handle:
        result = lib.seccomp_export_bpf(context, handle.fileno())
        if result < 0:
            return None, f"libseccomp could not export the filter: {errno.errorcode.get(-result, result)}"
        handle.seek(0)
        return handle.read(), ""
