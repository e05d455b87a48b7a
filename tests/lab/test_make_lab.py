"""`make lab` (scripts/lab.sh) starts a token-protected JupyterLab on 127.0.0.1 serving the tour."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest


def _load_lab_server():
    name = "workbench_tests_lab_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("lab_server.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


lab_server = _load_lab_server()
TOUR = "notebooks/00_tour.ipynb"


def _connections(processes):
    """Internet sockets of ``processes``, skipping short-lived helpers that exit meanwhile."""
    found = []
    for proc in processes:
        try:
            found.extend(proc.net_connections(kind="inet"))
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_lab_serves_the_tour_on_loopback_with_a_token(tmp_path):
    server = lab_server.start_lab(tmp_path)
    try:
        status, body = server.get(f"api/contents/{TOUR}")
        assert status == 200, body[:500]
        model = json.loads(body)
        assert model["type"] == "notebook"
        cells = model["content"]["cells"]
        assert len(cells) >= 5
        assert any("tour OK" in "".join(cell["source"]) for cell in cells)
        assert model["content"]["metadata"]["kernelspec"]["name"] == "python3"

        status, page = server.get(f"lab/tree/{TOUR}")
        assert status == 200
        assert "<html" in page.lower() and "jupyterlab" in page.lower()

        status, _ = server.get(f"api/contents/{TOUR}", token=False)
        assert status in (401, 403), f"the API answered {status} without the token"

        listening = [c.laddr for c in _connections(server.descendants()) if c.status == psutil.CONN_LISTEN]
        assert listening, "the server listens on no socket"
        assert {addr.ip for addr in listening} == {"127.0.0.1"}, listening
        port = int(server.url.rsplit(":", 1)[1])
        assert port in {addr.port for addr in listening}
    finally:
        leftovers = server.stop()
    assert leftovers == [], f"processes survived the stop: {leftovers}"
    assert server.process.returncode is not None
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the port still accepts connections"


def test_lab_refuses_a_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(["bash", str(lab_server.LAB_SCRIPT)], env={"PATH": "/usr/bin:/bin", "LAB_PORT": str(port)},
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr


@pytest.mark.parametrize("bad_port", ["eighty", "0", "70000"])
def test_lab_rejects_a_bad_port(bad_port):
    result = subprocess.run(["bash", str(lab_server.LAB_SCRIPT)], env={"PATH": "/usr/bin:/bin", "LAB_PORT": bad_port},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"LAB_PORT must be a port number in 1..65535, got '{bad_port}'" in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_saving_a_lesson_leaves_the_committed_notebook_unchanged_and_no_news_question(tmp_path):
    import urllib.request

    path = Path(lab_server.REPO_ROOT) / TOUR
    before = path.read_bytes()
    server = lab_server.start_lab(tmp_path)
    try:
        status, body = server.get(f"api/contents/{TOUR}")
        assert status == 200
        model = json.loads(body)
        notebook = model["content"]
        notebook["metadata"]["language_info"] = {"name": "python", "version": "3.11"}
        code = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")
        code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran in the lab\n"}]
        code["execution_count"] = 7
        code["metadata"]["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
        request = urllib.request.Request(server.with_token(f"api/contents/{TOUR}"), method="PUT",
                                         data=json.dumps({"type": "notebook", "format": "json",
                                                          "content": notebook}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
        saved = json.loads(path.read_text())
        assert all(not c.get("outputs") and c.get("execution_count") is None
                   for c in saved["cells"] if c["cell_type"] == "code")
        assert set(saved["metadata"]) <= {"jupytext", "kernelspec"}
        assert path.read_bytes() == before, "saving the tour changed the committed notebook"
        overrides = Path(lab_server.REPO_ROOT) / ".venv/share/jupyter/lab/settings/overrides.json"
        news = json.loads(overrides.read_text())["@jupyterlab/apputils-extension:notification"]
        assert news["fetchNews"] == "false" and news["checkForUpdates"] is False
    finally:
        path.write_bytes(before)
        leftovers = server.stop()
    assert leftovers == [], f"processes survived the stop: {leftovers}"
