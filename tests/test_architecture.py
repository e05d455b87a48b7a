"""The architecture contract of DESIGN.md, enforced.

1. The torch-free rooms (core, scheduling, planning, jobs, viz) import without
   torch: a fresh interpreter imports every module in them and checks that
   ``torch`` never entered ``sys.modules``.
2. Imports only go downward: every ``workbench.X`` import in a room's source
   (anywhere in the file, lazy ones included) targets a room it may use.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "workbench"
TORCH_FREE = ("core", "scheduling", "planning", "jobs", "viz")

# room -> rooms it may import (besides itself).
ALLOWED = {
    "core": set(),
    "scheduling": {"core"},
    "planning": {"core", "scheduling"},
    "models": {"core"},
    "profiling": {"core", "models"},
    "runtime": {"core", "scheduling", "planning", "models", "profiling"},
    "viz": {"core", "scheduling", "planning"},
    "widgets": {"core", "scheduling", "planning", "viz", "jobs", "models", "profiling"},
    "jobs": {"core", "scheduling", "planning", "viz", "widgets"},
    "cli": {"core", "scheduling", "planning", "models", "profiling", "runtime", "jobs", "viz", "widgets"},
}


def modules_of(room: str) -> list[str]:
    out = []
    for path in sorted((PKG / room).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return out


def test_torch_free_rooms_never_import_torch():
    modules = [m for room in TORCH_FREE for m in modules_of(room)]
    code = (
        "import importlib, json, sys\n"
        f"mods = {modules!r}\n"
        "bad = []\n"
        "for m in mods:\n"
        "    importlib.import_module(m)\n"
        "    if 'torch' in sys.modules:\n"
        "        bad.append(m); break\n"
        "print(json.dumps({'bad': bad, 'count': len(mods)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["count"] >= 5
    assert result["bad"] == [], f"importing {result['bad']} pulled in torch"


def imported_rooms(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(PKG).parts
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[:-1])
                up = node.level - 1
                base = base[: len(base) - up] if up else base
                mod = ".".join(["workbench", *base] + ([node.module] if node.module else []))
                if node.module is None:
                    targets = [f"{mod}.{a.name}" for a in node.names]
                else:
                    targets = [mod]
            elif node.module:
                targets = [node.module]
        for t in targets:
            parts = t.split(".")
            if parts[0] == "workbench" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_go_downward(room):
    violations = []
    for path in sorted((PKG / room).rglob("*.py")):
        for target, line in imported_rooms(path):
            if target != room and target in ALLOWED and target not in ALLOWED[room]:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports workbench.{target}")
    assert not violations, "upward imports:\n" + "\n".join(violations)


def test_every_room_exists():
    for room in ALLOWED:
        assert (PKG / room / "__init__.py").is_file(), room
