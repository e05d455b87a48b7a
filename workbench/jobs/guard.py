"""The guard: a tiny parent for torchrun that makes sure a run leaves nothing behind.

Relying on torchrun alone to clean up is not enough: torch elastic starts
every worker in its own session (no process-group kill reaches them), a
SIGKILLed torchrun orphans its workers, and a torchrun told to stop can hang
in its own shutdown. So each node's torchrun runs under this guard::

    python -m workbench.jobs.guard --run-id ID --run-dir DIR --node 0 -- python -m torch.distributed.run ...

The guard is started in a new session with a parent-death signal (a dying
notebook kernel sends it SIGTERM), and starts torchrun with a parent-death
signal of its own. On SIGTERM, SIGINT or SIGHUP it kills the run's whole
tree (SIGTERM, grace, SIGKILL; workers found by walking the tree and by the
run id in their environment). When torchrun exits for any reason it kills
whatever of its node is left (orphaned workers; the node is marked by
``WORKBENCH_NODE`` in torchrun's environment, so one node finishing early
never touches another), records torchrun's exit code
in ``logs/node<i>/exit_code`` and writes the final ``status.json`` if nobody
has, so the run directory is complete even when the kernel is gone. It
exits with torchrun's exit code.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .process import NODE_ENV, create_time, kill_processes, pdeathsig_preexec

EXIT_CODE_FILE = "exit_code"


def exit_code_path(run_dir: str | Path, node: int) -> Path:
    from .backends.local import node_log_dir

    return node_log_dir(Path(run_dir), node) / EXIT_CODE_FILE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m workbench.jobs.guard --run-id ID --run-dir DIR [--node N] [--grace S] -- COMMAND...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="workbench.jobs.guard")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--node", type=int, default=0)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--parent", type=int, default=None, help="pid whose death ends the run")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if args.parent is not None and os.getppid() != args.parent:
        return 143  # the launcher died before the parent-death signal was armed
    # The handlers only record the signal. Taking a lock in one (threading.Event.set) can deadlock: the
    # handler runs in the main thread between bytecodes, possibly while that thread holds the same lock
    # inside Event.wait, and the guard would hang forever with its run half-stopped.
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stopped.append(signum))
    env = {**os.environ, NODE_ENV: str(args.node)}
    torchrun = subprocess.Popen(command, env=env, preexec_fn=pdeathsig_preexec)
    root = [(torchrun.pid, create_time(torchrun.pid))]
    while torchrun.poll() is None:
        if stopped:
            kill_processes(args.run_id, root, grace_s=args.grace, node=args.node)
            break
        time.sleep(0.2)
    code = torchrun.wait()
    code = code if code >= 0 else 128 - code  # killed by signal N -> 128 + N, as a shell reports it
    kill_processes(args.run_id, root, grace_s=1.0, node=args.node)
    exit_code_path(args.run_dir, args.node).write_text(f"{code}\n")
    from .job import Job, request_cancel

    if stopped:
        request_cancel(Path(args.run_dir), "stopped by a signal to its guard (cancel, or the launching process died)")
    Job(args.run_dir).status()
    return code


if __name__ == "__main__":
    sys.exit(main())
