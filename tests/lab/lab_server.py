"""A real JupyterLab server for tests, started the way `make lab` starts it.

Problem: tests of `make lab` and of notebooks in a browser need the server a
user gets (scripts/lab.sh: 127.0.0.1, token, repository root), but must not
touch the user's JupyterLab state, must never write outputs into committed
notebooks, and must leave no process behind, including the kernels the
server started.

Approach: run scripts/lab.sh in its own session on a free port with a known
token, and give it throw-away settings, workspaces and runtime folders. The
settings turn autosave off (a run in the browser stays in the browser),
render every cell (no windowing, so page text holds every output) and keep
the news question away. :meth:`LabServer.stop` remembers every descendant
before signalling, sends SIGTERM to the server's process group (the server
then shuts its kernels down), escalates to SIGKILL, and reports whatever had
to be killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
LAB_SCRIPT = REPO_ROOT / "scripts" / "lab.sh"

# JupyterLab user settings for tests: plugin id -> settings.
TEST_SETTINGS = {
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_user_settings(settings_dir: Path, settings: dict[str, dict] = TEST_SETTINGS) -> None:
    """Write JupyterLab user settings files (``<package>/<plugin>.jupyterlab-settings``)."""
    for plugin_id, values in settings.items():
        package, _, plugin = plugin_id.partition(":")
        path = settings_dir / package / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@dataclass
class LabServer:
    """A running scripts/lab.sh: base ``url``, ``token``, served ``root``."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen
    log_path: Path
    _known: dict[int, psutil.Process] = field(default_factory=dict)

    def with_token(self, path: str) -> str:
        """Absolute URL of ``path`` on the server, token attached."""
        separator = "&" if "?" in path else "?"
        return f"{self.url}/{path.lstrip('/')}{separator}token={self.token}"

    def notebook_url(self, notebook: str) -> str:
        """The JupyterLab page that opens ``notebook`` (a path relative to the root)."""
        return self.with_token(f"lab/tree/{notebook}")

    def get(self, path: str, *, token: bool = True, timeout: float = 10.0) -> tuple[int, str]:
        """HTTP GET; returns ``(status, body)`` for any status, with or without the token."""
        url = self.with_token(path) if token else f"{self.url}/{path.lstrip('/')}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")

    def request(self, method: str, path: str, timeout: float = 10.0) -> int:
        """An HTTP request with the token in the header (the server checks XSRF on cookies only)."""
        req = urllib.request.Request(f"{self.url}/{path.lstrip('/')}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def descendants(self) -> list[psutil.Process]:
        """The server process and everything it started (kernels included), remembered for :meth:`stop`."""
        try:
            root = psutil.Process(self.process.pid)
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            found = []
        for proc in found:
            self._known.setdefault(proc.pid, proc)
        return found

    def shutdown_sessions(self, path_prefix: str = "") -> int:
        """Shut down the kernels of notebook sessions under ``path_prefix``; returns how many."""
        status, body = self.get("api/sessions")
        if status != 200:
            return 0
        sessions = [s for s in json.loads(body) if s.get("path", "").startswith(path_prefix)]
        for session in sessions:
            self.request("DELETE", f"api/sessions/{session['id']}")
        return len(sessions)

    def stop(self, grace_s: float = 20.0) -> list[str]:
        """Stop the server and its kernels; returns descriptions of processes that had to be killed."""
        self.descendants()
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        deadline = time.monotonic() + 10.0
        leftovers = []
        for proc in self._known.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except psutil.TimeoutExpired:
                try:
                    leftovers.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:120]}")
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            except psutil.NoSuchProcess:
                pass
        return leftovers


def start_lab(work_dir: Path, *, extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
              timeout_s: float = 90.0) -> LabServer:
    """Start scripts/lab.sh on a free port and wait until its API answers.

    ``work_dir`` receives the log and the throw-away settings, workspaces and
    runtime folders; ``env`` adds variables for the server and its kernels.
    """
    port, token = free_port(), f"test-{os.getpid()}-{time.monotonic_ns()}"
    settings_dir = work_dir / "lab-settings"
    write_user_settings(settings_dir)
    child_env = {key: value for key, value in os.environ.items() if key not in ("DISPLAY", "WAYLAND_DISPLAY")}
    child_env.update({
        "LAB_PORT": str(port),
        "JUPYTER_TOKEN": token,
        "JUPYTERLAB_SETTINGS_DIR": str(settings_dir),
        "JUPYTERLAB_WORKSPACES_DIR": str(work_dir / "lab-workspaces"),
        "JUPYTER_RUNTIME_DIR": str(work_dir / "jupyter-runtime"),
        **(env or {}),
    })
    log_path = work_dir / "lab.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(["bash", str(LAB_SCRIPT), *extra_args], cwd=REPO_ROOT, env=child_env,
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    server = LabServer(url=f"http://127.0.0.1:{port}", token=token, root=REPO_ROOT, process=process,
                       log_path=log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"scripts/lab.sh exited with {process.returncode} before answering:\n{server.log()[-3000:]}")
        try:
            if server.get("api/status", timeout=2.0)[0] == 200:
                return server
        except OSError:
            pass
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"JupyterLab did not answer on {server.url} within {timeout_s:.0f} s:\n{server.log()[-3000:]}")
