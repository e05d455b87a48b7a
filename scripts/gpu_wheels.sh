#!/usr/bin/env bash
# scripts/gpu_wheels.sh: the wheels the lent GPU image lacks, into .whl/, for scripts/gpu_check.sh.
#
# Problem: the lent GPU machines have no internet. Their image holds torch and a
# stated handful of packages, but the GPU tier also imports packages the image
# lacks (the job monitor's widgets, for one), and gpu_check.sh can only install
# what it finds on the machine itself.
#
# Approach: scripts/gpu_imports.py --image, run in the project's full .venv,
# imports everything the tier and bench/bench_gpu.py load with every package
# outside the image blocked, and names the missing ones with their dependencies
# outside the image, pinned to the versions .venv has. Each is downloaded without
# dependencies as a CPython 3.12 manylinux x86_64 (or pure py3) wheel into a fresh
# folder that then replaces the wheels of .whl/, so a package the tier no longer
# needs does not linger there. The total must stay under 40 MiB (exit 1 above).
# .whl/ is not tracked: carry it to the GPU machine with the working tree.
#
#   bash scripts/gpu_wheels.sh        # PYTHON=... picks the environment to pin from (default .venv/bin/python)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-$ROOT/.venv/bin/python}
DEST=$ROOT/.whl
LIMIT_MIB=40

mapfile -t specs < <(OMP_NUM_THREADS=1 "$PY" scripts/gpu_imports.py --image --wheels)
mkdir -p "$DEST"
fresh=$(mktemp -d "$ROOT/.whl-download.XXXXXX")
trap 'rm -rf "$fresh"' EXIT
echo "gpu-wheels: ${#specs[@]} wheels for the GPU image: ${specs[*]:-none}"
for spec in "${specs[@]}"; do
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$fresh" "$spec"
done
rm -f "$DEST"/*.whl
shopt -s nullglob
wheels=("$fresh"/*.whl)
[ ${#wheels[@]} -gt 0 ] && mv "${wheels[@]}" "$DEST"/
bytes=$(find "$DEST" -maxdepth 1 -type f -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
echo "gpu-wheels: $(find "$DEST" -maxdepth 1 -type f -name '*.whl' | wc -l) wheels in .whl/, $mib MiB in total"
if [ "$bytes" -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "gpu-wheels: more than $LIMIT_MIB MiB: too much to carry to the GPU machine" >&2
    exit 1
fi
