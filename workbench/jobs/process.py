"""Process lifetime: start torchrun so it cannot outlive the notebook, and kill whole trees.

Three facts shape this module. A child in the kernel's process group receives
the SIGINT of *Interrupt kernel*, so torchrun gets a new session. A child in
its own session survives its parent, so it also gets a parent-death signal
(``PR_SET_PDEATHSIG`` = SIGTERM, set between fork and exec; torchrun forwards
SIGTERM to its workers). And torch elastic starts every worker in a session of
its own, so ``killpg`` on torchrun misses them: a kill walks the psutil tree
from the torchrun pid and, for processes already re-parented, matches the run
id that every process of a run carries in its environment
(``WORKBENCH_RUN_ID``).

Processes are identified by ``(pid, create_time)`` so that a recycled pid is
never mistaken for a job's process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import socket
import sys
import time
from typing import Iterable

import psutil

__all__ = ["RUN_ID_ENV", "NODE_ENV", "pdeathsig_preexec", "process_alive", "create_time", "run_processes",
           "kill_processes", "free_port", "is_local_host"]

RUN_ID_ENV = "WORKBENCH_RUN_ID"
NODE_ENV = "WORKBENCH_NODE"
_PR_SET_PDEATHSIG = 1


def pdeathsig_preexec() -> None:
    """``preexec_fn``: ask the kernel to SIGTERM this child when the spawning thread dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_alive(pid: int | None, started: float | None = None) -> bool:
    """True when ``pid`` runs, is not a zombie and (if given) was created at ``started``."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 0.01
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _has_run_id(proc: psutil.Process, run_id: str, node: int | None) -> bool:
    try:
        env = proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return False
    return env.get(RUN_ID_ENV) == run_id and (node is None or env.get(NODE_ENV) == str(node))


def run_processes(run_id: str, roots: Iterable[tuple[int, float | None]] = (), node: int | None = None
                  ) -> list[psutil.Process]:
    """Every live process of a run (of one ``node`` if given): the roots' trees plus any process
    carrying the run id (and node) in its environment."""
    found: dict[int, psutil.Process] = {}
    for pid, started in roots:
        if not process_alive(pid, started):
            continue
        try:
            root = psutil.Process(pid)
            found[root.pid] = root
            for child in root.children(recursive=True):
                found[child.pid] = child
        except psutil.NoSuchProcess:
            continue
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid != me and proc.pid not in found and _has_run_id(proc, run_id, node):
            found[proc.pid] = proc
    return [p for p in found.values() if p.pid != me]


def _alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def _signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def kill_processes(run_id: str, roots: Iterable[tuple[int, float | None]] = (), grace_s: float = 5.0,
                   node: int | None = None) -> int:
    """SIGTERM a run's processes, wait up to ``grace_s``, SIGKILL the rest; return how many were found.

    The tree is collected before signalling (once torchrun dies its workers
    are re-parented and only the run id finds them) and again after the grace
    period, so workers that a dying agent was still starting are caught too.
    """
    roots = list(roots)
    procs = run_processes(run_id, roots, node)
    count = len(procs)
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + max(grace_s, 0.0)
    while time.monotonic() < deadline and _alive(procs):
        time.sleep(0.05)
    leftovers = {p.pid: p for p in _alive(procs)}
    for proc in run_processes(run_id, roots, node):
        leftovers.setdefault(proc.pid, proc)
    _signal_all(leftovers.values(), signal.SIGKILL)
    psutil.wait_procs(list(leftovers.values()), timeout=5.0)
    return count + len([p for p in leftovers if p not in {q.pid for q in procs}])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for a rendezvous endpoint several agents must share)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def is_local_host(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())
