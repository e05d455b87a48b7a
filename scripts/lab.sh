#!/usr/bin/env bash
# Start JupyterLab on this machine only, opening the tour notebook.
#
# The server listens on 127.0.0.1 (never on every interface) and requires a
# token: JUPYTER_TOKEN when set, a fresh random one otherwise. The root is the
# repository, so every notebook sees the same paths. Settings:
#   LAB_PORT       port to listen on (default 8888; the server fails rather than
#                  silently moving to another port, so the printed URL is right)
#   JUPYTER_TOKEN  the token to require (default: generated)
# Extra arguments are passed on to `jupyter lab` (e.g. --LabApp.expose_app_in_browser=True).
# Announcements, the news question and update checks are off (overrides.json in
# the environment's JupyterLab settings); saving a lesson writes it stripped, as
# committed (scripts/jupyter_lab_config.py); a browser is opened only when a
# display is available. `exec` hands the process over to jupyter so Ctrl-C and
# SIGTERM reach it directly and it shuts its kernels down.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JUPYTER="$REPO_ROOT/.venv/bin/jupyter"
NOTEBOOK="notebooks/00_tour.ipynb"
PORT="${LAB_PORT:-8888}"

if [ ! -x "$JUPYTER" ]; then
    echo "lab: $JUPYTER not found; run 'make lab' (it creates .venv and installs the workbench)" >&2
    exit 1
fi
if ! [[ "$PORT" =~ ^[0-9]+$ ]] || [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then
    echo "lab: LAB_PORT must be a port number in 1..65535, got '$PORT'" >&2
    exit 2
fi
if "$REPO_ROOT/.venv/bin/python" - "$PORT" <<'EOF'
import socket, sys
with socket.socket() as s:
    sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
EOF
then
    echo "lab: port $PORT on 127.0.0.1 is already in use; choose another, e.g. LAB_PORT=$((PORT + 1)) make lab" >&2
    exit 1
fi

if [ -z "${JUPYTER_TOKEN:-}" ]; then
    JUPYTER_TOKEN="$("$REPO_ROOT/.venv/bin/python" -c 'import secrets; print(secrets.token_hex(24))')"
fi
export JUPYTER_TOKEN  # jupyter_server reads it from the environment (not visible in `ps`)

OPEN_BROWSER=False
if [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ] || [ "$(uname -s)" = "Darwin" ]; then
    OPEN_BROWSER=True
fi

# Defaults every user setting can still change: no news question, no update check.
"$REPO_ROOT/.venv/bin/python" - "$REPO_ROOT/.venv/share/jupyter/lab/settings/overrides.json" <<'EOF'
import json, pathlib, sys
path = pathlib.Path(sys.argv[1])
settings = json.loads(path.read_text()) if path.is_file() else {}
settings.setdefault("@jupyterlab/apputils-extension:notification", {}).update(fetchNews="false",
                                                                              checkForUpdates=False)
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps(settings, indent=2) + "\n")
EOF

EXTRA_ARGS=()
if [ "$(id -u)" -eq 0 ]; then
    EXTRA_ARGS+=(--allow-root)
fi

echo "lab: JupyterLab for the workbench at"
echo "lab:   http://127.0.0.1:$PORT/lab/tree/$NOTEBOOK?token=$JUPYTER_TOKEN"
echo "lab: stop it with Ctrl-C"

cd "$REPO_ROOT"
exec "$JUPYTER" lab \
    --config="$REPO_ROOT/scripts/jupyter_lab_config.py" \
    --ServerApp.ip=127.0.0.1 \
    --ServerApp.port="$PORT" \
    --ServerApp.port_retries=0 \
    --ServerApp.root_dir="$REPO_ROOT" \
    --ServerApp.open_browser="$OPEN_BROWSER" \
    --LabApp.default_url="/lab/tree/$NOTEBOOK" \
    --LabApp.news_url=None \
    --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
    "${EXTRA_ARGS[@]}" \
    "$@"
