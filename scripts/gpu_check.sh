#!/usr/bin/env bash
# scripts/gpu_check.sh OUT_DIR: the GPU tier and bench/bench_gpu.py on this machine's GPU, summarised.
#
# Problem: a GPU is lent for minutes, usually as an image without internet whose
# Python has a CUDA torch but few of the project's other packages, sometimes as a
# bare machine with internet. Either way we want one command that tests, measures
# and leaves a summary within 10 minutes, never reinstalls torch, and says so
# plainly (exit 0) when no torch can see CUDA.
#
# Approach: take the first Python whose torch sees CUDA (.venv, then python3); a
# machine with a GPU, no such Python and no .venv gets `make install` first. With
# none, write a "not run" summary and stop. Otherwise make the workbench importable
# (editable install without dependencies, else PYTHONPATH), install only what
# scripts/gpu_imports.py finds missing (every wheel of .whl/ without the index when
# it holds any, else from the index with torch pinned), run bench/bench_gpu.py, then
# the tier's test files with the time left, and let scripts/gpu_summary.py write
# OUT_DIR/gpu_check.{json,md}. Exit 1 when the tier or the benchmark failed.
# Knobs: GPU_CHECK_BUDGET_S (whole run, 585), GPU_CHECK_BENCH_S (300),
# GPU_CHECK_BENCH_ARGS (more arguments for bench_gpu.py, e.g. "--skip gpt2"), GPU_CHECK_NO_INSTALL=1 (never `make install`),
# GPU_CHECK_WORKERS (tier tests at once with pytest-xdist; default 3 on a machine with 8 or more cores and
# xdist, else 0), GPU_CHECK_PYTHON (try that Python
# first), GPU_CHECK_REHEARSAL=1 (the same steps on a CPU: bench --smoke and the tier's
# CPU rehearsal; it checks this script, not the GPU).
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 2
cd "$ROOT" || exit 2
BUDGET=${GPU_CHECK_BUDGET_S:-585}
BENCH_MAX=${GPU_CHECK_BENCH_S:-300}
REHEARSAL=${GPU_CHECK_REHEARSAL:-0}
SITE="$ROOT/.gpu-site"  # packages and metadata for a Python that pip cannot write to
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
rm -f "$OUT"/phases.tsv "$OUT"/probe.txt "$OUT"/env.json "$OUT"/setup.json "$OUT"/junit.xml "$OUT"/tier.log \
      "$OUT"/bench.log "$OUT"/gpu.json "$OUT"/gpu_check.json "$OUT"/gpu_check.md "$OUT"/setup.log \
      "$OUT"/constraints.txt

log() { printf '[gpu-check %3ds] %s\n' "$SECONDS" "$*"; }
# phase NAME STATUS SECONDS DETAIL: one line of OUT/phases.tsv for the summary
phase() { local detail=${4:-}; printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${detail//$'\t'/ }" >>"$OUT/phases.tsv"; }
left() { echo $((BUDGET - SECONDS)); }

# probe PYTHON: "torch VERSION cuda True|False" (or why not) into probe.txt; success when CUDA is there
probe() {
    local py=$1 answer
    [ -x "$py" ] || { printf '%s\tabsent\n' "$py" >>"$OUT/probe.txt"; return 1; }
    answer=$(timeout 180 "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
             2>/dev/null | tail -n 1)
    printf '%s\t%s\n' "$py" "${answer:-no torch}" >>"$OUT/probe.txt"
    [[ "$answer" == *"cuda True" ]] || { [ "$REHEARSAL" = 1 ] && [[ "$answer" == torch* ]]; }
}

find_python() {
    local py
    for py in ${GPU_CHECK_PYTHON:-} "$ROOT/.venv/bin/python" "$(command -v python3 || true)"; do
        [ -n "$py" ] && probe "$py" && { echo "$py"; return 0; }
    done
    return 1
}

gpu_visible() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

summary_python() {
    local py
    for py in "${PY:-}" "$(command -v python3 || true)" "$ROOT/.venv/bin/python" "$(command -v python || true)"; do
        [ -n "$py" ] && [ -x "$py" ] && { echo "$py"; return 0; }
    done
    return 1
}

# install_missing DIST...: from .whl/ alone when it holds wheels (all of them, so their dependencies come
# too; what is installed already stays as it is), else from the index with torch and friends pinned
install_missing() {
    local wheels=() names=() f
    for f in "$ROOT"/.whl/*.whl; do [ -e "$f" ] && wheels+=("$f"); done
    if [ ${#wheels[@]} -gt 0 ]; then
        for f in "${wheels[@]}"; do names+=("$(basename "$f" | cut -d- -f1)"); done
        pip_install --no-index --no-deps --find-links "$ROOT/.whl" "$@" "${names[@]}"
    else
        "$PY" -c 'import importlib.metadata as m
for n in ("torch", "torchvision", "torchaudio", "triton"):
    try: print(f"{n}=={m.version(n)}")
    except m.PackageNotFoundError: pass' >"$OUT/constraints.txt"
        pip_install -c "$OUT/constraints.txt" "$@"
    fi
}

# pip_install ARGS...: into the Python's environment, else into $SITE (then on PYTHONPATH)
pip_install() {
    "$PY" -m pip install --quiet "$@" >>"$OUT/setup.log" 2>&1 && return 0
    log "pip could not install into $PY's environment; trying $SITE"
    use_site && "$PY" -m pip install --quiet --target "$SITE" "$@" >>"$OUT/setup.log" 2>&1
}

use_site() {
    mkdir -p "$SITE" || return 1
    case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
}

# dists: name==version of every distribution the Python sees (PYTHONPATH included), sorted
dists() {
    "$PY" -c 'import importlib.metadata as m
print("\n".join({f"{d.name}=={d.version}" for d in m.distributions()}))' 2>/dev/null | LC_ALL=C sort
}

# setup: pip, the workbench importable from this checkout, the missing packages; details into setup.json
setup() {
    local where method installed=() missing="" round
    if ! "$PY" -m pip --version >/dev/null 2>&1; then
        "$PY" -m ensurepip --upgrade >>"$OUT/setup.log" 2>&1 || log "no pip and ensurepip failed: nothing can be installed"
    fi
    where=$(cd /tmp && "$PY" -c 'import os, workbench; print(os.path.dirname(os.path.dirname(os.path.abspath(workbench.__file__))))' 2>/dev/null)
    if [ "$where" = "$ROOT" ]; then
        method=installed
    elif "$PY" -m pip install --quiet --no-deps --no-build-isolation -e "$ROOT" >>"$OUT/setup.log" 2>&1 \
         && [ "$(cd /tmp && "$PY" -c 'import os, workbench; print(os.path.dirname(os.path.dirname(os.path.abspath(workbench.__file__))))' 2>/dev/null)" = "$ROOT" ]; then
        method="pip install --no-deps -e ."
    else  # the checkout on PYTHONPATH, with the metadata that declares its entry points beside it
        use_site && "$PY" scripts/gpu_imports.py --write-metadata "$SITE" >>"$OUT/setup.log" 2>&1
        export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
        method=PYTHONPATH
    fi
    log "workbench: $method"
    dists > "$OUT/dists-before.txt"
    for round in 1 2 3 4; do  # a module that fails early can hide the next missing package: three installs at most
        missing=$("$PY" scripts/gpu_imports.py --missing 2>>"$OUT/setup.log" | tr '\n' ' ')
        { [ -z "${missing// /}" ] || [ "$round" = 4 ]; } && break
        log "missing: $missing(installing)"
        # shellcheck disable=SC2086  # one distribution per word
        install_missing $missing || { log "install failed (see setup.log)"; break; }
    done
    mapfile -t installed < <(dists | LC_ALL=C comm -13 "$OUT/dists-before.txt" -)
    rm -f "$OUT/dists-before.txt"
    "$PY" - "$method" "${missing:-}" "${installed[@]}" >"$OUT/setup.json" <<'PYEOF'
import json, sys
print(json.dumps({"workbench": sys.argv[1], "still_missing": sys.argv[2].split(), "installed": sys.argv[3:]}))
PYEOF
    [ -z "${missing// /}" ]
}

# environment facts for the summary: Python, torch, CUDA, the GPU, the driver
write_env() {
    "$PY" >"$OUT/env.json" 2>>"$OUT/setup.log" <<'PYEOF'
import json, subprocess, sys, torch
if not torch.cuda.is_available():  # GPU_CHECK_REHEARSAL
    print(json.dumps({"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
                      "cuda": torch.version.cuda, "gpu": "none (CPU rehearsal)", "gpus": 0}))
    sys.exit(0)
props = torch.cuda.get_device_properties(0)
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30).stdout.split()
except (OSError, subprocess.SubprocessError):
    smi = []
print(json.dumps({"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
                  "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "driver": smi[0] if smi else None,
                  "gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                  "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                  "memory_gib": round(props.total_memory / 2**30, 1)}))
PYEOF
}

# timed NAME LIMIT_S LOGFILE COMMAND...: run under a time limit; phase line with ok / failed (rc) / timeout.
# The limit sends SIGINT, which pytest and the benchmark take as KeyboardInterrupt: they stop and still write
# their JUnit XML and gpu.json (with what finished); SIGKILL 30 s later if they do not.
timed() {
    local name=$1 limit=$2 logfile=$3 start=$SECONDS rc status
    shift 3
    timeout -s INT -k 30 "$limit" "$@" >"$logfile" 2>&1
    rc=$?
    case $rc in 0) status=ok ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
    phase "$name" "$status" $((SECONDS - start)) "rc $rc, limit ${limit}s"
    log "$name: $status (rc $rc) in $((SECONDS - start))s"
    return $rc
}

log "out: $OUT"
start=$SECONDS
PY=$(find_python)
if [ -z "$PY" ] && [ "$REHEARSAL" != 1 ] && gpu_visible && [ ! -e "$ROOT/.venv" ] && [ "${GPU_CHECK_NO_INSTALL:-0}" != 1 ] \
   && command -v make >/dev/null 2>&1; then
    log "a GPU, but no Python whose torch sees CUDA: make install (creates .venv; minutes)"
    limit=$(($(left) - 240))  # what the benchmark and the tier need at least
    timed make-install $((limit > 60 ? limit : 60)) "$OUT/setup.log" make -C "$ROOT" install
    PY=$(find_python)
fi
probes=$(tr '\t' ' ' <"$OUT/probe.txt" | paste -sd ';' - | sed 's/;/; /g')
if [ -z "$PY" ]; then
    phase find-python none $((SECONDS - start)) "$probes"
    if gpu_visible; then smi="nvidia-smi sees: $(nvidia-smi -L 2>/dev/null | head -n 1)"; else smi="nvidia-smi: no GPU"; fi
    SUMPY=$(summary_python) || { echo "gpu-check: no Python at all to write the summary" >&2; exit 0; }
    "$SUMPY" "$ROOT/scripts/gpu_summary.py" --out "$OUT" \
        --not-run "CUDA is not available: no Python's torch sees a GPU ($probes; $smi)"
    log "CUDA is not available: nothing ran; summary in $OUT/gpu_check.md"
    exit 0
fi
phase find-python ok $((SECONDS - start)) "$PY ($probes)"
log "python: $PY"

start=$SECONDS
if setup; then status=ok; else status=failed; fi
phase setup "$status" $((SECONDS - start)) "$(cat "$OUT/setup.json" 2>/dev/null)"
write_env || log "could not read the GPU's facts (see setup.log)"
log "gpu: $("$PY" -c 'import json,sys; e=json.load(open(sys.argv[1])); print(e["gpu"], "| torch", e["torch"], "| driver", e.get("driver"))' "$OUT/env.json" 2>/dev/null)"

# the benchmark first (its length is known), then the tier with the time that is left
bench_rc=1
limit=$(left)
limit=$((limit - 90 < BENCH_MAX ? limit - 90 : BENCH_MAX))
if [ "$limit" -gt 30 ]; then
    if [ "$REHEARSAL" = 1 ]; then bench_args=(--smoke); results=bench/results/gpu-smoke.json
    else bench_args=(); results=bench/results/gpu.json; fi
    # shellcheck disable=SC2206  # one argument per word
    bench_args+=(${GPU_CHECK_BENCH_ARGS:-})
    touch "$OUT/.bench-start"
    log "bench: bench/bench_gpu.py ${bench_args[*]} (limit ${limit}s, log bench.log)"
    timed bench "$limit" "$OUT/bench.log" "$PY" bench/bench_gpu.py "${bench_args[@]}"
    bench_rc=$?
    if [ -f "$results" ] && [ "$results" -nt "$OUT/.bench-start" ]; then
        cp "$results" "$OUT/gpu.json"
    fi
    rm -f "$OUT/.bench-start"
else
    phase bench skipped 0 "no time left"
fi

tier_rc=1
mapfile -t files < <("$PY" scripts/gpu_imports.py --tier-files)
limit=$(($(left) - 15))
if [ "${#files[@]}" -eq 0 ]; then
    phase tier failed 0 "no test file under tests/ marks tests gpu"
elif [ "$limit" -gt 30 ]; then
    # tests at once: each test's ranks are small and the GPU has memory and the machine cores to spare, so
    # a few tests share them (their results do not depend on timing); one at a time where cores are few
    workers=${GPU_CHECK_WORKERS:-}
    if [ -z "$workers" ]; then
        workers=0
        # nproc answers OMP_NUM_THREADS (1, exported above) when it is set: ask without it
        if [ "$REHEARSAL" != 1 ] && [ "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" -ge 8 ] && "$PY" -c 'import xdist' >/dev/null 2>&1; then workers=3; fi
    fi
    xdist=(); [ "$workers" -gt 0 ] && xdist=(-n "$workers")
    log "tier: pytest -m gpu on ${#files[@]} files, $workers workers (limit ${limit}s, log tier.log)"
    [ "$REHEARSAL" = 1 ] && export WORKBENCH_GPU_TIER_REHEARSAL=1
    timed tier "$limit" "$OUT/tier.log" "$PY" -m pytest -m gpu "${files[@]}" "${xdist[@]}" -p no:cacheprovider -v \
        -rfEs --junitxml="$OUT/junit.xml"
    tier_rc=$?
else
    phase tier skipped 0 "no time left"
fi

rehearsal=(); [ "$REHEARSAL" = 1 ] && rehearsal=(--rehearsal)
"$PY" scripts/gpu_summary.py --out "$OUT" "${rehearsal[@]}" || log "the summary failed"
log "done in ${SECONDS}s: tier rc $tier_rc, bench rc $bench_rc; $OUT/gpu_check.md"
[ "$tier_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
