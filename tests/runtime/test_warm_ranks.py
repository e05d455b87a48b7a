"""Warm rank starts (workbench.runtime.warm): a rank handed to the server behaves as the same rank started cold.

The session's server (tests/conftest.py ``warm_ranks``) forks every rank of the suite; these tests check what
that must not change: exit codes, output, signals, the process's face in /proc, the lifetime tie to the
process torchrun started, and a run's losses and weights, bit for bit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from runtime_launch import dumped_params, make_config, step_losses, torchrun
from workbench.core.rundir import WARM_RANKS_ENV
from workbench.jobs.process import run_processes
from workbench.runtime.warm import wait_ready

PROBE_DIR = Path(__file__).parent / "warm_probe"
CLIENT = ("from workbench.runtime.warm_client import forward_to_warm_server as hand_over\n"
          "hand_over('wb_warm_probe')\n"
          "import runpy; runpy.run_module('wb_warm_probe', run_name='__main__', alter_sys=True)")


@pytest.fixture(scope="module")
def server(warm_ranks):
    if warm_ranks is None:
        pytest.skip("the session runs cold (WORKBENCH_COLD_RANKS=1 or a GPU machine)")
    assert wait_ready(warm_ranks, 60.0), "the session's warm rank server never answered"
    return warm_ranks


def _probe(sock: Path | None, *args: str, mark: str = "m1") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != WARM_RANKS_ENV}
    env.update(PYTHONPATH=str(PROBE_DIR), PROBE_MARK=mark, OMP_NUM_THREADS="1")
    if sock is not None:
        env[WARM_RANKS_ENV] = str(sock)
    return subprocess.Popen([sys.executable, "-c", CLIENT, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(PROBE_DIR))


def _line(proc: subprocess.Popen) -> dict[str, str]:
    words = proc.stdout.readline().split()
    assert words and words[0] == "probe", words
    return dict(w.split("=", 1) for w in words[1:] if "=" in w)


def _forked_child(server_pid: int, pid: int) -> bool:
    return psutil.Process(pid).ppid() == server_pid


def _server_pid(sock: Path) -> int:
    found = [p.pid for p in psutil.process_iter(["cmdline"]) if str(sock) in " ".join(p.info["cmdline"] or [])
             and "workbench.runtime.warm" in " ".join(p.info["cmdline"] or [])]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.multiproc
def test_exit_code_output_and_fresh_process_state_pass_through(server):
    proc = _probe(server, "exit", "3")
    out, err = proc.communicate(timeout=60)
    fields = dict(w.split("=", 1) for w in out.split()[1:] if "=" in w)
    assert proc.returncode == 3, err
    assert int(fields["pid"]) != proc.pid  # the rank ran in a forked process, not in the stand-in
    assert fields["mark"] == "m1" and fields["threads"] == "1"
    again, _ = _probe(server, "exit", "0").communicate(timeout=60)
    # torch seeds a fresh process at random; two forked ranks do not share the server's generator state
    assert fields["seed"] != dict(w.split("=", 1) for w in again.split()[1:] if "=" in w)["seed"]
    assert Path(fields["cwd"]) == PROBE_DIR
    failed = _probe(server, "raise")
    _, err = failed.communicate(timeout=60)
    assert failed.returncode == 1 and "the probe failed on purpose" in err


@pytest.mark.multiproc
def test_the_rank_shows_in_proc_as_its_command_and_environment(server):
    proc = _probe(server, "sleep", mark="shown-in-proc")
    try:
        pid = int(_line(proc)["pid"])
        assert _forked_child(_server_pid(server), pid)
        rank = psutil.Process(pid)
        assert rank.environ().get("PROBE_MARK") == "shown-in-proc"
        assert WARM_RANKS_ENV not in rank.environ()
        assert "sleep" in rank.cmdline() and rank.cmdline()[0] == sys.executable
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.multiproc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_stand_in_reaches_the_rank(server, sig):
    proc = _probe(server, "sleep")
    pid = int(_line(proc)["pid"])
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # SIGTERM kills the rank (the stand-in ends by the same signal); SIGINT raises KeyboardInterrupt in it
    assert proc.returncode == (-signal.SIGTERM if sig == signal.SIGTERM else 1)


@pytest.mark.multiproc
def test_killing_the_stand_in_kills_the_rank(server):
    proc = _probe(server, "sleep")
    pid = int(_line(proc)["pid"])
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and psutil.pid_exists(pid) and \
            psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.multiproc
def test_without_a_server_the_rank_starts_cold(tmp_path):
    proc = _probe(tmp_path / "nobody.sock", "exit", "0")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"pid={proc.pid} " in out  # it ran in the process that was started


@pytest.mark.multiproc
def test_a_warm_run_equals_the_cold_run_bit_for_bit(server, tmp_path, monkeypatch):
    runs = {}
    for mode in ("cold", "warm"):
        run_dir = tmp_path / mode
        make_config(run_dir, plan="pp2-1f1b-m4")
        if mode == "cold":
            monkeypatch.delenv(WARM_RANKS_ENV, raising=False)
        else:
            monkeypatch.setenv(WARM_RANKS_ENV, str(server))
        proc = torchrun(run_dir, 2)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[mode] = run_dir
    assert step_losses(runs["warm"]) == step_losses(runs["cold"])
    cold, warm = dumped_params(runs["cold"], [0, 1]), dumped_params(runs["warm"], [0, 1])
    assert cold.keys() == warm.keys() and all(torch.equal(cold[k], warm[k]) for k in cold)
    from workbench.runtime.events import read_events
    starts = {mode: read_events(runs[mode], 0)[0] for mode in runs}
    assert starts["warm"]["kind"] == starts["cold"]["kind"] == "start"


@pytest.mark.multiproc
def test_a_running_warm_rank_is_found_by_its_run_id(server, tmp_path):
    from workbench.jobs import LaunchSpec, launch

    config = make_config(tmp_path / "config", plan="dp2", training={"steps": 100000}).to_dict()
    del config["run"]["dir"]  # the launch gives the run its own directory
    job = launch(LaunchSpec(config=config, nproc_per_node=2, run_root=str(tmp_path / "runs"),
                            name="found"), check_entry=False)
    try:
        deadline = time.monotonic() + 120
        while (job.status().step or 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        from workbench.runtime.events import read_events
        pids = {e["pid"] for r in (0, 1) for e in read_events(job.run_dir, r) if e["kind"] == "start"}
        assert len(pids) == 2
        server_pid = _server_pid(server)
        assert all(_forked_child(server_pid, pid) for pid in pids)
        found = {p.pid for p in run_processes(job.run_id)}
        assert pids <= found  # the run-id search of workbench.jobs.process sees the forked ranks
    finally:
        job.cancel(grace_s=5.0)
    assert job.status().state == "CANCELLED"
    time.sleep(0.5)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_command_line_or_environment_too_long_for_the_room_is_not_written():
    import ctypes

    from workbench.runtime.warm import _overwrite

    room = ctypes.create_string_buffer(b"x" * 15)  # 16 bytes with its NUL
    start = ctypes.addressof(room)
    assert not _overwrite(start, start + 16, ["y" * 20]) and room.raw == b"x" * 15 + b"\0"  # left as it was
    assert _overwrite(start, start + 16, ["ab", "c"]) and room.raw == b"ab\0c\0" + b"\0" * 11
