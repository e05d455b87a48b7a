"""The summary of a GPU check: what ran where, what passed, what the benchmark measured.

Problem: ``scripts/gpu_check.sh`` leaves its evidence scattered over an
output folder (the phases it timed, the Python and GPU it found, the tier's
JUnit XML or, when the tier was stopped, only its log, and the benchmark's
``gpu.json``), on a machine that is taken back minutes later. One reader
must see at a glance whether the GPU tier and the benchmark passed, why a
test failed or was skipped, and the numbers, without opening five files.

Approach: read those files by their fixed names, each optional (a phase
that never ran left none), and write ``gpu_check.json`` (everything,
machine-readable) and ``gpu_check.md`` (tables) into the same folder.
Test counts come from the JUnit XML, or from the ``-v`` log when the XML is
missing; the log also names the test a time limit cut short.
``--not-run REASON`` writes the summary of a check that ran nothing (no
CUDA); ``--rehearsal`` marks one that ran on the CPU. Standard library only:
it must run on any Python the script finds.

    python scripts/gpu_summary.py --out OUT_DIR [--not-run REASON] [--rehearsal]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import socket
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

OUTCOMES = ("passed", "failed", "errors", "skipped")
VERBOSE_LINE = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
# pytest-xdist's verbose result: "[gw2] [ 84%] PASSED tests/...::test[id]"
XDIST_LINE = re.compile(r"^\[gw\d+\]\s+\[\s*\d+%\]\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+::\S+)")
STARTED_LINE = re.compile(r"^(\S+::\S+)\s*$")
SHORT_FAILURE = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+|\S+\.py) - (.*)$")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_phases(path: Path) -> list[dict[str, Any]]:
    """``name<TAB>status<TAB>seconds<TAB>detail`` lines, as written by gpu_check.sh."""
    phases = []
    if path.is_file():
        for line in path.read_text().splitlines():
            name, status, seconds, detail = (line.split("\t") + ["", "", ""])[:4]
            phases.append({"name": name, "status": status, "seconds": int(seconds) if seconds.isdigit() else None,
                           "detail": detail})
    return phases


def _first_line(text: str | None, limit: int = 300) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[0][:limit] if lines else ""


def tier_from_junit(path: Path) -> dict[str, Any]:
    """Counts and the failed / skipped tests (with their message) of a pytest JUnit XML file."""
    counts = dict.fromkeys(OUTCOMES, 0)
    failed, skipped = [], []
    for case in ET.parse(path).getroot().iter("testcase"):
        if not case.get("name"):  # the stub pytest leaves for a test cut short by KeyboardInterrupt
            continue
        name = "::".join(part for part in (case.get("classname"), case.get("name")) if part)
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                message = _first_line(child.get("message")) or _first_line(child.text)
                break
        counts[outcome] += 1
        if outcome in ("failed", "errors"):
            failed.append({"name": name, "outcome": outcome, "message": message})
        elif outcome == "skipped":
            skipped.append({"name": name, "reason": message})
    return {"source": "junit", **counts, "total": sum(counts.values()), "failed_tests": failed,
            "skipped_tests": skipped}


def tier_from_log(path: Path) -> dict[str, Any]:
    """The same from a ``pytest -v`` log (no JUnit XML: the run was stopped); names the test left running."""
    counts = dict.fromkeys(OUTCOMES, 0)
    failed, skipped, messages = [], [], {}
    running: dict[str, None] = {}  # started, not finished, in order (several at once under xdist)
    for line in path.read_text(errors="replace").splitlines():
        short = SHORT_FAILURE.match(line)
        if short:
            messages[short.group(1)] = short.group(2)[:300]
        match, xdist = VERBOSE_LINE.match(line), XDIST_LINE.match(line)
        if match or xdist:
            name, word = match.groups() if match else xdist.groups()[::-1]
            outcome = {"PASSED": "passed", "XFAIL": "passed", "XPASS": "passed", "FAILED": "failed",
                       "ERROR": "errors", "SKIPPED": "skipped"}[word]
            counts[outcome] += 1
            (failed if outcome in ("failed", "errors") else skipped if outcome == "skipped" else []).append(name)
            running.pop(name, None)
        elif STARTED_LINE.match(line):
            running[line.strip()] = None
    return {"source": "log", **counts, "total": sum(counts.values()),
            "failed_tests": [{"name": n, "message": messages.get(n, "")} for n in failed],
            "skipped_tests": [{"name": n, "reason": ""} for n in skipped],
            "running_when_stopped": ", ".join(running) or None}


def read_tier(out: Path) -> dict[str, Any] | None:
    junit, log = out / "junit.xml", out / "tier.log"
    from_log = tier_from_log(log) if log.is_file() else None
    if junit.is_file():
        try:  # a tier stopped by its time limit still writes the XML; the log names the test it cut short
            return {**tier_from_junit(junit), "running_when_stopped": (from_log or {}).get("running_when_stopped")}
        except ET.ParseError:
            pass
    return from_log


def _model_name(model) -> str | None:
    """A run config's model: its name, whether the config gave a name or a [model] table."""
    return model.get("name") if isinstance(model, dict) else model


def read_bench(path: Path) -> dict[str, Any] | None:
    """The benchmark's headline numbers from its ``gpu.json`` (the whole file is copied beside the summary)."""
    results = read_json(path)
    if not isinstance(results, dict):
        return None
    mfu, profiled, pipeline = results.get("mfu") or {}, results.get("profile") or {}, results.get("pipeline") or {}
    runs = {name: {k: run.get(k) for k in ("step_ms", "tokens_per_s", "tflops", "mfu", "warmup_s")}
            for name, run in (mfu.get("runs") or {}).items()}
    rows = [{k: row.get(k) for k in ("a_plan", "a_samples_per_s", "b_plan", "b_samples_per_s", "ratio")}
            | {"backends": sorted(set(row.get("a_backends", [])) | set(row.get("b_backends", [])))}
            for row in pipeline.get("rows", [])]
    return {"device": results.get("device"), "torch": results.get("torch"), "smoke": results.get("smoke", False),
            "peak_tflops": results.get("peak_tflops"), "wall_s": results.get("wall_s"),
            "model": mfu.get("model"), "batch": mfu.get("batch"), "seq_len": mfu.get("seq_len"),
            "flops_per_step": mfu.get("flops_per_step"), "flops_source": mfu.get("flops_source"), "runs": runs,
            "profile": {k: profiled.get(k) for k in ("sum_ms", "fwd_bwd_ms", "step_ms", "sum_over_fwd_bwd",
                                                      "sum_over_step")} if profiled else None,
            "pipeline": rows, "pipeline_model": _model_name((pipeline.get("fields") or {}).get("model")),
            "errors": results.get("errors") or {}}


def overall(phases: list[dict], tier: dict | None, not_run: str | None) -> str:
    if not_run:
        return "not run"
    ran = {p["name"]: p["status"] for p in phases}
    bad_phase = any(ran.get(name) != "ok" for name in ("setup", "bench", "tier"))
    bad_tests = tier is None or tier["failed"] + tier["errors"] > 0 or tier["total"] == 0
    return "failed" if bad_phase or bad_tests else "passed"


def summarise(out: Path, not_run: str | None = None, rehearsal: bool = False) -> dict[str, Any]:
    phases = read_phases(out / "phases.tsv")
    tier = None if not_run else read_tier(out)
    return {"status": overall(phases, tier, not_run), "reason": not_run, "rehearsal": rehearsal,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(), "environment": read_json(out / "env.json"),
            "setup": read_json(out / "setup.json"), "phases": phases, "tier": tier,
            "bench": None if not_run else read_bench(out / "gpu.json")}


def _num(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown_head(summary: dict) -> list[str]:
    kind = "GPU check (CPU rehearsal: it proves the script, not the GPU)" if summary["rehearsal"] else "GPU check"
    lines = [f"# {kind}: {summary['status'].upper()}", ""]
    if summary["reason"]:
        lines += [summary["reason"], ""]
    env, setup = summary["environment"] or {}, summary["setup"] or {}
    if env:
        gpu = f"{env.get('gpu')} x {env.get('gpus')}"
        if env.get("memory_gib"):
            gpu += f" ({env['memory_gib']} GiB, compute capability {env.get('capability')})"
        lines += ["| | |", "|---|---|", f"| GPU | {gpu} |", f"| driver | {env.get('driver') or 'n/a'} |",
                  f"| torch | {env.get('torch')} (CUDA {env.get('cuda')}, cuDNN {env.get('cudnn') or 'n/a'}) |",
                  f"| Python | {env.get('python')} ({env.get('executable')}) |",
                  f"| workbench | {setup.get('workbench')} |",
                  f"| installed | {', '.join(setup.get('installed') or []) or 'nothing'} |", ""]
    if summary["phases"]:
        lines += ["## Phases", "", "| phase | status | seconds | detail |", "|---|---|---:|---|"]
        lines += [f"| {p['name']} | {p['status']} | {_num(p['seconds'], 'd')} | {p['detail'][:200]} |"
                  for p in summary["phases"]]
        lines.append("")
    return lines


def markdown_tier(tier: dict | None) -> list[str]:
    if tier is None:
        return ["## GPU tier", "", "did not run", ""]
    lines = ["## GPU tier", "", f"{tier['passed']} passed, {tier['failed']} failed, {tier['errors']} errors, "
             f"{tier['skipped']} skipped (of {tier['total']}; from the {tier['source']})", ""]
    if tier.get("running_when_stopped"):
        lines += [f"stopped while running `{tier['running_when_stopped']}`", ""]
    for title, key, field in (("Failed", "failed_tests", "message"), ("Skipped", "skipped_tests", "reason")):
        if tier[key]:
            lines += [f"### {title}", ""] + [f"- `{t['name']}`: {t[field]}" for t in tier[key]] + [""]
    return lines


def markdown_bench(bench: dict | None) -> list[str]:
    if bench is None:
        return ["## Benchmark", "", "no results", ""]
    lines = ["## Benchmark (bench/bench_gpu.py)", "",
             f"{bench['device']}, torch {bench['torch']}, peak {_num(bench['peak_tflops'], '.1f')} TFLOP/s; "
             f"{bench['model']} batch {bench['batch']} x {bench['seq_len']} tokens, "
             f"{_num(bench['flops_per_step'] and bench['flops_per_step'] / 1e12, '.3f')} TFLOP per step "
             f"({bench['flops_source']})", "",
             "| step | ms | tokens/s | TFLOP/s | MFU | warm-up s |", "|---|---:|---:|---:|---:|---:|"]
    for name, run in bench["runs"].items():
        lines.append(f"| {name} | {_num(run['step_ms'], '.2f')} | {_num(run['tokens_per_s'], '.0f')} | "
                     f"{_num(run['tflops'], '.1f')} | {_num(run['mfu'], '.3f')} | {_num(run['warmup_s'], '.1f')} |")
    profiled = bench["profile"]
    if profiled:
        lines += ["", f"profile sum of per-layer forward + backward {_num(profiled['sum_ms'], '.2f')} ms: "
                  f"{_num(profiled['sum_over_fwd_bwd'], '.3f')} x the eager forward + backward, "
                  f"{_num(profiled['sum_over_step'], '.3f')} x the eager step"]
    if bench["pipeline"]:
        lines += ["", f"1F1B, 2 ranks sharing one GPU ({bench['pipeline_model']}):", "",
                  "| ours | samples/s | torch | samples/s | ours / torch | backend |", "|---|---:|---|---:|---:|---|"]
        lines += [f"| {r['a_plan']} | {_num(r['a_samples_per_s'], '.1f')} | {r['b_plan']} | "
                  f"{_num(r['b_samples_per_s'], '.1f')} | {_num(r['ratio'], '.3f')} | {', '.join(r['backends'])} |"
                  for r in bench["pipeline"]]
    lines += [""] + [f"- FAILED {part}: {_first_line(message)}" for part, message in bench["errors"].items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the check's output folder (read and written)")
    parser.add_argument("--not-run", default=None, metavar="REASON", help="nothing ran, for this reason")
    parser.add_argument("--rehearsal", action="store_true", help="the check ran on the CPU (GPU_CHECK_REHEARSAL)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = summarise(args.out, args.not_run, args.rehearsal)
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = markdown_head(summary)
    if not args.not_run:
        lines += markdown_tier(summary["tier"]) + markdown_bench(summary["bench"])
    (args.out / "gpu_check.md").write_text("\n".join(lines).rstrip() + "\n")
    tier = summary["tier"]
    counts = f"; tier {tier['passed']} passed, {tier['failed'] + tier['errors']} failed, {tier['skipped']} skipped" \
        if tier else ""
    print(f"gpu-check summary: {summary['status']}{counts} -> {args.out / 'gpu_check.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
