"""Several nodes without a scheduler: the same torchrun command on every node, c10d rendezvous.

Every node runs ``torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint
HEAD:PORT --rdzv-id RUN_ID``; the first host of ``LaunchSpec.hosts`` is the
head (it hosts the rendezvous store) and the port is the spec's
``rdzv_port`` or, when the head is this machine, a free one. Nodes on this
machine (loopback "nodes", used by the tests) are started as local agents
with ``--local-addr``; other hosts are reached with ``ssh HOST`` running the
same command in the same working directory (the run directory must then be
on a filesystem every node shares). :meth:`MultiNodeBackend.render` returns
the per-node commands so they can also be run by hand.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from ..process import free_port, is_local_host
from ..spec import LaunchSpec
from .base import ProcessState, Started
from .local import cancel_agents, node_log_dir, poll_agents, start_agents, torchrun_argv, worker_env

__all__ = ["MultiNodeBackend", "node_argvs"]

DEFAULT_RDZV_PORT = 29400


def _hosts(spec: LaunchSpec) -> tuple[str, ...]:
    return spec.hosts or ("127.0.0.1",) * spec.nnodes


def node_argvs(spec: LaunchSpec, run_dir: Path, run_id: str, port: int) -> list[list[str]]:
    """One argv per node; remote nodes are wrapped in ``ssh HOST 'cd CWD && env ... torchrun ...'``."""
    hosts = _hosts(spec)
    endpoint = f"{hosts[0]}:{port}"
    argvs = []
    for node, host in enumerate(hosts):
        argv = torchrun_argv(spec, run_dir, run_id, endpoint=endpoint, log_dir=node_log_dir(run_dir, node),
                             local_addr=host)
        if not is_local_host(host):
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in worker_env(spec, run_dir, run_id).items())
            argv = ["ssh", host, f"cd {shlex.quote(os.getcwd())} && env {env} {shlex.join(argv)}"]
        argvs.append(argv)
    return argvs


class MultiNodeBackend:
    """torchrun on each of ``spec.hosts`` (default: ``nnodes`` loopback nodes on this machine)."""

    name = "multinode"

    def check(self, spec: LaunchSpec) -> None:
        if spec.slurm is not None:
            raise ValueError("LaunchSpec.slurm is set but the backend is 'multinode'; use backend='slurm' or "
                             "drop slurm")
        hosts = _hosts(spec)
        if spec.rdzv_port is None and not is_local_host(hosts[0]):
            raise ValueError(f"LaunchSpec.rdzv_port is needed when the head node {hosts[0]!r} is another machine; "
                             f"give a port open between the nodes, e.g. {DEFAULT_RDZV_PORT}")

    def _port(self, spec: LaunchSpec) -> int:
        return spec.rdzv_port or free_port()

    def render(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> list[str]:
        port = spec.rdzv_port or DEFAULT_RDZV_PORT
        return [shlex.join(argv) for argv in node_argvs(spec, run_dir, run_id, port)]

    def start(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> Started:
        port = self._port(spec)
        started = start_agents(spec, run_dir, run_id, node_argvs(spec, run_dir, run_id, port))
        started.launch["rdzv_endpoint"] = f"{_hosts(spec)[0]}:{port}"
        started.launch["hosts"] = list(_hosts(spec))
        return started

    def poll(self, launch: dict[str, Any], processes: list[Any], run_dir: Path) -> ProcessState:
        return poll_agents(launch, processes, run_dir)

    def cancel(self, launch: dict[str, Any], grace_s: float) -> None:
        cancel_agents(launch, grace_s)
