"""The GPU check's plumbing, on a machine without CUDA, in seconds.

``scripts/gpu_check.sh`` and ``bench/bench_gpu.py`` only measure anything on a
GPU, which CI never has. What can be checked here is what they do without
one (exit 0, say that nothing ran, write no numbers) and the summary logic:
``scripts/gpu_summary.py`` turns a hand-made JUnit XML file and ``gpu.json``
into the JSON and Markdown summary with the right counts, names and numbers,
and falls back to the ``pytest -v`` log when the tier was stopped before
writing its XML (or names from it the test a time limit cut short).
Nothing here launches torchrun.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="6">
  <testcase classname="tests.gpu.test_runs_cuda" name="test_bf16[pp2-1f1b-m4]" time="9.1"/>
  <testcase classname="tests.gpu.test_runs_cuda" name="test_bf16[dp2-m2]" time="8.0"/>
  <testcase classname="tests.gpu.test_runs_cuda" name="test_fp32[tp1d-2-dp1]" time="7.5">
    <failure message="AssertionError: losses differ">long traceback</failure></testcase>
  <testcase classname="tests.gpu.test_profile_cuda" name="test_events" time="0.1">
    <error message="failed on setup with &quot;RuntimeError: CUDA error&quot;">trace</error></testcase>
  <testcase classname="tests.gpu.test_runs_cuda" name="test_two_gpus" time="0.0">
    <skipped type="pytest.skip" message="needs 2 GPUs, this machine has 1">tests/gpu/test_runs_cuda.py:60</skipped>
  </testcase>
  <testcase classname="tests.gpu.test_monitor_cuda" name="test_rehearsed" time="0.0">
    <skipped type="pytest.skip" message="needs CUDA itself (rehearsal on CPU)">skip</skipped></testcase>
  <testcase time="0.001"/>
</testsuite></testsuites>
"""

BENCH = {
    "topic": "gpu", "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "peak_tflops": 989.4, "smoke": False,
    "mfu": {"model": "gpt2-small", "batch": 16, "seq_len": 1024, "flops_per_step": 2.0e13,
            "flops_source": "profiler (FlopCounterMode)",
            "runs": {"eager": {"step_ms": 100.0, "tokens_per_s": 163840.0, "tflops": 200.0, "mfu": 0.2021,
                               "warmup_s": 2.0},
                     "compiled": {"step_ms": 80.0, "tokens_per_s": 204800.0, "tflops": 250.0, "mfu": 0.2527,
                                  "warmup_s": 60.0}}},
    "profile": {"sum_ms": 90.0, "fwd_bwd_ms": 95.0, "step_ms": 100.0, "sum_over_fwd_bwd": 0.947, "sum_over_step": 0.9},
    "pipeline": {"fields": {"model": "resnet18"},
                 "rows": [{"a_plan": "pp2-1f1b-m4", "a_samples_per_s": 800.0, "b_plan": "torchpp2-1f1b-m2",
                           "b_samples_per_s": 640.0, "ratio": 1.25, "a_backends": ["staged"],
                           "b_backends": ["staged"]}]},
    "errors": {},
}
PHASES = "find-python\tok\t3\t/opt/torch/.venv/bin/python3\nsetup\tok\t12\t{}\nbench\tok\t200\trc 0\n"


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", GPU_CHECK_NO_INSTALL="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, **kwargs)


@NO_CUDA
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_without_cuda_exits_0_with_a_summary_that_nothing_ran(tmp_path):
    out = tmp_path / "check"
    proc = run(["bash", "scripts/gpu_check.sh", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["status"] == "not run" and "CUDA is not available" in summary["reason"]
    assert summary["tier"] is None and summary["bench"] is None
    assert (out / "gpu_check.md").read_text().startswith("# GPU check: NOT RUN")
    assert not (out / "junit.xml").exists() and not (out / "gpu.json").exists()


@NO_CUDA
def test_bench_gpu_without_cuda_measures_and_writes_nothing(tmp_path):
    default = ROOT / "bench" / "results" / "gpu.json"
    before = default.stat().st_mtime_ns if default.exists() else None
    proc = run([sys.executable, "bench/bench_gpu.py", "--out", str(tmp_path / "gpu.json")])
    assert proc.returncode == 0, proc.stderr
    assert "nothing measured, nothing written" in proc.stdout
    assert not (tmp_path / "gpu.json").exists()
    assert (default.stat().st_mtime_ns if default.exists() else None) == before


def summarise(folder: Path, *extra: str) -> dict:
    proc = run([sys.executable, "scripts/gpu_summary.py", "--out", str(folder), *extra])
    assert proc.returncode == 0, proc.stderr
    return json.loads((folder / "gpu_check.json").read_text())


def test_summary_counts_the_junit_file_and_copies_the_benchmark_numbers(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    (tmp_path / "gpu.json").write_text(json.dumps(BENCH))
    (tmp_path / "phases.tsv").write_text(PHASES + "tier\tfailed\t150\trc 1, limit 300s\n")
    (tmp_path / "env.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "gpus": 1, "driver": "580.1",
                                                  "torch": "2.11.0+cu130", "cuda": "13.0"}))
    summary = summarise(tmp_path)
    tier = summary["tier"]
    assert (tier["passed"], tier["failed"], tier["errors"], tier["skipped"], tier["total"]) == (2, 1, 1, 2, 6)
    assert tier["source"] == "junit"
    failed = {t["name"]: t["message"] for t in tier["failed_tests"]}
    assert failed == {"tests.gpu.test_runs_cuda::test_fp32[tp1d-2-dp1]": "AssertionError: losses differ",
                      "tests.gpu.test_profile_cuda::test_events": 'failed on setup with "RuntimeError: CUDA error"'}
    assert {t["reason"] for t in tier["skipped_tests"]} == {"needs 2 GPUs, this machine has 1",
                                                             "needs CUDA itself (rehearsal on CPU)"}
    assert summary["status"] == "failed"
    bench = summary["bench"]
    assert bench["runs"]["compiled"]["mfu"] == 0.2527 and bench["profile"]["sum_over_step"] == 0.9
    assert bench["pipeline"][0]["backends"] == ["staged"] and bench["pipeline"][0]["ratio"] == 1.25
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert markdown.startswith("# GPU check: FAILED")
    assert "2 passed, 1 failed, 1 errors, 2 skipped (of 6; from the junit)" in markdown
    assert "`tests.gpu.test_runs_cuda::test_fp32[tp1d-2-dp1]`: AssertionError: losses differ" in markdown
    assert "| compiled | 80.00 | 204800 | 250.0 | 0.253 | 60.0 |" in markdown
    assert "| pp2-1f1b-m4 | 800.0 | torchpp2-1f1b-m2 | 640.0 | 1.250 | staged |" in markdown
    assert "NVIDIA H100 80GB HBM3" in markdown and "580.1" in markdown
    assert tier["running_when_stopped"] is None


def test_summary_names_the_test_a_time_limit_cut_short_beside_the_junit_counts(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    (tmp_path / "tier.log").write_text("tests/gpu/test_runs_cuda.py::test_bf16[dp2-m2] PASSED [ 50%]\n"
                                       "tests/gpu/test_runs_cuda.py::test_fp32[pp2-1f1b-m4] \n\n"
                                       "!!!!!!!!!!!!!!!!!!!! KeyboardInterrupt !!!!!!!!!!!!!!!!!!!!\n")
    (tmp_path / "phases.tsv").write_text(PHASES + "tier\ttimeout\t300\trc 124, limit 300s\n")
    summary = summarise(tmp_path)
    assert summary["tier"]["source"] == "junit" and summary["tier"]["total"] == 6
    assert summary["tier"]["running_when_stopped"] == "tests/gpu/test_runs_cuda.py::test_fp32[pp2-1f1b-m4]"
    assert summary["status"] == "failed"


def test_summary_reads_xdist_logs_and_names_every_test_still_running(tmp_path):
    started = ["tests/gpu/test_runs_cuda.py::test_fp32[dp2-m2]", "tests/gpu/test_runs_cuda.py::test_fp32[tp2d-2x2-dp1]",
               "tests/gpu/test_runs_cuda.py::test_bf16[pp2-1f1b-m4]"]
    log = "".join(f"{name} \n" for name in started)
    log += f"[gw0] [ 33%] PASSED {started[0]} \n[gw1] [ 67%] FAILED {started[2]} \n"
    (tmp_path / "tier.log").write_text(log + "!!!!!!!!!!!!!!!!!!!! KeyboardInterrupt !!!!!!!!!!!!!!!!!!!!\n")
    (tmp_path / "phases.tsv").write_text(PHASES + "tier\ttimeout\t300\trc 124, limit 300s\n")
    tier = summarise(tmp_path)["tier"]
    assert (tier["source"], tier["passed"], tier["failed"]) == ("log", 1, 1)
    assert tier["running_when_stopped"] == started[1]
    (tmp_path / "tier.log").write_text(log + f"[gw2] [100%] PASSED {started[1]} \n")
    assert summarise(tmp_path)["tier"]["running_when_stopped"] is None  # all finished: nothing was cut short


def test_summary_passes_when_every_phase_and_test_passed(tmp_path):
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.gpu.test_a" name="test_one"/>'
        '<testcase classname="tests.gpu.test_a" name="test_two"><skipped message="needs 2 GPUs"/></testcase>'
        '</testsuite></testsuites>')
    (tmp_path / "gpu.json").write_text(json.dumps(BENCH))
    (tmp_path / "phases.tsv").write_text(PHASES + "tier\tok\t150\trc 0\n")
    summary = summarise(tmp_path)
    assert (summary["tier"]["passed"], summary["tier"]["skipped"], summary["tier"]["failed"]) == (1, 1, 0)
    assert summary["status"] == "passed"
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU check: PASSED")


def test_summary_reads_the_verbose_log_when_the_tier_was_stopped(tmp_path):
    (tmp_path / "tier.log").write_text(
        "collected 4 items\n\n"
        "tests/gpu/test_profile_cuda.py::test_events PASSED                     [ 25%]\n"
        "tests/gpu/test_runs_cuda.py::test_bf16[dp2-m2] SKIPPED (needs 2 GPUs)  [ 50%]\n"
        "tests/gpu/test_runs_cuda.py::test_fp32[pp2-1f1b-m4] FAILED             [ 75%]\n"
        "tests/gpu/test_runs_cuda.py::test_fp32[tp1d-2-dp1] ")
    (tmp_path / "phases.tsv").write_text(PHASES + "tier\ttimeout\t300\trc 124, limit 300s\n")
    summary = summarise(tmp_path)
    tier = summary["tier"]
    assert tier["source"] == "log" and (tier["passed"], tier["failed"], tier["skipped"]) == (1, 1, 1)
    assert tier["running_when_stopped"] == "tests/gpu/test_runs_cuda.py::test_fp32[tp1d-2-dp1]"
    assert summary["status"] == "failed" and summary["bench"] is None
    assert "stopped while running" in (tmp_path / "gpu_check.md").read_text()


def test_the_tier_files_are_the_test_files_that_mark_tests_gpu():
    proc = run([sys.executable, "scripts/gpu_imports.py", "--tier-files"])
    files = proc.stdout.split()
    assert "tests/gpu/test_profile_cuda.py" in files and "tests/test_gpu_check.py" not in files
    marker = "pytest.mark." + "gpu"  # spelt apart so that this file is not a tier file itself
    assert files and all(marker in (ROOT / f).read_text() for f in files)
