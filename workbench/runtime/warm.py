"""Warm rank starts: ranks forked from a process that has already imported torch and the runtime.

Problem: every rank torchrun starts is a fresh interpreter that imports
torch and the workbench before it trains. The runs of a test suite or of a
lesson are short and many, so most of their CPU goes to importing the same
modules again: a 2-rank run of 5 steps costs 7.4 s of CPU started cold
against 2.4 s with warm ranks (``bench/bench_rank_start.py``).

Approach: ``python -m workbench.runtime.warm --socket PATH`` imports torch,
torch.distributed and the runtime entry once and listens on a Unix socket.
A rank started by torchrun with ``WORKBENCH_WARM_RANKS=PATH`` in its
environment hands itself over before importing torch
(:mod:`workbench.runtime.warm_client`): its module, arguments, environment,
working directory and its three standard descriptors. The server forks; the
child takes the rank's descriptors, directory and environment (and shows
them in ``/proc``: its command line and environment block are rewritten
over the server's, which starts with room to spare, so process listings and
the run-id search of :mod:`workbench.jobs.process` see the rank exactly as
they see a cold one), seeds torch's default generator afresh (as torch
seeds a new process) and runs the module as ``__main__``. torchrun keeps supervising the real
process it started (the stand-in): the server passes the stand-in's signals
to the rank, reports the rank's end (exit code or signal) back to it, and
kills the rank when the stand-in disappears. torchrun, its rendezvous and
the ranks' gloo collectives are unchanged.

The server is one thread (a fork from a threaded process could inherit a
lock held by another thread) and loops over ``select``: new connections,
messages from stand-ins, and ``SIGCHLD`` through a wakeup descriptor. It
exits when its parent does (``PR_SET_PDEATHSIG``, Linux) or on SIGTERM,
killing its ranks. The test suite starts one per session
(``tests/conftest.py``), so its runs and its notebooks' runs start warm;
without the variable every rank starts cold, as it always did.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import errno
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import time
import traceback

from .warm_client import HEADER, STATUS, WARM_ENV, recv_exact

__all__ = ["serve", "server_command", "server_env", "wait_ready", "PRELOAD", "PAD_ENV"]

PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.distributed.elastic.multiprocessing.errors",
           "workbench.runtime.entry")
PAD_ENV = "WORKBENCH_WARM_PAD"  # room in the server's environment block for a rank's environment
PAD_BYTES = 64 * 1024
PAD_ARGV = 8 * 1024


def _proc_area(first: int) -> tuple[int, int]:
    """Two adjacent fields of ``/proc/self/stat`` (1-based, as proc(5) numbers them): start and end addresses."""
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    return int(fields[first - 3]), int(fields[first - 2])


def _overwrite(start: int, end: int, strings: list[str]) -> bool:
    """Write NUL-separated ``strings`` over the memory ``[start, end)`` (NUL-padded); False when they do not
    fit."""
    data = b"".join(s.encode(errors="surrogateescape") + b"\0" for s in strings)
    if len(data) > end - start:
        return False
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
    return True


def show_as(argv: list[str], env: dict[str, str]) -> bool:
    """Make ``/proc/self/cmdline`` and ``/proc/self/environ`` read ``argv`` and ``env`` (Linux); False when
    either does not fit in the room the server started with."""
    try:
        shown = _overwrite(*_proc_area(48), [sys.executable, *argv[1:]] if argv else [sys.executable])
        return _overwrite(*_proc_area(50), [f"{k}={v}" for k, v in env.items()]) and shown
    except (OSError, ValueError, IndexError):
        return False


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _rank_main(request: dict, fds: list[int]) -> None:
    """In the forked child: become the rank described by ``request`` and run it; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        env = {k: v for k, v in request["env"].items() if k != WARM_ENV}
        # the path a cold `python -m` starts with: its directory, then PYTHONPATH, before the server's own
        for entry in reversed([request["cwd"], *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]):
            sys.path.insert(0, entry)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = list(request["argv"])
        if not show_as(sys.argv, env):  # process listings would not find this rank by its run id
            print("warm rank: its command line or environment does not fit in /proc; it shows the server's",
                  file=sys.stderr, flush=True)
        if env.get("PYTHONUNBUFFERED"):
            sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True)
        import torch
        torch.seed()  # a fresh process's generator starts from a random seed, not from the server's state
        torch.set_num_threads(max(int(env.get("OMP_NUM_THREADS", "1") or 1), 1))
        code = _run_module(request["module"])
    except BaseException:  # noqa: BLE001 - a failure to become the rank is the rank's failure
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_module(module: str) -> int:
    """``python -m module``'s exit code."""
    sys.modules.pop(module, None)  # preloaded for its imports; `-m` runs it as __main__ only, and so does this
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback, then exit 1
        traceback.print_exc()
        return 1


class _Server:
    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        self.listener.bind(path)
        self.listener.listen(128)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.rank_of: dict[socket.socket, int] = {}
        self.conn_of: dict[int, socket.socket] = {}

    def loop(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.stop(0))
        while True:
            try:
                ready, _, _ = select.select([self.listener, self.wake_r, *self.rank_of], [], [])
            except InterruptedError:
                continue
            for item in ready:
                if item is self.listener:
                    self._accept()
                elif item == self.wake_r:
                    self._drain_wakeups()
                    self._reap()
                else:
                    self._message(item)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            request = json.loads(recv_exact(conn, HEADER.unpack(header)[0]))
        except (OSError, ValueError, struct.error):
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_child(conn)
            _rank_main(request, fds)
        for fd in fds:
            os.close(fd)
        self.rank_of[conn], self.conn_of[pid] = pid, conn
        self._send(conn, b"P", pid)

    def _become_child(self, conn: socket.socket) -> None:
        _die_with_parent(signal.SIGKILL)  # a rank never outlives its server (nothing would report its end)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for other in [self.listener, conn, *self.rank_of]:
            other.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.conn_of.pop(pid, None)
            if conn is not None:
                self.rank_of.pop(conn, None)
                self._send(conn, b"X", _exit_code(status))
                conn.close()

    def _message(self, conn: socket.socket) -> None:
        pid = self.rank_of.get(conn)
        try:
            data = conn.recv(5)
        except OSError:
            data = b""
        if pid is None:
            return
        if len(data) == 5 and data[:1] == b"S":
            _kill(pid, struct.unpack("!i", data[1:])[0])
        elif not data:  # the stand-in is gone (torchrun killed it): the rank goes too
            _kill(pid, signal.SIGKILL)
            self.rank_of.pop(conn, None)
            conn.close()

    @staticmethod
    def _send(conn: socket.socket, kind: bytes, value: int) -> None:
        try:
            conn.sendall(STATUS.pack(kind, value))
        except OSError:
            pass

    def stop(self, code: int) -> None:
        for pid in list(self.conn_of):
            _kill(pid, signal.SIGKILL)
        os._exit(code)


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def _die_with_parent(signum: int = signal.SIGTERM) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signum, 0, 0, 0)  # PR_SET_PDEATHSIG


def server_command(path: str, python: str | None = None) -> list[str]:
    """The command line that starts a server at ``path``, with room in it for a rank's command line."""
    return [python or sys.executable, "-m", "workbench.runtime.warm", "--socket", str(path), "." * PAD_ARGV]


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default this process's) with room for a rank's environment, and
    without the server's own variable (its ranks' stand-ins carry it)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != WARM_ENV}
    return {**env, PAD_ENV: "." * PAD_BYTES}


def wait_ready(path: str, timeout_s: float = 60.0) -> bool:
    """Whether a server answers at ``path`` within ``timeout_s`` (it imports torch first: seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
                return True
            except OSError:
                time.sleep(0.1)
    return False


def serve(path: str, preload: tuple[str, ...] = PRELOAD) -> None:
    """Import ``preload``, then fork ranks on request at ``path`` until SIGTERM or the parent's death."""
    _die_with_parent()
    for name in preload:
        importlib.import_module(name)
    server = _Server(path)
    print(f"warm rank server ready at {path} (pid {os.getpid()})", flush=True)
    server.loop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="workbench.runtime.warm", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on (WORKBENCH_WARM_RANKS)")
    parser.add_argument("--preload", action="append", default=[], help="another module to import once")
    parser.add_argument("pad", nargs="*", help=argparse.SUPPRESS)  # room for a rank's command line in /proc
    args = parser.parse_args(argv)
    serve(args.socket, PRELOAD + tuple(args.preload))


if __name__ == "__main__":
    main()
