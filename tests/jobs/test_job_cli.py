import json
import subprocess
import sys
import time

from job_test_helpers import WORKER, WORKER_DIR, write_synthetic_run
from workbench.cli import main

TOML = f"""
[worker]
steps = 3

[launch]
entry = "{WORKER}"
nproc_per_node = 1
name = "cli"
env = {{ PYTHONPATH = "{WORKER_DIR}" }}
"""


def test_launch_dryrun_from_toml_with_overrides(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(TOML)
    code = main(["launch", str(config), "--backend", "dryrun", "--nproc", "2", "--run-root", str(tmp_path / "runs"),
                 "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert "--nproc-per-node 2" in data["commands"][0] and f"-m {WORKER}" in data["commands"][0]
    run_dir = tmp_path / "runs" / data["run_id"]
    assert json.loads((run_dir / "config.json").read_text()) == {"worker": {"steps": 3}}


def test_launch_refuses_bad_input_with_one_line(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(TOML.replace('name = "cli"', 'name = "has space"'))
    out = subprocess.run([sys.executable, "-m", "workbench.cli", "launch", str(config), "--backend", "dryrun"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "LaunchSpec.name" in out.stderr
    out = subprocess.run([sys.executable, "-m", "workbench.cli", "launch", str(tmp_path / "nope.toml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_status_logs_and_cancel_of_a_run(tmp_path, capsys):
    run_dir = write_synthetic_run(tmp_path, steps=3)
    assert main(["status", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert "SUCCEEDED" in text and text.count("SUCCEEDED") >= 3
    assert main(["logs", run_dir.name, "--run-root", str(tmp_path), "--rank", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lines"] == [f"step {s} on rank 1" for s in range(3)]
    assert main(["logs", str(run_dir), "-f", "--tail", "2"]) == 0  # a finished run: prints and returns
    assert capsys.readouterr().out.splitlines() == ["[rank1]:step 1 on rank 1", "[rank1]:step 2 on rank 1"]
    assert main(["cancel", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "SUCCEEDED"  # already over: nothing to cancel
    assert main(["status", str(tmp_path / "missing")]) == 2


def test_cancel_stops_a_running_process_tree(tmp_path, capsys):
    run_dir = write_synthetic_run(tmp_path, steps=1, with_end=False, t0=time.time())
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    launch = json.loads((run_dir / "launch.json").read_text())
    launch["agents"][0]["pid"] = sleeper.pid
    (run_dir / "launch.json").write_text(json.dumps(launch))
    try:
        assert main(["status", str(run_dir), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "RUNNING"
        assert main(["cancel", str(run_dir), "--grace", "2", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "CANCELLED"
        assert sleeper.wait(timeout=10) is not None
    finally:
        sleeper.kill()
