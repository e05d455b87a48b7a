#!/usr/bin/env bash
# Create or reuse .venv and install the project with its dev extras into it (`make install`).
#
# uv installs the same packages as pip in a fraction of the time (it unpacks
# wheels in parallel and links them from its cache: about 1 minute instead of 4
# to 6 on a 2-core machine for torch and its CUDA libraries). It is installed
# into the venv by pip, and it is told what pip is configured with (pip.conf
# and PIP_* variables: extra indexes, find-links, constraints), with pip's
# rule for choosing among indexes (the best version across all of them), so
# both resolve the same set. When uv cannot be installed or fails, pip installs.
# Usage: scripts/install.sh VENV_DIR PYTHON
set -euo pipefail

VENV="${1:-.venv}"
PYTHON="${2:-python3}"
BIN="$VENV/bin"

test -x "$BIN/python" || "$PYTHON" -m venv "$VENV"

pip_install() {
    "$BIN/python" -m pip install --quiet --upgrade pip
    "$BIN/python" -m pip install --quiet -e '.[dev]'
}

# pip's configuration as uv options: `pip config list` prints key='value' lines (global., :env:. and others)
uv_options() {
    local line key value item
    "$BIN/python" -m pip config list 2>/dev/null | while IFS= read -r line; do
        key="${line%%=*}"; key="${key##*.}"
        value="${line#*=}"; value="${value#\'}"; value="${value%\'}"
        for item in $value; do
            case "$key" in
                index-url) printf '%s\n' --index-url "$item" ;;
                extra-index-url) printf '%s\n' --extra-index-url "$item" ;;
                find-links) printf '%s\n' --find-links "$item" ;;
                constraint) printf '%s\n' --constraint "$item" ;;
            esac
        done
    done
}

if [ "${WORKBENCH_INSTALL_WITH:-uv}" = "uv" ] && "$BIN/python" -m pip install --quiet uv 2>/dev/null; then
    mapfile -t OPTIONS < <(uv_options)
    if "$BIN/uv" pip install --quiet --python "$BIN/python" --index-strategy unsafe-best-match \
        "${OPTIONS[@]}" -e '.[dev]'; then
        exit 0
    fi
    echo "install: uv failed; installing with pip instead" >&2
fi
pip_install
