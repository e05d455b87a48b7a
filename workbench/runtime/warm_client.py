"""The rank side of warm starts: hand this rank to a warm rank server, or carry on cold.

Imports nothing but the standard library, so a rank that is handed over
costs a bare interpreter start. :func:`forward_to_warm_server` is called by
the entry module before it imports torch: with ``WORKBENCH_WARM_RANKS`` naming
a server's socket, it sends the rank's module, arguments, environment,
working directory and standard streams (the descriptors themselves, so the
rank writes where torchrun reads) to the server, which forks the rank from a
process that has torch imported (:mod:`workbench.runtime.warm`). This process
stays as the rank's stand-in for torchrun: signals sent to it are passed on,
and it exits as the rank exits (with its code, or by its signal). If it dies
without warning the server kills the rank. Without the variable, or when the
server does not answer, it returns and the rank starts cold.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

from ..core.rundir import WARM_RANKS_ENV as WARM_ENV

__all__ = ["WARM_ENV", "forward_to_warm_server", "FORWARDED_SIGNALS", "HEADER", "STATUS", "recv_exact"]

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HEADER = struct.Struct("!I")  # the request's length; the request follows as JSON
STATUS = struct.Struct("!ci")  # b"P" + the rank's pid, then b"X" + its wait status as an exit code (< 0: signal)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the warm rank server closed the connection")
        data += chunk
    return data


def forward_to_warm_server(module: str) -> None:
    """Run this process's rank in a process forked by the warm server and exit as it exits; return (to start
    cold) when no server is named or it does not answer."""
    path = os.environ.get(WARM_ENV)
    if not path:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return
    request = json.dumps({"module": module, "argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        socket.send_fds(sock, [HEADER.pack(len(request))], [0, 1, 2])
        sock.sendall(request)
        kind, pid = STATUS.unpack(recv_exact(sock, STATUS.size))
    except OSError:  # the server went away before it forked: start cold
        sock.close()
        return
    if kind != b"P":
        sock.close()
        return
    _stand_in(sock)


def _stand_in(sock: socket.socket) -> None:
    """Pass signals on to the rank until the server reports its end; then end the same way."""
    def forward(signum: int, _frame: object) -> None:
        try:
            sock.sendall(b"S" + struct.pack("!i", signum))
        except OSError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    try:
        kind, status = STATUS.unpack(recv_exact(sock, STATUS.size))
    except (OSError, struct.error):
        kind, status = b"X", 1
    if kind == b"X" and status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status if kind == b"X" and status >= 0 else 1)
