"""The job handle: launch a spec somewhere, then watch, wait for, read and stop it.

A :class:`Job` is a view of a run directory plus a backend: everything it
reports is rebuilt from files (``launch.json``, the per-rank events, the
console logs, ``status.json``) and from asking the backend whether the
processes still run. That is what makes ``attach(run_dir)`` after a kernel
restart give the same answers as the handle ``launch`` returned. The
launching process also keeps a watcher thread that writes ``status.json``
the moment torchrun exits, so the final state is on disk even if nobody
asks; any other process that sees the run end writes it if it is missing
(the first writer wins, the file is never rewritten). Cancel leaves a marker
file first, so whoever writes the final status knows the end was asked for.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterator

from ..core.fields import check, integer, optional
from ..core.rundir import CONFIG_FILE, COMMAND_FILE, LAUNCH_FILE, LOGS_DIR, TERMINAL_STATES, status_path
from .backends import ProcessState, get_backend
from .backends.local import FALLBACK_PREFIX
from .figures import summary_figure
from .monitor_model import EVAL_FIELDS, METRIC_FIELDS, RunState
from .prediction import predict_run
from .process import kill_processes, process_alive, run_processes
from .spec import LaunchSpec, check_launchable, config_dict, resolve_run_root
from .status import JobStatus, RankStatus
from .tailer import EventTailer, TextTailer

__all__ = ["Job", "launch", "attach", "list_runs", "reap", "request_cancel", "SPEC_FILE", "CANCEL_FILE"]

SPEC_FILE = "spec.json"
CANCEL_FILE = "cancel_requested.json"
_LIVE_JOBS: "weakref.WeakSet[Job]" = weakref.WeakSet()


def _write_json_atomic(path: Path, data: Any, *, exclusive: bool = False) -> bool:
    """Write JSON via a temporary file; with ``exclusive`` never replace an existing file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    try:
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def request_cancel(run_dir: Path, reason: str) -> None:
    """Leave the cancel marker (kept if one exists: the first reason is the true one)."""
    _write_json_atomic(Path(run_dir) / CANCEL_FILE, {"t": time.time(), "pid": os.getpid(), "reason": reason},
                       exclusive=True)


class Job:
    """A launched (or attached) run; all state lives in ``run_dir``."""

    def __init__(self, run_dir: str | Path, *, processes: list[Any] | None = None):
        self.run_dir = Path(run_dir).resolve()
        launch_info = _read_json(self.run_dir / LAUNCH_FILE)
        if launch_info is None:
            raise ValueError(f"run_dir {str(self.run_dir)!r} has no readable {LAUNCH_FILE}; give a directory made "
                             f"by workbench.jobs.launch")
        self.launch_info = launch_info
        self.spec_data: dict[str, Any] = _read_json(self.run_dir / SPEC_FILE) or {}
        self.backend = get_backend(launch_info["backend"])
        # a run of a sweep shares its processes, their console logs and exit codes with the sweep's first run
        self._host_dir = Path(launch_info.get("sweep", {}).get("host") or self.run_dir)
        self._processes = list(processes or [])
        self._tailer = EventTailer(self.run_dir)
        self._state = RunState(stall_after_s=float(self.spec_data.get("stall_after_s", 30.0)))
        self._lock = threading.RLock()
        self._watcher: threading.Thread | None = None
        self.prediction_note = ""  # why the latest predicted_timeline() gave None ("" when it gave a timeline)

    # -- identity --------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.launch_info["run_id"]

    @property
    def handle(self) -> str:
        return f"{self.backend.name}://{self.launch_info.get('host', 'localhost')}/{self.run_id}"

    @property
    def spec(self) -> LaunchSpec:
        return LaunchSpec.from_dict(self.spec_data)

    @property
    def commands(self) -> list[str]:
        """The command(s) launched, one per node or one batch script (``command.txt`` has them for people)."""
        recorded = self.launch_info.get("commands")
        if recorded is not None:
            return list(recorded)
        path = self.run_dir / COMMAND_FILE  # run directories written before launch.json kept the list
        return path.read_text().split("\n\n") if path.is_file() else []

    def __repr__(self) -> str:
        return f"Job({self.handle!r}, run_dir={str(self.run_dir)!r})"

    # -- state -----------------------------------------------------------------------------
    def refresh(self) -> RunState:
        """Fold new events into the run state and return it (shared with the monitor)."""
        with self._lock:
            self._state.apply(self._tailer.poll())
            return self._state

    @property
    def corrupt_lines(self) -> list:
        return list(self._tailer.corrupt)

    def status(self) -> JobStatus:
        """The job state now, with per-rank step, heartbeat age and ``STALLED`` detection."""
        with self._lock:
            state = self.refresh()
            now = time.time()
            final = _read_json(status_path(self.run_dir))
            if final is not None:
                return JobStatus.from_dict({**final, **_eval_fields(state),
                                            "ranks": self._rank_rows(state, now, final["state"], True)})
            processes = self.backend.poll(self.launch_info, self._processes, self._host_dir)
            job_state, reason, codes = self._decide(state, processes)
            finished = job_state in TERMINAL_STATES or processes.running is False
            cause = state.root_cause() if job_state == "FAILED" else None
            if job_state == "FAILED" and cause is None:
                cause = self._log_root_cause()
            ranks = tuple(RankStatus(**row) for row in self._rank_rows(state, now, job_state, finished))
            status = JobStatus(state=job_state, reason=reason, run_id=self.run_id, ranks=ranks,
                               exit_codes=codes, restarts=state.restarts, root_cause=cause, step=state.latest_step(),
                               final_loss=state.final_loss(), updated=now, finished=finished, **_eval_fields(state))
            if finished and self.backend.name != "dryrun":
                _write_json_atomic(status_path(self.run_dir), status.to_dict(), exclusive=True)
                final = _read_json(status_path(self.run_dir)) or status.to_dict()
                return JobStatus.from_dict({**final, **_eval_fields(state),
                                            "ranks": self._rank_rows(state, now, final["state"], True)})
            return status

    @staticmethod
    def _rank_rows(state: RunState, now: float, job_state: str, finished: bool) -> list[dict[str, Any]]:
        """Per-rank rows; once the job is over, ranks still shown as live take the job's state."""
        rows = state.summary_rows(now)
        if finished and job_state != "SUCCEEDED":
            for row in rows:
                if row["state"] in ("PENDING", "RUNNING", "STALLED"):
                    row["state"] = job_state
        return rows

    def _decide(self, state: RunState, proc: ProcessState) -> tuple[str, str, dict[str, int] | None]:
        if self.backend.name == "dryrun":
            return "UNKNOWN", f"dry run: nothing was started; the command is in {COMMAND_FILE}", None
        cancelled = (self.run_dir / CANCEL_FILE).is_file()
        sweep = self.launch_info.get("sweep")
        # a run of a sweep ends with its ranks' end events while the processes go on with the next run; the
        # last run ends as any run does, when the processes have exited
        if sweep and sweep["index"] < len(sweep["run_dirs"]) - 1 and not cancelled and _all_ranks_ended(state):
            return "SUCCEEDED", "every rank reported its end", None
        if proc.running is None:
            return "UNKNOWN", proc.detail, None
        if proc.running:
            if proc.scheduler_state == "PENDING" or not any(r.started for r in state.ranks.values()):
                waiting = "the runs before it in the same processes" if sweep and sweep["index"] else "the workers"
                return "PENDING", proc.detail or f"waiting for {waiting} to start", None
            notes = [f"rank {r} stalled (no event for more than {state.stall_after_s:g} s)"
                     for r, s in state.rank_states().items() if s == "STALLED"]
            if state.restarts:
                notes.append(f"restarted {state.restarts}x")
            return "RUNNING", "; ".join(notes), None
        if cancelled:
            marker = _read_json(self.run_dir / CANCEL_FILE) or {}
            return "CANCELLED", marker.get("reason", "cancelled on request"), proc.exit_codes
        cause = state.root_cause()
        if proc.scheduler_state in TERMINAL_STATES:  # a scheduler's failure: the rank's error says more, not a time limit
            failed = proc.scheduler_state == "FAILED" and not proc.detail.startswith("TIMEOUT")
            return proc.scheduler_state, self._failure_reason(cause if failed else None, proc.detail), proc.exit_codes
        if proc.exit_codes is not None:
            if all(code == 0 for code in proc.exit_codes.values()):
                return "SUCCEEDED", "", proc.exit_codes
            failed = ", ".join(f"{k} exited {v}" for k, v in proc.exit_codes.items() if v != 0)
            return "FAILED", self._failure_reason(cause, failed), proc.exit_codes
        if _all_ranks_ended(state):
            return "SUCCEEDED", "every rank reported its end", None
        if cause is not None:
            return "FAILED", self._failure_reason(cause, "the processes are gone"), None
        return "UNKNOWN", "the processes are gone and the events do not say how the run ended", None

    @staticmethod
    def _failure_reason(cause: dict[str, Any] | None, fallback: str) -> str:
        if cause is None:
            return fallback
        return f"rank {cause['rank']} raised {cause.get('exc_type') or 'an error'}: {cause.get('message', '')}"

    def _log_root_cause(self) -> dict[str, Any] | None:
        lines = self.logs(tail=40)
        return {"rank": None, "message": "no error event; last console lines", "traceback": "\n".join(lines)} \
            if lines else None

    # -- waiting and stopping -------------------------------------------------------------
    def wait(self, timeout: float | None = None, poll_s: float = 0.25) -> JobStatus:
        """Block until the job ends (or ``timeout`` seconds pass) and return its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status.finished:
                self._join_watcher()
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return status
            time.sleep(poll_s)

    def cancel(self, grace_s: float = 10.0) -> JobStatus:
        """Stop the run: SIGTERM the whole process tree (scancel on Slurm), SIGKILL after ``grace_s``."""
        current = self.status()
        if current.finished:
            return current
        request_cancel(self.run_dir, "cancelled on request")
        for other in self.launch_info.get("sweep", {}).get("run_dirs", []):  # they share the processes it stops
            if Path(other) != self.run_dir and not status_path(Path(other)).is_file():
                request_cancel(Path(other), f"cancelled with {self.run_id}, whose processes it shares (one sweep)")
        self.backend.cancel(self.launch_info, grace_s)
        for proc in self._processes:
            try:
                proc.wait(timeout=grace_s + 10.0)
            except subprocess.TimeoutExpired:
                continue
        return self.status()

    def _join_watcher(self, timeout_s: float = 10.0) -> None:
        """Let the watcher end its last status write (a caller may remove the run directory once the job ends)."""
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout_s)

    def _start_watcher(self) -> None:
        def watch(job: Job, processes: list[Any]) -> None:
            for proc in processes:
                proc.wait()
            job.status()

        self._watcher = threading.Thread(target=watch, args=(self, list(self._processes)),
                                         name=f"workbench-job-{self.run_id}", daemon=True)
        self._watcher.start()

    # -- reading --------------------------------------------------------------------------
    def _console_files(self) -> list[Path]:
        logs = self._host_dir / LOGS_DIR
        return sorted(logs.glob("node*/console.log")) + sorted(logs.glob("slurm-*.out"))

    @staticmethod
    def _keep(line: str, rank: int | None) -> str | None:
        if rank is None:
            return line
        for prefix in (f"[rank{rank}]:", FALLBACK_PREFIX.format(rank=rank)):
            if line.startswith(prefix):
                return line[len(prefix):]
        return None

    def logs(self, rank: int | None = None, tail: int | None = 200, follow: bool = False):
        """Console lines (of one global ``rank`` if given): the last ``tail`` as a list, or with
        ``follow`` an iterator that keeps yielding new lines until the job ends."""
        check("rank", rank, optional(integer(0)))
        tailers = [TextTailer(path) for path in self._console_files()]
        lines = [kept for t in tailers for line in t.poll() if (kept := self._keep(line, rank)) is not None]
        recent = lines[-tail:] if tail else lines
        if not follow:
            return recent
        return self._follow(recent, tailers, rank)

    def _follow(self, recent: list[str], tailers: list[TextTailer], rank: int | None) -> Iterator[str]:
        yield from recent
        known = {t.path for t in tailers}
        while True:
            done = self.status().finished
            for path in self._console_files():
                if path not in known:
                    known.add(path)
                    tailers.append(TextTailer(path))
            for tailer in tailers:
                for line in tailer.poll():
                    kept = self._keep(line, rank)
                    if kept is not None:
                        yield kept
            if done:
                return
            time.sleep(0.2)

    def metrics(self):
        """Every ``step`` event so far as a pandas DataFrame (rank, step, t, loss, samples_per_s, ...)."""
        import pandas as pd

        state = self.refresh()
        with self._lock:
            frames = []
            for rank, columns in sorted(state.metrics.items()):
                frame = pd.DataFrame({name: columns.column(name).copy() for name in METRIC_FIELDS})
                frame.insert(0, "rank", rank)
                frames.append(frame)
        if not frames:
            return pd.DataFrame(columns=["rank", *METRIC_FIELDS])
        out = pd.concat(frames, ignore_index=True)
        out["step"] = out["step"].astype("Int64")
        out["restart"] = out["restart"].astype("Int64")
        return out

    def evals(self):
        """Every ``eval`` event so far as a pandas DataFrame (step, val_loss, accuracy, perplexity, train_s,
        wall_s, ...); the time to the run's target is in :meth:`status` (``time_to_target``)."""
        import pandas as pd

        with self._lock:
            series = self.refresh().eval_series()
        out = pd.DataFrame(series, columns=list(EVAL_FIELDS))
        out["step"] = out["step"].astype("Int64")
        return out

    def timeline(self, iteration: int | None = None):
        """The measured timeline of ``iteration`` (default: the latest complete one), starting at 0 ms."""
        with self._lock:
            return self.refresh().timeline(iteration)

    def monitor(self, **options: Any):
        """The live widget (loss, throughput, ranks, log tail, timeline, Cancel): the ``monitor`` viewer of
        :mod:`.viewers` (the widgets room's ``JobMonitor`` unless another is registered)."""
        from .viewers import viewer

        return viewer("monitor")(self, **options)

    def predicted_timeline(self, measured=None, *, cluster: str | None = "local-cpu"):
        """What the simulator predicts for this run's schedule, with the stage times the run measured.

        Compute comes from the run's own stage events; sends and gradient
        all-reduces are timed on the links of the ``cluster`` preset (default:
        this machine's gloo loopback, whose ranks share the machine's cores;
        None: free communication). ``None`` when the strategy is not a
        scheduled pipeline, no full iteration has been measured yet, or the
        simulator cannot predict the run (see ``scheduling.from_config``);
        :attr:`prediction_note` then says which, and :meth:`summary_figure`
        and the monitor show it.
        """
        prediction = predict_run(self.run_dir, measured, measure=self.timeline, cluster=cluster)
        self.prediction_note = prediction.note
        return prediction.timeline

    def summary_figure(self, simulated=None):
        """A static plotly figure of the run so far (for reports and headless runs).

        Without ``simulated`` the prediction is :meth:`predicted_timeline`.
        """
        return summary_figure(self, simulated)


def _all_ranks_ended(state: RunState) -> bool:
    """Every rank of the run reported its end, successfully."""
    ended = [s.end_status for s in state.ranks.values()]
    world = state.world_size or len(ended)
    return bool(ended) and len(ended) >= world and all(e == "SUCCEEDED" for e in ended)


def _eval_fields(state: RunState) -> dict[str, Any]:
    """The status fields folded from ``eval`` events (none when the events hold none, e.g. deleted)."""
    fields = {"last_eval": state.last_eval(), "time_to_target": state.time_to_target()}
    fields = {k: v for k, v in fields.items() if v is not None}
    if state.adaptations:  # an adapting async pipeline's decisions (also from the events, as the evaluations)
        fields["adaptations"] = tuple(dict(a) for a in state.adaptations)
    return fields


def launch(spec: LaunchSpec, backend: str = "local", *, check_entry: bool = True) -> Job:
    """Check ``spec``, make a fresh run directory, start the run on ``backend`` and return its handle.

    ``backend`` is ``"local"`` (torchrun here), ``"multinode"`` (torchrun per
    node, c10d rendezvous), ``"slurm"`` (sbatch) or ``"dryrun"`` (write the
    run directory and the command, start nothing). Every check happens before
    anything starts; a bad spec raises ``ValueError`` naming the field.
    """
    if not isinstance(spec, LaunchSpec):
        raise ValueError(f"spec must be a LaunchSpec, got {type(spec).__name__}")
    runner = get_backend(backend)
    runner.check(spec)
    check_launchable(spec, check_entry=check_entry)
    run_id, run_dir = new_run_dir(spec)
    try:
        started = runner.start(spec, run_dir, run_id)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return record_launch(spec, runner.name, run_id, run_dir, started)


def new_run_dir(spec: LaunchSpec) -> tuple[str, Path]:
    """A fresh run id and directory for ``spec``, holding its config and spec."""
    run_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    run_dir = resolve_run_root(spec) / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "events").mkdir()
    _write_json_atomic(run_dir / CONFIG_FILE, config_dict(spec.config))
    _write_json_atomic(run_dir / SPEC_FILE, spec.to_dict())
    return run_id, run_dir


def record_launch(spec: LaunchSpec, backend: str, run_id: str, run_dir: Path, started: Any,
                  **extra: Any) -> Job:
    """Write ``launch.json`` and the command of a started run; its handle, watched while its processes run."""
    info = {"backend": backend, "run_id": run_id, "host": socket.gethostname(), "start_time": time.time(),
            "world_size": spec.world_size, "commands": list(started.commands), **started.launch, **extra}
    _write_json_atomic(run_dir / LAUNCH_FILE, info)
    (run_dir / COMMAND_FILE).write_text("\n\n".join(started.commands) + "\n")
    job = Job(run_dir, processes=started.processes)
    if started.processes:
        job._start_watcher()
        _LIVE_JOBS.add(job)
    return job


def attach(run_dir: str | Path) -> Job:
    """Reconnect to a run from its directory (after a kernel restart, from another process)."""
    return Job(run_dir)


def _run_dirs(run_root: str | Path) -> list[Path]:
    root = Path(run_root).expanduser()
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if (p / LAUNCH_FILE).is_file()), key=lambda p: p.stat().st_mtime)


def list_runs(run_root: str | Path = "runs") -> list[dict[str, Any]]:
    """Every run under ``run_root`` (oldest first) with its backend and current state."""
    out = []
    for run_dir in _run_dirs(run_root):
        job = Job(run_dir)
        status = job.status()
        out.append({"run_id": job.run_id, "run_dir": str(job.run_dir), "backend": job.backend.name,
                    "state": status.state, "step": status.step, "started": job.launch_info.get("start_time")})
    return out


def reap(run_root: str | Path = "runs", *, force: bool = False, grace_s: float = 3.0) -> list[dict[str, Any]]:
    """Kill leftover processes of local runs under ``run_root``; return what was reaped.

    A leftover is any process of a run that has ended (workers orphaned when
    torchrun was killed) or of a run whose launching process is gone (a
    crashed kernel); with ``force``, every running local run is stopped.
    Runs without a final status get one (``CANCELLED``, reason ``reaped``).
    """
    reaped = []
    for run_dir in _run_dirs(run_root):
        info = _read_json(run_dir / LAUNCH_FILE) or {}
        if info.get("backend") not in ("local", "multinode"):
            continue
        sweep = info.get("sweep")
        if sweep and Path(sweep["run_dirs"][-1]).resolve() != run_dir.resolve():
            continue  # a sweep's shared processes are reaped with its last run
        roots = [(a["pid"], a.get("create_time")) for a in info.get("agents", [])]
        process_run_id = info.get("process_run_id", info["run_id"])  # a sweep's runs share the first's processes
        ended = status_path(run_dir).is_file()
        launcher_alive = process_alive(info.get("launcher_pid"), info.get("launcher_create_time"))
        if not ended and launcher_alive and not force:
            continue
        if not run_processes(process_run_id, roots) and ended:
            continue
        if not ended:
            request_cancel(run_dir, "reaped: its launching process was gone")
        killed = kill_processes(process_run_id, roots, grace_s=grace_s)
        status = Job(run_dir).status()
        reaped.append({"run_id": info["run_id"], "run_dir": str(run_dir), "killed": killed, "state": status.state})
    return reaped


@atexit.register
def _cancel_live_jobs() -> None:
    for job in list(_LIVE_JOBS):
        try:
            if not job.status().finished:
                job.cancel(grace_s=3.0)
        except Exception:  # noqa: BLE001 - interpreter shutdown: best effort, never raise
            continue
