"""Run every benchmark in bench/ and collect their JSON results.

Each ``bench/bench_*.py`` is a standalone script that prints a table and
writes ``bench/results/<topic>.json``. This runner executes them one after
another (never in parallel: they time things) and writes
``bench/results/summary.json`` mapping topic -> result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    only = set(argv)
    scripts = sorted(p for p in HERE.glob("bench_*.py") if not only or p.stem.removeprefix("bench_") in only)
    failures = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)], cwd=HERE.parent)
        print(f"== {script.name}: exit {rc} in {time.perf_counter() - t0:.1f} s", flush=True)
        if rc:
            failures.append(script.name)
    results = {}
    for path in sorted((HERE / "results").glob("*.json")):
        if path.name != "summary.json":
            results[path.stem] = json.loads(path.read_text())
    (HERE / "results" / "summary.json").write_text(json.dumps(results, indent=1))
    if failures:
        print("failed:", ", ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
